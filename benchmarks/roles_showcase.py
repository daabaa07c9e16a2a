"""Two trained roles in one episode: a scout that may only look, an operator that changes things.

The task is `home`'s `copy` and `toggle` kinds (make a device match another's state, or flip one),
wrapped by the `roles` environment: the scout acts first and may call only `get_state`, the
operator acts second and has every tool, then the scout again (which ends the episode with its
answer). Neither can succeed alone: the scout cannot write, and the operator cannot know the state
without the scout's look-up in the shared transcript. Both seats are the tiny demo model:

1. expert trajectories of the wrapped environment (the `home` expert replayed through the roles)
   train a fresh tiny model with full-weight SFT; the under-trained checkpoint is the newest one
   still below `weak_max_success` on 64 *training* tasks (the demo's rule);
2. joint success of that checkpoint on the held-out test tasks (greedy) is the "before";
3. GRPO from it with LoRA, the same rollouts for each arm:
   - `role_adapters`: one adapter per role (`rl.role_adapters: true`), each trained only on its
     own role's tokens, a group baseline per role;
   - `shared`: one adapter plays both roles (the same per-role rows and baselines);
   - `role_adapters_paid`: one adapter per role, and the scout paid for its own part: its reward is
     half the joint reward and half the share of the expert's scout turns it matched (the roles
     option `expert_weight`, 0.5; the operator's stays the joint reward). Added after the first two
     arms' failure analysis (the scout unlearned its look-ups under the joint reward); the weight
     was fixed before its runs;
4. joint success after each arm, on the same test tasks.

Settings were fixed before the runs and not tuned on the test tasks.

    python benchmarks/roles_showcase.py --seeds 0 1 --out runs/roles-showcase
    python benchmarks/roles_showcase.py --seeds 0 1 --out runs/roles-demo-budget --result roles_showcase_demo_budget.json \
        --set n_train=2000 sft_steps=900 weak_max_success=0.9 rl_steps=40 rl_lr=0.001

Prints a table and writes benchmarks/results/roles_showcase.json. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from _tiny_runs import apply_sets, tiny_sft

ROLES = [{"name": "scout", "tools": ["get_state"], "prompt": "Look up what the operator needs."},
         {"name": "operator", "prompt": "Change the devices."}]
ENV = {"name": "roles", "kwargs": {"env": "home", "kwargs": {"kinds": ["copy", "toggle"]}, "roles": ROLES}}
P: dict[str, Any] = {
    "n_train": 1000, "n_test": 100, "preset": "micro", "vocab_size": 1024, "sft_steps": 600, "save_every": 10,
    "sft_lr": 1e-3, "batch_size": 16, "weak_probe_tasks": 64, "weak_max_success": 0.6, "max_length": 512,
    "max_new_tokens": 40, "rl_steps": 30, "rl_lr": 5e-4, "lora_r": 16, "rl_temperature": 0.7,
    "tasks_per_step": 8, "group_size": 8, "scout_expert_weight": 0.5,
}
ARMS = {"role_adapters": (True, 0.0), "shared": (False, 0.0), "role_adapters_paid": (True, None)}  # None: P's weight


def _env() -> Any:
    from trajtune.envs.registry import make_env

    return make_env(ENV["name"], **ENV["kwargs"])


def _success(model_dir: Path, tasks: list[Any], seed: int, out: Path, label: str) -> float:
    from trajtune.algorithms.registry import load_trained
    from trajtune.eval.run import evaluate, write_eval
    from trajtune.models.loading import load_tokenizer
    from trajtune.rollout import RolloutConfig

    model = load_trained(str(model_dir))
    ro = RolloutConfig(max_turns=6, max_new_tokens=P["max_new_tokens"], max_length=P["max_length"],
                       temperature=0.0, batch_size=64)
    metrics, episodes = evaluate(model, load_tokenizer(str(model_dir)), _env, tasks, ro, seed=seed)
    write_eval(out / "eval", label, metrics, episodes)
    return float(metrics["success"])


def _sft(out: Path, seed: int) -> Path:
    tasks = _env().tasks("train", P["n_train"], seed=seed)
    experts = [_env().expert(t) for t in tasks]
    assert all(e.outcome and e.outcome.success for e in experts)
    return tiny_sft(out, experts, seed=seed, vocab_size=P["vocab_size"], preset=P["preset"], steps=P["sft_steps"],
                    lr=P["sft_lr"], batch_size=P["batch_size"], max_length=P["max_length"], tokenizer_episodes=500,
                    save_every=P["save_every"], keep_last=P["sft_steps"] // P["save_every"] + 1)


def _weak(sft: Path, seed: int, out: Path) -> tuple[Path, dict[str, float]]:
    """The newest checkpoint below weak_max_success on training tasks (never the test tasks)."""
    probe_tasks = _env().tasks("train", P["n_train"], seed=seed)[: P["weak_probe_tasks"]]
    probed: dict[str, float] = {}
    ckpts = sorted((sft / "checkpoints").glob("step-*"), key=lambda c: int(c.name.split("-")[1]), reverse=True)
    for c in ckpts:
        probed[c.name] = _success(c, probe_tasks, seed, out / "probe", c.name)
        if probed[c.name] < P["weak_max_success"]:
            return c, probed
    return ckpts[-1], probed


def _paid_env(weight: float) -> dict[str, Any]:
    scout, *others = ROLES
    return {**ENV, "kwargs": {**ENV["kwargs"], "roles": [{**scout, "expert_weight": weight}, *others]}}


def _rl(start: Path, out: Path, seed: int, role_adapters: bool, scout_weight: float) -> Path:
    from trajtune.algorithms.rl import RLRunConfig
    from trajtune.train import run_rl

    run_rl(RLRunConfig.model_validate({
        "model": {"name_or_path": str(start), "lora": {"r": P["lora_r"], "alpha": 2 * P["lora_r"]}},
        "output_dir": str(out), "seed": seed, "env": _paid_env(scout_weight) if scout_weight else ENV, "report": False,
        "rollout": {"max_turns": 6, "max_new_tokens": P["max_new_tokens"], "max_length": P["max_length"],
                    "temperature": P["rl_temperature"], "batch_size": 64},
        "rl": {"estimator": "grpo", "tasks_per_step": P["tasks_per_step"], "group_size": P["group_size"],
               "n_train_tasks": P["n_train"], "drop_equal_groups": True, "role_adapters": role_adapters},
        "train": {"steps": P["rl_steps"], "lr": P["rl_lr"], "schedule": "constant", "warmup_steps": 3,
                  "micro_batch_size": 32},
    }))
    return out / "final"


def run_seed(seed: int, out: Path) -> dict[str, Any]:
    t0 = time.time()
    out.mkdir(parents=True, exist_ok=True)
    test = _env().tasks("test", P["n_test"], seed=seed)
    sft = out / "sft" if (out / "sft" / "final").exists() else _sft(out, seed)
    weak, probed = _weak(sft, seed, out)
    res: dict[str, Any] = {"seed": seed, "weak_checkpoint": weak.name, "probe_train_success": probed,
                           "sft_final": _success(sft / "final", test, seed, out, "sft-final"),
                           "before": _success(weak, test, seed, out, "weak")}
    prev = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
    res["rl_seconds"] = dict(prev.get("rl_seconds", {}))
    for arm, (flag, weight) in ARMS.items():
        final = out / f"rl-{arm}" / "final"
        if not final.exists():
            t1 = time.time()
            _rl(weak, out / f"rl-{arm}", seed, flag, P["scout_expert_weight"] if weight is None else weight)
            res["rl_seconds"][arm] = round(time.time() - t1, 1)
        res[arm] = _success(final, test, seed, out, f"rl-{arm}")
    res["seconds"] = prev.get("seconds", round(time.time() - t0, 1))  # a rerun that adds an arm keeps the first
    if prev:
        res["seconds_rerun"] = round(time.time() - t0, 1)
    (out / "summary.json").write_text(json.dumps(res, indent=1))
    return res


def _first_mistake(episode: dict[str, Any], expert: list[Any]) -> str:
    """Who went wrong first in a failed episode, against the expert's turns for the same task."""
    turns = [m for m in episode["messages"] if m["role"] == "assistant"]
    for k, want in enumerate(expert):
        if k >= len(turns):
            return "ended early"
        got = (turns[k].get("tool_calls") or [None])[0]
        role = turns[k].get("extra", {}).get("agent_role", "?")
        if not want.tool_calls:
            return f"{role}: wrong final turn" if got else "other"
        w = want.tool_calls[0]
        if got is None or got["name"] != w.name:
            return f"{role}: text or the wrong tool"
        args = got.get("arguments") or {}
        if (args.get("room"), args.get("device")) != (w.arguments["room"], w.arguments["device"]):
            return f"{role}: looked up the wrong device" if w.name == "get_state" else f"{role}: set the wrong device"
        if args.get("state") != w.arguments.get("state"):
            return f"{role}: set the wrong state"
    return "other"


def failures(out: Path, seeds: list[int], labels: list[str] | None = None) -> dict[str, Any]:
    """Per seed and arm: the failed test episodes, by the first mistake (who made it, and what)."""
    labels = labels or ["weak", *(f"rl-{a}" for a in ARMS)]
    table: dict[str, Any] = {}
    for seed in seeds:
        tasks = {t.id: t for t in _env().tasks("test", P["n_test"], seed=seed)}
        experts = {tid: [m for m in _env().expert(t).messages if m.role == "assistant"] for tid, t in tasks.items()}
        for label in labels:
            path = out / f"s{seed}" / "eval" / f"{label}.episodes.jsonl"
            if not path.exists():
                continue
            counts: dict[str, int] = {}
            for line in path.read_text().splitlines():
                ep = json.loads(line)
                if (ep.get("outcome") or {}).get("success"):
                    continue
                why = _first_mistake(ep, experts[ep["id"]])
                counts[why] = counts.get(why, 0) + 1
            table.setdefault(str(seed), {})[label] = dict(sorted(counts.items()))
            print(f"seed {seed} {label:<24} " + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--out", type=Path, default=Path("runs/roles-showcase"))
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="change a setting of P (JSON values)")
    ap.add_argument("--result", default="roles_showcase.json", help="file name under benchmarks/results")
    ap.add_argument("--collect", action="store_true", help="only read the seeds' summaries back")
    ap.add_argument("--failures", action="store_true", help="classify the failed test episodes by first mistake "
                    "(from the evaluations already written) and add the table to the result file")
    a = ap.parse_args()
    shown = apply_sets(ap, a.set, P)
    runs = [json.loads((a.out / f"s{s}" / "summary.json").read_text()) if a.collect else run_seed(s, a.out / f"s{s}")
            for s in a.seeds]
    print(f"{'seed':<5} {'weak ckpt':<12} {'before':>7} {'RL, adapter per role':>21} {'RL, shared adapter':>19} "
          f"{'RL, per role + paid scout':>26} {'SFT to the end':>15}")
    for r in runs:
        paid = f"{r['role_adapters_paid']:.0%}" if "role_adapters_paid" in r else "-"
        print(f"{r['seed']:<5} {r['weak_checkpoint']:<12} {r['before']:>7.0%} {r['role_adapters']:>21.0%} "
              f"{r['shared']:>19.0%} {paid:>26} {r['sft_final']:>15.0%}")
    dest = Path(__file__).parent / "results" / a.result
    extra = {"first_mistakes": failures(a.out, a.seeds)} if a.failures else {}
    dest.write_text(json.dumps({"settings": P, "env": ENV, "runs": runs, **extra,
                                "command": f"python benchmarks/roles_showcase.py --seeds {' '.join(map(str, a.seeds))} "
                                           f"--out {a.out} {shown}".strip()}, indent=1))
    print(f"wrote {dest}")


if __name__ == "__main__":
    main()
