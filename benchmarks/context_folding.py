"""Context folding on a long-horizon task: full context against a folded one at a third of the budget.

The task is ``home`` with ``chores: N`` (N chores on distinct devices, in order, all needed for
success) and ``log_lines: K`` (every tool result followed by K lines of the room's sensor log, the
part of a real tool's output that fills a context and that the agent no longer needs once a chore
is done). A tiny model (trajtune's ``micro`` preset, trained from scratch) learns it two ways from
the same expert episodes:

- ``full``: SFT on the linear expert episodes (every turn in one context), evaluated with the whole
  episode in context (``--full-length`` tokens);
- ``fold``: SFT on the same episodes folded by the ``fold`` wrapper's expert (each chore a
  ``branch`` … ``return`` whose turns leave the context; every folded context is its own row),
  evaluated through ``fold`` at an active budget of ``--budget`` tokens.

And two baselines with the ``full`` model at the same budget: plain (the episode overflows) and
observation masking (``--mask-at``: old tool results replaced by a placeholder,
``rollout.mask_observations_at``). Every evaluation is greedy, on held-out test-split tasks; the
table gives success and the peak active context (tokens, mean and max over episodes).

    python benchmarks/context_folding.py --out runs/fold-bench --seeds 0 1
    python benchmarks/context_folding.py --out runs/fold-bench --table

Finished stages are read back, so a killed run continues. Writes ``summary.json`` per seed and
``benchmarks/results/context_folding-<N>chores-<K>lines.json``. A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).parent / "results"


def _data(d: Path, p: dict[str, Any], seed: int) -> tuple[Path, Path, list[Any]]:
    from trajtune.envs.registry import make_env
    from trajtune.schema import write_trajectories

    lin, fold = d / "data" / "linear.jsonl", d / "data" / "fold.jsonl"
    env_kwargs = {"chores": p["chores"], "log_lines": p["log_lines"]}
    tasks = make_env("home", **env_kwargs).tasks("train", p["n_train"], seed=seed)
    if not fold.exists():
        linear = [make_env("home", **env_kwargs).expert(t) for t in tasks]
        folded = [make_env("fold", env="home", kwargs=env_kwargs).expert(t) for t in tasks]
        write_trajectories(lin, linear)
        write_trajectories(fold, folded)
    from trajtune.schema import read_trajectories

    return lin, fold, list(read_trajectories(lin))[:200] + list(read_trajectories(fold))[:200]


def _base(d: Path, sample: list[Any], p: dict[str, Any], seed: int) -> Path:
    from trajtune.chat.render import message_to_template_dict, tools_to_template
    from trajtune.models.tiny import build_tokenizer, create_tiny_model

    base = d / "base-model"
    if (base / "config.json").exists():
        return base
    probe = build_tokenizer(["probe"], vocab_size=300)
    texts = [probe.apply_chat_template([message_to_template_dict(m) for m in t.messages],
                                       tools=tools_to_template(t.tools), tokenize=False) for t in sample]
    return create_tiny_model(base, texts, vocab_size=1024, preset=p["preset"], seed=seed,
                             max_position_embeddings=p["full_length"])


def _sft(d: Path, name: str, base: Path, data: Path, max_length: int, p: dict[str, Any], seed: int) -> dict[str, Any]:
    from trajtune.algorithms.sft import SFTRunConfig
    from trajtune.train import run

    out = d / f"sft-{name}"
    done = out / "final"
    if (out / "stage.json").exists():
        return json.loads((out / "stage.json").read_text())  # type: ignore[no-any-return]
    batch = p["batch"] if name == "full" else p["fold_batch"]
    rows = sum(1 for _ in data.open()) * (p["chores"] + 1 if name == "fold" else 1)  # a folded record: N + 1 rows
    steps = max(4, round(p["epochs"] * rows / batch))  # the same epochs over the same episodes, either way
    cfg = SFTRunConfig.model_validate({
        "model": str(base), "output_dir": str(out), "seed": seed, "report": False,
        "data": {"path": str(data), "format": "ir", "max_length": max_length},
        "train": {"steps": steps, "lr": p["lr"], "batch_size": batch, "micro_batch_size": batch,
                  "warmup_steps": max(1, steps // 20), "save_every": max(1, steps // 4)},
    })
    t0 = time.time()
    run(cfg, resume=out.exists(), quiet=True)
    stage = {"wall_s": round(time.time() - t0, 1), "model": str(done), "steps": steps, "batch": batch}
    (out / "stage.json").write_text(json.dumps(stage))
    return stage


def _eval_dir(d: Path, arm: str) -> Path:
    """Where an arm's evaluation is written ("full@budget" -> eval-full-budget)."""
    return d / f"eval-{arm.replace('@', '-')}"


def _eval(d: Path, arm: str, model: str, env: str, env_kwargs: dict[str, Any], max_length: int,
          p: dict[str, Any], seed: int, mask_at: int = 0) -> dict[str, Any]:
    from trajtune.demo_real import _eval_once
    from trajtune.eval.harness import EvalSettings

    s = EvalSettings(model=model, env=env, env_kwargs=env_kwargs, tasks=p["n_test"], seed=seed,
                     max_new_tokens=p["max_new_tokens"], max_length=max_length, batch_size=p["n_test"],
                     mask_observations_at=mask_at)
    t0 = time.time()
    res = _eval_once(s, _eval_dir(d, arm))
    m = res["metrics"]
    ctx = m.get("context", {})
    return {"success": m["success"], "peak_mean": ctx.get("peak_tokens_mean"), "peak_max": ctx.get("peak_tokens_max"),
            "turns": m.get("mean_turns"), "terminations": m.get("terminations"),
            "folds": ctx.get("folds_per_episode"), "wall_s": round(time.time() - t0, 1),
            "targets": targets(_eval_dir(d, arm))}


def targets(eval_dir: Path) -> dict[str, int]:
    """Why an arm fails: of its ``set_device`` calls, how many target a device the request names at
    all (``named``) and the chore due at that point (``in_order``), counted from its episodes."""
    n = named = in_order = 0
    for line in (eval_dir / "episodes.jsonl").open():
        e = json.loads(line)
        request = next(m["content"] for m in e["messages"] if m["role"] == "user")
        chores = re.findall(r"\d+\. ([^.]*)\.", request)
        sets = [c["arguments"] for m in e["messages"] if m["role"] == "assistant"
                for c in m.get("tool_calls") or [] if c["name"] == "set_device"]
        for i, a in enumerate(sets):
            target = f"the {a.get('device')} in the {a.get('room')}"
            n += 1
            named += target in request
            in_order += i < len(chores) and target in chores[i]
    return {"set_calls": n, "named": named, "in_order": in_order}


def run_seed(out: Path, p: dict[str, Any], seed: int) -> dict[str, Any]:
    d = out / f"s{seed}"
    d.mkdir(parents=True, exist_ok=True)
    lin, fold, sample = _data(d, p, seed)
    base = _base(d, sample, p, seed)
    summary: dict[str, Any] = {"seed": seed, "settings": p}
    full = _sft(d, "full", base, lin, p["full_length"], p, seed)
    folded = _sft(d, "fold", base, fold, p["budget"], p, seed)
    summary["sft"] = {"full": full, "fold": folded}
    home = {"chores": p["chores"], "log_lines": p["log_lines"]}
    summary["eval"] = {
        "full@full": _eval(d, "full@full", full["model"], "home", home, p["full_length"], p, seed),
        "full@budget": _eval(d, "full@budget", full["model"], "home", home, p["budget"], p, seed),
        "mask@budget": _eval(d, "mask@budget", full["model"], "home", home, p["budget"], p, seed, p["mask_at"]),
        "fold@budget": _eval(d, "fold@budget", folded["model"], "fold", {"env": "home", "kwargs": home},
                             p["budget"], p, seed),
    }
    (d / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def table(out: Path) -> None:
    rows = [json.loads(f.read_text()) for f in sorted(out.glob("s*/summary.json"))]
    if not rows:
        raise SystemExit(f"no summary.json under {out}")
    for r in rows:  # summaries written before the target counts existed
        for arm, ev in r["eval"].items():
            episodes = _eval_dir(out / f"s{r['seed']}", arm)
            if "targets" not in ev and (episodes / "episodes.jsonl").exists():
                ev["targets"] = targets(episodes)
    p = rows[0]["settings"]
    print(f"home, {p['chores']} chores, {p['log_lines']} log lines; {p['preset']} model, {p['epochs']} epochs over "
          f"{p['n_train']} expert episodes; {p['n_test']} held-out tasks; seeds {[r['seed'] for r in rows]}")
    print(f"{'arm':<14} {'budget':>7} {'success':>15} {'peak mean':>17} {'peak max':>13} {'named targets':>17}")
    for arm, budget in (("full@full", p["full_length"]), ("full@budget", p["budget"]),
                        ("mask@budget", p["budget"]), ("fold@budget", p["budget"])):
        ev = [r["eval"][arm] for r in rows]
        success = " / ".join(f"{e['success']:.0%}" for e in ev)
        peak = " / ".join(f"{e['peak_mean']:.0f}" for e in ev)
        peak_max = " / ".join(str(e["peak_max"]) for e in ev)
        named = " / ".join(f"{e['targets']['named']}/{e['targets']['set_calls']}" if "targets" in e else "-"
                           for e in ev)
        print(f"{arm:<14} {budget:>7} {success:>15} {peak:>17} {peak_max:>13} {named:>17}")
    for r in rows:
        f, o = r["sft"]["full"], r["sft"]["fold"]
        print(f"seed {r['seed']}: SFT full {f['steps']} steps of {f['batch']} in {f['wall_s']} s, "
              f"fold {o['steps']} steps of {o['batch']} in {o['wall_s']} s")
    results = RESULTS_DIR / f"context_folding-{p['chores']}chores-{p['log_lines']}lines.json"
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(rows, indent=2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("runs/fold-bench"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--table", action="store_true", help="print the table of the finished seeds")
    ap.add_argument("--chores", type=int, default=6)
    ap.add_argument("--log-lines", type=int, default=16)
    ap.add_argument("--n-train", type=int, default=400)
    ap.add_argument("--n-test", type=int, default=50)
    ap.add_argument("--preset", default="micro")
    ap.add_argument("--epochs", type=float, default=2.0, help="passes over the expert episodes, in both arms")
    ap.add_argument("--batch", type=int, default=4, help="sequences per step of the full arm")
    ap.add_argument("--fold-batch", type=int, default=16, help="rows per step of the fold arm (a row is shorter)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--full-length", type=int, default=2560, help="the full-context arm's token limit")
    ap.add_argument("--budget", type=int, default=1024, help="the active-context budget of the other arms")
    ap.add_argument("--mask-at", type=int, default=640, help="observation masking starts past this many tokens")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    a = ap.parse_args()
    if a.table:
        table(a.out)
        return
    import torch

    torch.set_num_threads(a.threads)
    p = {k: getattr(a, k) for k in ("chores", "log_lines", "n_train", "n_test", "preset", "epochs", "batch",
                                     "fold_batch", "lr", "full_length", "budget", "mask_at", "max_new_tokens")}
    for seed in a.seeds:
        s = run_seed(a.out, p, seed)
        print(json.dumps({"seed": seed, **s["eval"]}, indent=1), flush=True)
    table(a.out)


if __name__ == "__main__":
    main()
