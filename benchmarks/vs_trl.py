"""Side by side with TRL on the same model: SFT (`--task sft`, default) and GRPO (`--task grpo`).

GRPO: single-turn function calling (`fncall` with single_turn; TRL's GRPOTrainer cannot drive our
multi-turn environments), the same rendered prompts for both, the same reward (the environment
scores the parsed call), 4 prompts × 4 samples of at most 32 tokens per step, temperature 1, no
KL, micro-batches of 4 sequences on both sides; reported: the step time (generation + reward +
update) and peak RSS.

SFT: trajtune's learner against TRL's SFTTrainer on the same model, tokens and batches.

Both sides train on identical pre-tokenized rows (home expert trajectories rendered by trajtune
with the model's chat template; TRL gets them as `input_ids` + `labels`, -100 where trajtune's
weight is 0), in the same order (TRL's sampler made sequential), the same batch size, learning
rate and constant schedule. Each measurement is its own process (so peak RSS is that run's);
configurations are interleaved A B A B; the first step of each run is warm-up and not timed.

Settings pinned per side: trajtune with and without `train.gradient_checkpointing`, and with it on
plus `train.step_in_backward` (which cannot clip: that run has no clipping, the others clip at 1.0);
TRL with its default (gradient checkpointing on) and with it off. Reported: min and median tokens/s
over the repeats (tokens = non-padding tokens of the timed steps), the min of the per-run median
step time, and peak RSS, also as a fraction of TRL's default's; and the median model GFLOP/s
(forward and backward of every row's tokens, the LM head at trained tokens only,
``_roofline.sequence_flops``; a forward recomputed under gradient checkpointing is not counted) as
a fraction of this machine's matmul peak at the thread count (``benchmarks/roofline.py``). The GRPO
task reports step times only: a step mixes sampling and training, whose fractions are
``decode_speed.py``'s, ``turn_speed.py``'s and ``prefix_share.py``'s. Needs the `bench` extra
(`pip install -e '.[bench]'`). A benchmark, not a test.

    python benchmarks/vs_trl.py --model smollm2-135m --steps 4 --batch 2 --repeats 2
    python benchmarks/vs_trl.py --steps 3 --batch 2 --repeats 3 --configs trajtune-gc,trajtune-gc-sib
    python benchmarks/vs_trl.py --task grpo --model smollm2-135m --steps 2 --repeats 1
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

from _roofline import (add_roofline_arg, limits_or_none, pct, rate,
                       recorded_peaks, sequence_flops, trained_tokens)


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


def _peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2


def _trace_optimizer(optimizer: Any, trace: list[tuple[str, float]]) -> Any:
    """Record the peak RSS before and after every optimizer step (peak RSS only grows, so the
    increments say which phase set it: the forward and backward, or the optimizer step); returns
    a function that undoes the wrapping."""
    step = optimizer.step

    def traced(*args: Any, **kwargs: Any) -> Any:
        trace.append(("forward+backward", _peak_rss_gb()))
        out = step(*args, **kwargs)
        trace.append(("optimizer step", _peak_rss_gb()))
        return out

    optimizer.step = traced
    return lambda: setattr(optimizer, "step", step)


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
    rss_trace: list[tuple[str, float]] = []  # trajtune: the peak RSS so far, before and after each optimizer step
    if a.side == "trajtune":
        from trajtune.algorithms.sft import SFTObjective
        from trajtune.experience import DatasetSource
        from trajtune.learner import Learner, LearnerConfig

        model = load_model(path, dtype="float32", gradient_checkpointing=a.gc)
        chunk = a.loss_chunk_tokens if a.loss_chunk_tokens == "auto" else int(a.loss_chunk_tokens)
        # step in backward cannot clip (the global norm is known only after the last gradient)
        cfg = LearnerConfig(steps=a.steps + 1, lr=1e-5, schedule="constant", micro_batch_size=a.batch,
                            max_grad_norm=None if a.step_in_backward else 1.0, loss_chunk_tokens=chunk,
                            step_in_backward=a.step_in_backward)
        learner = Learner(model, tok, SFTObjective(), DatasetSource(rows, a.batch, seed=0), cfg,
                          Path(tempfile.mkdtemp()) / "run")
        # (step in backward calls the optimizer once per weight: its trace would be thousands of entries)
        trace = (lambda: None) if a.step_in_backward else _trace_optimizer(learner.optimizer, rss_trace)
        for b in batches:
            t = time.perf_counter()
            losses.append(float(learner.train_step(b)["loss"]))
            times.append(time.perf_counter() - t)
        trace()
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
    # the LM head only where a token is trained: the logits the loss needs
    flops = sum(sequence_flops(model.config, len(r), training=True, head=trained_tokens(r))
                for b in batches[1:] for r in b)
    # the first step's loss (same weights, same rows) checks that both sides train the same objective
    return {"side": a.side, "gc": a.gc, "first_loss": losses[0] if losses else None, "tokens_per_s": sum(timed_tokens) / sum(timed),
            "flops_per_s": flops / sum(timed),
            "median_step_s": statistics.median(timed), "step_s": timed, "tokens": timed_tokens,
            "peak_rss_gb": _peak_rss_gb(), "rss_trace_gb": rss_trace,
            "trl": __import__("trl").__version__ if a.side == "trl" else None}


GRPO_TASKS, GRPO_GROUP, GRPO_NEW = 4, 4, 32  # prompts per step, samples per prompt, completion tokens


def grpo_worker(a: argparse.Namespace) -> dict[str, Any]:
    """One GRPO run on single-turn function calling (`fncall`, single_turn): TRL cannot run our
    multi-turn environments, so both sides get the same single-turn prompts and reward."""
    import torch

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    from trajtune.models.loading import resolve_model

    path = resolve_model(a.model).path
    n_tasks = GRPO_TASKS * (a.steps + 1)
    times: list[float] = []
    if a.side == "trajtune":
        from trajtune.algorithms.registry import get_algorithm
        from trajtune.config import validate_config
        from trajtune.train import run

        out = Path(tempfile.mkdtemp()) / "rl"
        cfg = validate_config({
            "algorithm": "rl", "model": path, "output_dir": str(out), "seed": 0,
            "env": {"name": "fncall", "kwargs": {"single_turn": True}},
            "rollout": {"max_turns": 1, "max_new_tokens": GRPO_NEW, "max_length": 2048, "temperature": 1.0,
                        "batch_size": GRPO_TASKS * GRPO_GROUP},
            "rl": {"tasks_per_step": GRPO_TASKS, "group_size": GRPO_GROUP, "n_train_tasks": n_tasks},
            "train": {"steps": a.steps + 1, "lr": 1e-6, "schedule": "constant",
                      "micro_batch_size": GRPO_GROUP, "gradient_checkpointing": a.gc},
        }, get_algorithm("rl").config, "<bench>")
        run(cfg, quiet=True)
        times = [json.loads(x)["seconds"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    else:
        import trl
        from datasets import Dataset
        from transformers import TrainerCallback

        from trajtune.chat.parsers import assistant_message, parse_tool_calls
        from trajtune.chat.render import ChatRenderer
        from trajtune.envs import make_env
        from trajtune.models.loading import load_tokenizer

        tok = load_tokenizer(path)
        renderer = ChatRenderer(tok)
        tasks = make_env("fncall", single_turn=True).tasks("train", n_tasks, seed=0)
        prompts = []
        for t in tasks:
            res = make_env("fncall", single_turn=True).reset(t)
            prompts.append(renderer.prompt_text(res.messages, res.tools))

        def reward(completions: list[str], task_index: list[int], **kw: Any) -> list[float]:
            out = []
            for text, i in zip(completions, task_index):
                env = make_env("fncall", single_turn=True)
                env.reset(tasks[i])
                parsed = parse_tool_calls(text, renderer.parser or "hermes")
                out.append(float(env.step(assistant_message(parsed.content, parsed.tool_calls, parsed.errors,
                                                            text)).reward))
            return out

        class Clock(TrainerCallback):
            def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
                self.t = time.perf_counter()

            def on_step_end(self, *args: Any, **kwargs: Any) -> None:
                times.append(time.perf_counter() - self.t)

        # one optimizer step = one generation of GRPO_TASKS × GRPO_GROUP completions, in micro-batches of GRPO_GROUP
        args = trl.GRPOConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=GRPO_GROUP,
                              gradient_accumulation_steps=GRPO_TASKS, num_generations=GRPO_GROUP, max_completion_length=GRPO_NEW, max_steps=a.steps + 1,
                              learning_rate=1e-6, lr_scheduler_type="constant", beta=0.0, temperature=1.0,
                              use_cpu=True, logging_steps=1, save_strategy="no", report_to="none", seed=0,
                              gradient_checkpointing=a.gc, shuffle_dataset=False)
        data = Dataset.from_dict({"prompt": prompts, "task_index": list(range(n_tasks))})
        trainer = trl.GRPOTrainer(model=path, reward_funcs=reward, args=args, train_dataset=data,
                                  processing_class=tok, callbacks=[Clock()])
        trainer.train()
    timed = times[1:]
    return {"side": a.side, "gc": a.gc, "median_step_s": statistics.median(timed), "step_s": timed,
            "peak_rss_gb": _peak_rss_gb(),
            "trl": __import__("trl").__version__ if a.side == "trl" else None}


# SFT configurations: (side, gradient checkpointing, train.step_in_backward)
CONFIGS = {"trajtune": ("trajtune", False, False), "trl-gc": ("trl", True, False),
           "trajtune-gc": ("trajtune", True, False), "trl": ("trl", False, False),
           "trajtune-gc-sib": ("trajtune", True, True)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="alias, path or .gguf (trajtune models list)")
    ap.add_argument("--steps", type=int, default=4, help="timed steps per run (after one warm-up step)")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--max-length", type=int, default=640)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", default="benchmarks/results/vs_trl.json")
    add_roofline_arg(ap)
    ap.add_argument("--task", choices=["sft", "grpo"], default="sft",
                    help="sft: tokens/s and memory; grpo: step time on single-turn function calling (fncall), "
                         f"{GRPO_TASKS} prompts × {GRPO_GROUP} samples of ≤ {GRPO_NEW} tokens per step")
    ap.add_argument("--worker", choices=["trajtune", "trl"], help=argparse.SUPPRESS, dest="side")
    ap.add_argument("--gc", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--step-in-backward", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--configs", default=",".join(CONFIGS),
                    help="SFT: which configurations, comma-separated, in the order they interleave (default: all; "
                         "TRL's SFT on CPU can take minutes per step: its fused LM head has no CPU kernel)")
    ap.add_argument("--loss-chunk-tokens", default="auto", help="trajtune's train.loss_chunk_tokens (auto, 0: off, N)")
    a = ap.parse_args()
    if a.side:
        print(json.dumps(worker(a) if a.task == "sft" else grpo_worker(a)))
        return
    if a.task == "grpo":
        return grpo_main(a)

    unknown = [c for c in a.configs.split(",") if c not in CONFIGS]
    if unknown:
        ap.error(f"--configs: unknown {unknown}; choose from {', '.join(CONFIGS)}")
    configs = [CONFIGS[c] for c in a.configs.split(",")]
    runs: dict[str, list[dict[str, Any]]] = {}
    for rep in range(a.repeats):
        for side, gc, sib in configs:
            name = f"{side}, gradient checkpointing {'on' if gc else 'off'}" + \
                (", step in backward (no clipping)" if sib else "")
            cmd = [sys.executable, __file__, "--worker", side, "--model", a.model, "--steps", str(a.steps),
                   "--batch", str(a.batch), "--max-length", str(a.max_length), "--threads", str(a.threads)]
            cmd += (["--gc"] if gc else []) + (["--step-in-backward"] if sib else [])
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode != 0:
                raise SystemExit(f"{name} failed:\n{p.stderr[-3000:]}")
            r = json.loads(p.stdout.strip().splitlines()[-1])
            runs.setdefault(name, []).append(r)
            print(f"repeat {rep} {name}: {r['tokens_per_s']:.1f} tokens/s, peak RSS {r['peak_rss_gb']:.2f} GB, "
                  f"first-step loss {r['first_loss']:.4f}", flush=True)
    limits = limits_or_none(a.roofline)
    base = "trl, gradient checkpointing on"  # TRL's default
    trl_runs = [n for n in runs if n.startswith("trl")]
    best_trl = max((statistics.median(x["tokens_per_s"] for x in runs[n]) for n in trl_runs), default=float("nan"))
    base_rss = max((x["peak_rss_gb"] for x in runs.get(base, [])), default=float("nan"))
    rows = []
    print(f"\nSFT on {a.model}: batch {a.batch}, {a.steps} timed steps, {a.threads} threads, {a.repeats} repeats, "
          f"TRL {next((r['trl'] for n in runs for r in runs[n] if r['trl']), 'not run')}")
    print(f"{'configuration':60s} {'min tok/s':>10s} {'median tok/s':>13s} {'step s':>7s} {'peak RSS GB':>12s} "
          f"{'× best TRL':>10s} {'RSS ÷ TRL default':>17s} {'GFLOP/s':>8s} {'÷ peak':>7s}")
    for name, rs in runs.items():
        tps = [x["tokens_per_s"] for x in rs]
        row = {"configuration": name, "min_tokens_per_s": min(tps), "median_tokens_per_s": statistics.median(tps),
               "step_s": min(x["median_step_s"] for x in rs), "peak_rss_gb": max(x["peak_rss_gb"] for x in rs)}
        row["vs_best_trl"] = row["median_tokens_per_s"] / best_trl
        row["rss_vs_trl_default"] = row["peak_rss_gb"] / base_rss
        row.update(rate(statistics.median(x["flops_per_s"] for x in rs), 1.0, limits, a.threads))
        rows.append(row)
        print(f"{name:60s} {row['min_tokens_per_s']:10.1f} {row['median_tokens_per_s']:13.1f} {row['step_s']:7.2f} "
              f"{row['peak_rss_gb']:12.2f} {row['vs_best_trl']:10.2f} {row['rss_vs_trl_default']:17.2f} "
              f"{row['gflops']:8.1f} {pct(row['matmul_fraction']):>7s}")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"model": a.model, "batch": a.batch, "steps": a.steps, "threads": a.threads,
                                       "baseline": base, "roofline": recorded_peaks(limits),
                                       "rows": rows, "runs": runs}, indent=1))
    print(f"wrote {a.out}")



def _launch(a: argparse.Namespace, side: str, gc: bool) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--task", a.task, "--worker", side, "--model", a.model, "--steps", str(a.steps),
           "--batch", str(a.batch), "--max-length", str(a.max_length), "--threads", str(a.threads)]
    cmd += ["--gc"] if gc else []
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{side} (gc {gc}) failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def grpo_main(a: argparse.Namespace) -> None:
    configs = [("trajtune", False), ("trl", False), ("trajtune", True), ("trl", True)]
    runs: dict[str, list[dict[str, Any]]] = {}
    for rep in range(a.repeats):
        for side, gc in configs:
            name = f"{side}, gradient checkpointing {'on' if gc else 'off'}"
            r = _launch(a, side, gc)
            runs.setdefault(name, []).append(r)
            print(f"repeat {rep} {name}: median step {r['median_step_s']:.2f} s, peak RSS {r['peak_rss_gb']:.2f} GB",
                  flush=True)
    best_trl = min(min(x["median_step_s"] for x in runs[n]) for n in runs if n.startswith("trl"))
    print(f"\nGRPO on {a.model}: fncall single-turn, {GRPO_TASKS} prompts × {GRPO_GROUP} samples, ≤ {GRPO_NEW} new "
          f"tokens, {a.steps} timed steps, {a.threads} threads, {a.repeats} repeats")
    print(f"{'configuration':38s} {'min step s':>11s} {'median step s':>14s} {'peak RSS GB':>12s} {'÷ best TRL':>11s}")
    rows = []
    for name, rs in runs.items():
        steps = [x["median_step_s"] for x in rs]
        row = {"configuration": name, "min_step_s": min(steps), "median_step_s": statistics.median(steps),
               "peak_rss_gb": max(x["peak_rss_gb"] for x in rs)}
        row["vs_best_trl"] = row["min_step_s"] / best_trl
        rows.append(row)
        print(f"{name:38s} {row['min_step_s']:11.2f} {row['median_step_s']:14.2f} {row['peak_rss_gb']:12.2f} "
              f"{row['vs_best_trl']:11.2f}")
    out = Path(a.out).with_name(Path(a.out).stem + "_grpo.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": a.model, "steps": a.steps, "threads": a.threads, "rows": rows, "runs": runs},
                              indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
