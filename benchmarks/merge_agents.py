"""Merging two agents: each merge method against its parents, on both parents' environments.

One tiny base model (tokenizer trained on both environments' text) is fine-tuned twice with SFT
on scripted-expert data: parent A on `--env-a` (default `home`), parent B on `--env-b` (default
`fncall`, single turn, no distractors). The two parents are merged with every method of
`trajtune merge` (plus `avg`: task arithmetic with weights 0.5 0.5, plain weight averaging), and
every model (base, parents, merges) is evaluated greedily on `--tasks` held-out tasks of each
environment. A merge that works keeps most of each parent's success on its own environment.

A benchmark, not a test: it prints a table (per environment: success, mean reward, and the
teacher-forced NLL and next-token accuracy on held-out expert trajectories) and writes JSON, and
asserts nothing. The defaults are small (nano model, a few hundred SFT steps) so that it runs
in minutes on a CPU; the parents are then far from perfect, which the table shows. Sparse RL
updates (the case RAM is designed for) are not reproduced here: the parents are SFT models.
Finished parents, merges and evaluations under --out are reused, so an interrupted run continues
where it stopped; use a fresh --out to start over.

    python benchmarks/merge_agents.py --out runs/merge-agents --steps 150 --tasks 20
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

METHODS = ["ta", "avg", "ties", "dare", "ram", "ram_plus"]


def env_kwargs(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for p in pairs:
        k, _, v = p.partition("=")
        out[k] = json.loads(v) if v and v[0] in "0123456789-[{tfn" else v
    return out


def expert_fit(model: Any, tok: Any, trajs: list[Any]) -> dict[str, float]:
    """Teacher-forced fit on held-out expert trajectories: mean NLL and next-token accuracy over the
    tokens SFT trains on. Unlike success, it moves with the first training steps, so it shows how
    much of each parent's learning a merge keeps even when no model solves a task yet."""
    import torch

    from trajtune.chat.render import render_trajectory

    nll = correct = count = 0.0
    with torch.no_grad():
        for t in trajs:
            tt = render_trajectory(t, tok)
            ids = torch.tensor([tt.ids])
            logits = model(input_ids=ids).logits[0, :-1].float()
            target = ids[0, 1:]
            w = torch.tensor(tt.weight[1:]) > 0
            lp = torch.log_softmax(logits, -1).gather(1, target[:, None])[:, 0]
            nll -= float(lp[w].sum())
            correct += float((logits.argmax(-1) == target)[w].sum())
            count += float(w.sum())
    return {"nll": nll / max(count, 1), "token_acc": correct / max(count, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("runs/merge-agents"))
    ap.add_argument("--env-a", default="home")
    ap.add_argument("--env-a-arg", nargs="*", default=[])
    ap.add_argument("--env-b", default="fncall")
    ap.add_argument("--env-b-arg", nargs="*", default=["single_turn=true", "max_distractors=0"])
    ap.add_argument("--preset", default="nano")
    ap.add_argument("--vocab-size", type=int, default=768)
    ap.add_argument("--n-train", type=int, default=400, help="expert trajectories per environment")
    ap.add_argument("--steps", type=int, default=150, help="SFT steps per parent")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--tasks", type=int, default=20, help="held-out tasks per environment")
    ap.add_argument("--fit-tasks", type=int, default=32, help="held-out expert trajectories per environment "
                                                                 "for the teacher-forced NLL / token accuracy")
    ap.add_argument("--methods", nargs="*", default=METHODS)
    ap.add_argument("--density", type=float, default=0.5, help="ties")
    ap.add_argument("--drop", type=float, default=0.5, help="dare")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import torch

    from trajtune.chat.render import message_to_template_dict, tools_to_template
    from trajtune.algorithms.sft import SFTRunConfig
    from trajtune.envs.registry import make_env
    from trajtune.eval.run import evaluate
    from trajtune.learner import set_seed
    from trajtune.merge import MergeOptions, merge_models
    from trajtune.models.loading import load_model, load_tokenizer
    from trajtune.models.tiny import build_tokenizer, create_tiny_model
    from trajtune.rollout import RolloutConfig
    from trajtune.schema import write_trajectories
    from trajtune.train import run_sft

    torch.set_num_threads(2)
    t0 = time.time()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    set_seed(args.seed)
    envs = {"a": (args.env_a, env_kwargs(args.env_a_arg)), "b": (args.env_b, env_kwargs(args.env_b_arg))}

    data: dict[str, Path] = {}
    texts: list[str] = []
    probe = build_tokenizer(["probe"], vocab_size=300)
    for key, (name, kw) in envs.items():
        env = make_env(name, **kw)
        experts = [env.expert(t) for t in env.tasks("train", args.n_train, seed=args.seed)]
        data[key] = out / "data" / f"{key}-{name}.jsonl"
        write_trajectories(data[key], experts, overwrite=True)
        texts += [probe.apply_chat_template([message_to_template_dict(m) for m in t.messages],
                                            tools=tools_to_template(t.tools), tokenize=False) for t in experts[:300]]
    base = out / "base"
    if not (base / "config.json").exists():
        create_tiny_model(base, texts, vocab_size=args.vocab_size, preset=args.preset, seed=args.seed)

    parents: dict[str, Path] = {}
    for key, (name, _kw) in envs.items():
        run_dir = out / f"sft-{key}-{name}"
        if not (run_dir / "final" / "config.json").exists():
            cfg = SFTRunConfig.model_validate({
                "model": str(base), "output_dir": str(run_dir), "seed": args.seed,
                "data": {"path": str(data[key]), "format": "ir", "max_length": 512},
                "train": {"steps": args.steps, "lr": args.lr, "batch_size": args.batch_size,
                          "micro_batch_size": args.batch_size, "warmup_steps": max(1, args.steps // 20),
                          },
                "report": False,
            })
            run_sft(cfg, overwrite=True, quiet=True)
        parents[f"parent {key.upper()} ({name})"] = run_dir / "final"
    t_train = time.time() - t0

    models: dict[str, Path] = {"base": base, **parents}
    a, b = (str(p) for p in parents.values())
    for m in args.methods:
        opts = {"avg": MergeOptions(method="ta", weights=[0.5, 0.5]),
                "ties": MergeOptions(method="ties", density=args.density),
                "dare": MergeOptions(method="dare", drop=args.drop, seed=args.seed)}.get(m, MergeOptions(method=m))
        target = out / f"merged-{m}"
        if not (target / "merge.json").exists():
            merge_models(str(base), [a, b], opts, target, overwrite=True)
        models[f"merged {m}"] = target

    rollout = RolloutConfig(max_turns=4, max_new_tokens=60, max_length=512, temperature=0.0, batch_size=64)
    test = {key: make_env(name, **kw).tasks("test", args.tasks, seed=args.seed) for key, (name, kw) in envs.items()}
    held_out = {}
    for key, (name, kw) in envs.items():
        env = make_env(name, **kw)
        held_out[key] = [env.expert(t) for t in env.tasks("test", args.fit_tasks, seed=args.seed + 1)]
    # Each model's scores are kept as they come, so an interrupted run resumes where it stopped
    # (finished parents and merges are reused too); pass a fresh --out to start over.
    partial = out / "eval_partial.json"
    key_of = json.dumps([args.tasks, args.fit_tasks, args.seed, args.env_a, args.env_a_arg, args.env_b, args.env_b_arg])
    saved = json.loads(partial.read_text()) if partial.exists() else {}
    rows: dict[str, dict[str, Any]] = saved.get("rows", {}) if saved.get("key") == key_of else {}
    for label, path in models.items():
        if label in rows:
            continue
        tok = load_tokenizer(str(path))
        model = load_model(str(path), trainable=False)
        row: dict[str, Any] = {}
        for key, (name, kw) in envs.items():
            metrics, _ = evaluate(model, tok, lambda name=name, kw=kw: make_env(name, **kw), test[key], rollout,
                                  seed=args.seed)
            row[name] = {"success": float(metrics["success"]),
                         "reward": float(metrics.get("mean_reward", float("nan"))),
                         **expert_fit(model, tok, held_out[key])}
        rows[label] = row
        del model
        partial.write_text(json.dumps({"key": key_of, "rows": rows}))

    names = [n for n, _ in envs.values()]
    cols = [("success", "{:>.2f}"), ("reward", "{:>.3f}"), ("nll", "{:>.3f}"), ("token_acc", "{:>.3f}")]
    head = f"{'model':<20}" + "".join(f"{n[:8] + ' ' + c:>19}" for n in names for c, _ in cols)
    print(head)
    print("-" * len(head))
    for label in models:
        row = rows[label]
        print(f"{label:<20}" + "".join(f"{fmt.format(row[n][c]):>19}" for n in names for c, fmt in cols))
    result = {"settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "results": {label: rows[label] for label in models}, "train_seconds": round(t_train, 1),
              "wall_seconds": round(time.time() - t0, 1)}
    (out / "merge_agents.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"wall {result['wall_seconds']} s (training {result['train_seconds']} s); {out / 'merge_agents.json'}")


if __name__ == "__main__":
    main()
