"""Multi-turn rollout speed: episodes per second in the `home` environment with the demo's model,
batch 32 against batch 1, with the KV cache kept across turns (`rollout.reuse_kv_cache`, the
default) and with `generate()` re-encoding the history every turn.

Interleaved (each configuration once per repeat, in turn), one thread, the same tasks and seed;
prints min and median seconds and episodes/s, and writes JSON. Also as model GFLOP/s: the useful
work, every episode's tokens through the model once and the LM head once per sampled token
(``_roofline.sequence_flops``; re-encoding the history, as ``generate()`` does, is work no episode
needs, so it counts nothing), and that as a fraction of this machine's best matmul rate at the
thread count (``benchmarks/roofline.py``, measured at SmolLM2-135M's shapes: a tiny model reads low
against it). A benchmark, not a test.

    python benchmarks/rollout_speed.py --model runs/demo/sft/final --episodes 64 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from _roofline import add_roofline_arg, limits_or_none, pct, rate, recorded_peaks, sequence_flops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="runs/demo/sft/final", help="a model directory (the demo's SFT model)")
    ap.add_argument("--env", default="home")
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--threads", type=int, default=1)
    add_roofline_arg(ap)
    ap.add_argument("--out", default="benchmarks/results/rollout_speed.json")
    a = ap.parse_args()
    limits = limits_or_none(a.roofline)

    import torch

    torch.set_num_threads(a.threads)
    from trajtune.chat.render import ChatRenderer
    from trajtune.envs import make_env
    from trajtune.models.loading import load_model, load_tokenizer
    from trajtune.rollout import RolloutConfig, run_rollouts

    tok = load_tokenizer(a.model)
    model = load_model(a.model, trainable=False)
    renderer = ChatRenderer(tok)
    tasks = make_env(a.env).tasks("test", a.episodes, seed=0)
    configs = {f"batch {b}, {'kv cache' if c else 'generate'}": (b, c) for b in (32, 1) for c in (True, False)}
    times: dict[str, list[float]] = {k: [] for k in configs}
    info: dict[str, dict[str, float]] = {}
    flops: dict[str, list[float]] = {k: [] for k in configs}  # per repeat: each repeat samples with its own seed
    run_rollouts(model, tok, lambda: make_env(a.env), tasks[:4], RolloutConfig(max_turns=4, max_new_tokens=40,
                 max_length=512, batch_size=4), renderer=renderer)  # warm-up
    for rep in range(a.repeats):
        for name, (bs, cache) in configs.items():
            ro = RolloutConfig(max_turns=4, max_new_tokens=40, max_length=512, temperature=a.temperature,
                               batch_size=bs, reuse_kv_cache=cache)
            t = time.perf_counter()
            eps = run_rollouts(model, tok, lambda: make_env(a.env), tasks, ro, seed=rep, renderer=renderer)
            times[name].append(time.perf_counter() - t)
            flops[name].append(sum(sequence_flops(model.config, len(e.tokens), training=False, head=e.tokens.n_policy())
                                   for e in eps))
            info[name] = {"turns": statistics.mean(e.turns for e in eps),
                          "tokens": statistics.mean(len(e.tokens) for e in eps),
                          "success": statistics.mean(float(bool(e.trajectory.outcome.success)) for e in eps)}
            print(f"repeat {rep} {name}: {times[name][-1]:.2f} s", flush=True)
    base = min(times["batch 1, generate"])
    rows = []
    print(f"\n{a.episodes} episodes of '{a.env}' with {a.model}, {a.threads} thread(s), {a.repeats} repeats")
    print(f"{'configuration':28s} {'min s':>7s} {'median s':>9s} {'episodes/s':>11s} {'× batch 1 generate':>19s} "
          f"{'turns':>6s} {'GFLOP/s':>8s} {'÷ peak':>7s}")
    for name in configs:
        mn, md = min(times[name]), statistics.median(times[name])
        r = rate(flops[name][times[name].index(mn)], mn, limits, a.threads)  # the fastest repeat's own work
        rows.append({"configuration": name, "min_s": mn, "median_s": md, "episodes_per_s": a.episodes / mn,
                     "speedup_vs_batch1_generate": base / mn, **info[name], **r})
        print(f"{name:28s} {mn:7.2f} {md:9.2f} {a.episodes / mn:11.1f} {base / mn:19.1f} {info[name]['turns']:6.2f} "
              f"{r['gflops']:8.2f} {pct(r['matmul_fraction']):>7s}")
    print(f"batch 32 vs batch 1, both with the kv cache: {min(times['batch 1, kv cache']) / min(times['batch 32, kv cache']):.1f}×")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"model": a.model, "episodes": a.episodes, "threads": a.threads,
                                       "torch": torch.__version__,
                                       "roofline": recorded_peaks(limits), "rows": rows,
                                       "times": times}, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
