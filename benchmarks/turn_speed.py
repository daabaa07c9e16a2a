"""One GRPO-shaped sampling turn with the cached sampler, this checkout against another one
(``--baseline-src``, e.g. a ``git worktree`` of an older commit), interleaved A B A B in fresh
processes: 4 `fncall` prompts x 8 samples, temperature 1, up to 96 new tokens, the model's stop
tokens (so rows leave the batch at different steps). Prints min and median seconds and tokens/s,
writes JSON. ``--share-arms``: this checkout with the prompt's cache shared by a group's samples
(``rollout.share_prompt_cache``, default) and without, instead of another checkout. Also as model
GFLOP/s (each distinct prompt encoded once, each sampled token but the last fed through the model
at its context, the LM head once per sampled token: ``_roofline.sequence_flops`` and
``continuation_flops``; the same work in every arm) and that as a fraction of this machine's matmul
peak (``benchmarks/roofline.py``). A benchmark, not a test.

    git worktree add /tmp/old 257be1d
    python benchmarks/turn_speed.py --model runs/demo-real/sft/final --baseline-src /tmp/old/src --repeats 3
    python benchmarks/turn_speed.py --model smollm2-135m --share-arms --repeats 5 --out benchmarks/results/turn_speed_share.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _roofline import (add_roofline_arg, continuation_flops, limits_or_none, pct,
                       rate, recorded_peaks, sequence_flops)


def one_turn(model_path: str, threads: int, share_prompt: bool = True) -> dict:
    import torch

    torch.set_num_threads(threads)
    from trajtune.chat.render import ChatRenderer
    from trajtune.envs.registry import make_env
    from trajtune.generation import CachedSampler
    from trajtune.models.loading import load_model, load_tokenizer

    model = load_model(model_path, trainable=False).eval()
    tok = load_tokenizer(model_path)
    r = ChatRenderer(tok)
    kw = dict(single_turn=True, system_prompt=False, holdout="functions", min_distractors=0, max_distractors=2)
    env = make_env("fncall", **kw)
    prompts = []
    for t in env.tasks("train", 4, seed=7):
        res = make_env("fncall", **kw).reset(t)
        prompts.append(r.encode(r.prompt_text(res.messages, res.tools)))
    stops = [x for x in (tok.convert_tokens_to_ids("<|im_end|>"), tok.eos_token_id) if x is not None]
    sampler = CachedSampler(model, 1.0, 1.0, stops, share_prompt=share_prompt)
    rows = [(None, list(p)) for p in prompts for _ in range(8)]
    t0 = time.perf_counter()
    out = sampler.turn(rows, [96] * len(rows), seed=11)
    dt = time.perf_counter() - t0
    lens = [len(o[0]) for o in out]
    # the LM head once per sampled token (the first from the prompt's last position)
    flops = sum(sequence_flops(model.config, len(p), training=False, head=0) for p in prompts)
    flops += sum(continuation_flops(model.config, len(rows[i][1]), n - 1, head=n) for i, n in enumerate(lens))
    return {"seconds": dt, "tokens": sum(lens), "min_len": min(lens), "max_len": max(lens), "flops": flops}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="runs/demo-real/sft/final")
    ap.add_argument("--baseline-src", default=None, help="another checkout's src/ to compare with")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--share-arms", action="store_true",
                    help="compare this checkout with and without the shared prompt cache")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--no-share", action="store_true", help=argparse.SUPPRESS)
    add_roofline_arg(ap)
    ap.add_argument("--out", default="benchmarks/results/turn_speed.json")
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(one_turn(a.model, a.threads, share_prompt=not a.no_share)))
        return
    limits = limits_or_none(a.roofline)
    here = str(Path(__file__).resolve().parents[1] / "src")
    if a.share_arms:
        arms = {"shared prompt cache": (here, []), "a copy per sample": (here, ["--no-share"])}
    else:
        arms = {"this checkout": (here, [])} | ({"baseline": (a.baseline_src, [])} if a.baseline_src else {})
    runs: dict[str, list[dict]] = {k: [] for k in arms}
    for _ in range(a.repeats):
        for name, (src, extra) in arms.items():
            env = {**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": str(a.threads)}
            p = subprocess.run([sys.executable, __file__, "--worker", "--model", a.model, "--threads", str(a.threads),
                                *extra], env=env, capture_output=True, text=True, check=True)
            runs[name].append(json.loads(p.stdout.strip().splitlines()[-1]))
    print("| arm | min s | median s | tokens | tokens/s (median) | GFLOP/s (median) | ÷ matmul peak |\n"
          "|---|---|---|---|---|---|---|")
    table = {}
    for name, rs in runs.items():
        secs = [r["seconds"] for r in rs]
        med = statistics.median(secs)
        table[name] = {"min_s": min(secs), "median_s": med, "tokens": rs[0]["tokens"],
                       "tokens_per_s": rs[0]["tokens"] / med, **rate(rs[0]["flops"], med, limits, a.threads),
                       "runs": rs, "src": arms[name][0], "flags": arms[name][1]}
        print(f"| {name} | {min(secs):.2f} | {med:.2f} | {rs[0]['tokens']} | {rs[0]['tokens'] / med:.1f} | "
              f"{table[name]['gflops']:.1f} | {pct(table[name]['matmul_fraction'])} |")
    Path(a.out).write_text(json.dumps({"model": a.model, "threads": a.threads,
                                       "roofline": recorded_peaks(limits), "arms": table},
                                      indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
