"""SFT side by side: trajtune's learner against TRL's SFTTrainer on the same model, tokens and batches.

Both sides train on identical pre-tokenized rows (home expert trajectories rendered by trajtune
with the model's chat template; TRL gets them as `input_ids` + `labels`, -100 where trajtune's
weight is 0), in the same order (TRL's sampler made sequential), the same batch size, learning
rate and constant schedule. Each measurement is its own process (so peak RSS is that run's);
configurations are interleaved A B A B; the first step of each run is warm-up and not timed.

Settings pinned per side: trajtune with and without `train.gradient_checkpointing`; TRL with its
default (gradient checkpointing on) and with it off. Reported: min and median tokens/s over the
repeats (tokens = non-padding tokens of the timed steps), the min of the per-run median step time,
and peak RSS. Needs the `bench` extra (`pip install -e '.[bench]'`). A benchmark, not a test.

    python benchmarks/vs_trl.py --model smollm2-135m --steps 4 --batch 2 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _rows(model: str, n: int, max_length: int) -> tuple[Any, list[Any]]:
    from trajtune.chat.render import ChatRenderer
    from trajtune.envs import make_env
    from trajtune.models.loading import load_tokenizer

    tok = load_tokenizer(model)
    renderer = ChatRenderer(tok)
    env = make_env("home")
    rows = []
    for t in env.tasks("train", 4 * n, seed=0):
        tt = renderer.render(env.expert(t))
        if len(tt) <= max_length:
            rows.append(tt)
        if len(rows) == n:
            break
    return tok, rows


def worker(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    from trajtune.models.loading import load_model, resolve_model

    path = resolve_model(a.model).path
    tok, rows = _rows(path, a.batch * (a.steps + 1), a.max_length)
    batches = [rows[i * a.batch:(i + 1) * a.batch] for i in range(a.steps + 1)]
    tokens = [sum(len(r) for r in b) for b in batches]
    times: list[float] = []
    losses: list[float] = []
    if a.side == "trajtune":
        from trajtune.algorithms.sft import SFTObjective
        from trajtune.experience import DatasetSource
        from trajtune.learner import Learner, LearnerConfig

        model = load_model(path, dtype="float32", gradient_checkpointing=a.gc)
        cfg = LearnerConfig(steps=a.steps + 1, lr=1e-5, schedule="constant", micro_batch_size=a.batch,
                            max_grad_norm=1.0)
        learner = Learner(model, tok, SFTObjective(), DatasetSource(rows, a.batch, seed=0), cfg,
                          Path(tempfile.mkdtemp()) / "run")
        for b in batches:
            t = time.perf_counter()
            losses.append(float(learner.train_step(b)["loss"]))
            times.append(time.perf_counter() - t)
    else:
        import trl
        from datasets import Dataset
        from torch.utils.data import SequentialSampler
        from transformers import AutoModelForCausalLM, TrainerCallback

        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        data = Dataset.from_dict({
            "input_ids": [r.ids for b in batches for r in b],
            "labels": [[i if w > 0 else -100 for i, w in zip(r.ids, r.weight)] for b in batches for r in b]})

        class Sequential(trl.SFTTrainer):
            def _get_train_sampler(self, *args: Any, **kwargs: Any) -> Any:
                return SequentialSampler(self.train_dataset)

        class Clock(TrainerCallback):
            def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
                self.t = time.perf_counter()

            def on_step_end(self, *args: Any, **kwargs: Any) -> None:
                times.append(time.perf_counter() - self.t)

        args = trl.SFTConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=a.batch,
                             max_steps=a.steps + 1, learning_rate=1e-5, lr_scheduler_type="constant",
                             warmup_steps=0, logging_steps=1, save_strategy="no", report_to="none", use_cpu=True,
                             gradient_checkpointing=a.gc, max_length=a.max_length, seed=0,
                             dataloader_num_workers=0, max_grad_norm=1.0, adam_beta2=0.95)
        trainer = Sequential(model=model, args=args, train_dataset=data, processing_class=tok, callbacks=[Clock()])
        trainer.train()
        losses = [float(x["loss"]) for x in trainer.state.log_history if "loss" in x]
    timed, timed_tokens = times[1:], tokens[1:]
    # the first step's loss (same weights, same rows) checks that both sides train the same objective
    return {"side": a.side, "gc": a.gc, "first_loss": losses[0] if losses else None, "tokens_per_s": sum(timed_tokens) / sum(timed),
            "median_step_s": statistics.median(timed), "step_s": timed, "tokens": timed_tokens,
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2,
            "trl": __import__("trl").__version__ if a.side == "trl" else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="alias, path or .gguf (trajtune models list)")
    ap.add_argument("--steps", type=int, default=4, help="timed steps per run (after one warm-up step)")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--max-length", type=int, default=640)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", default="benchmarks/results/vs_trl.json")
    ap.add_argument("--worker", choices=["trajtune", "trl"], help=argparse.SUPPRESS, dest="side")
    ap.add_argument("--gc", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.side:
        print(json.dumps(worker(a)))
        return

    configs = [("trajtune", False), ("trl", True), ("trajtune", True), ("trl", False)]
    runs: dict[str, list[dict[str, Any]]] = {}
    for rep in range(a.repeats):
        for side, gc in configs:
            name = f"{side}, gradient checkpointing {'on' if gc else 'off'}"
            cmd = [sys.executable, __file__, "--worker", side, "--model", a.model, "--steps", str(a.steps),
                   "--batch", str(a.batch), "--max-length", str(a.max_length), "--threads", str(a.threads)]
            cmd += ["--gc"] if gc else []
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode != 0:
                raise SystemExit(f"{name} failed:\n{p.stderr[-3000:]}")
            r = json.loads(p.stdout.strip().splitlines()[-1])
            runs.setdefault(name, []).append(r)
            print(f"repeat {rep} {name}: {r['tokens_per_s']:.1f} tokens/s, peak RSS {r['peak_rss_gb']:.2f} GB, "
                  f"first-step loss {r['first_loss']:.4f}", flush=True)
    base = "trl, gradient checkpointing on"  # TRL's default
    best_trl = max(statistics.median(x["tokens_per_s"] for x in runs[n]) for n in runs if n.startswith("trl"))
    rows = []
    print(f"\nSFT on {a.model}: batch {a.batch}, {a.steps} timed steps, {a.threads} threads, {a.repeats} repeats, "
          f"TRL {next(r['trl'] for n in runs for r in runs[n] if r['trl'])}")
    print(f"{'configuration':38s} {'min tok/s':>10s} {'median tok/s':>13s} {'step s':>7s} {'peak RSS GB':>12s} "
          f"{'× best TRL':>10s}")
    for name, rs in runs.items():
        tps = [x["tokens_per_s"] for x in rs]
        row = {"configuration": name, "min_tokens_per_s": min(tps), "median_tokens_per_s": statistics.median(tps),
               "step_s": min(x["median_step_s"] for x in rs), "peak_rss_gb": max(x["peak_rss_gb"] for x in rs)}
        row["vs_best_trl"] = row["median_tokens_per_s"] / best_trl
        rows.append(row)
        print(f"{name:38s} {row['min_tokens_per_s']:10.1f} {row['median_tokens_per_s']:13.1f} {row['step_s']:7.2f} "
              f"{row['peak_rss_gb']:12.2f} {row['vs_best_trl']:10.2f}")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"model": a.model, "batch": a.batch, "steps": a.steps, "threads": a.threads,
                                       "baseline": base, "rows": rows, "runs": runs}, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
