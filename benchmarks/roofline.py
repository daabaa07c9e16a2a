"""This machine's limits: fp32 matmul GFLOP/s at a model's layer shapes, and memory bandwidth.

Matmuls are ``torch.nn.functional.linear(x, W)`` as the model runs them, x of M tokens × K, W of
N × K, for M in 1, 8, 32, 512 (a decode step, small batches, a training/prefill sequence) and every
distinct layer shape of the model (default SmolLM2-135M; ``--config`` reads another HF
config.json). Bandwidth is a large tensor's copy (read + write: 2 bytes moved per byte) and sum
(read only), far larger than the caches. Each at 1 and 2 threads (``torch.set_num_threads``); each
measurement repeats ``--repeats`` times (each repeat loops until it lasts ``--min-time`` s) and
reports the min time (best rate) and the median. Prints a table and writes JSON, which
``benchmarks/_roofline.py`` reads for other benchmarks. A benchmark, never a test.

    python benchmarks/roofline.py --repeats 5 --out benchmarks/results/roofline.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

_spec = importlib.util.spec_from_file_location("_roofline", Path(__file__).resolve().parent / "_roofline.py")
rl = importlib.util.module_from_spec(_spec)
sys.modules["_roofline"] = rl
_spec.loader.exec_module(rl)

MS = (1, 8, 32, 512)


def _time(fn, repeats: int, min_time: float) -> tuple[float, float, int]:
    """(min, median) seconds per call over ``repeats`` repeats; each repeat runs ``inner`` calls,
    chosen so that a repeat lasts about ``min_time``."""
    fn()  # warm-up (allocations, MKL's kernel choice)
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    inner = max(1, int(min_time / one))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - t0) / inner)
    return min(times), statistics.median(times), inner


def matmuls(config, threads, repeats, min_time):
    rows = []
    g = torch.Generator().manual_seed(0)
    for name, k, n in rl.layer_shapes(config):
        w = torch.randn(n, k, generator=g)
        for m in MS:
            x = torch.randn(m, k, generator=g)
            flops = 2 * m * k * n
            for t in threads:
                torch.set_num_threads(t)
                with torch.inference_mode():
                    best, med, inner = _time(lambda: torch.nn.functional.linear(x, w), repeats, min_time)
                rows.append({"shape": name, "m": m, "k": k, "n": n, "threads": t, "flops": flops, "inner": inner,
                             "s_min": best, "s_median": med, "gflops_best": flops / best / 1e9,
                             "gflops_median": flops / med / 1e9})
    return rows


def bandwidth(mib, threads, repeats, min_time):
    n = mib * 2**20 // 4
    src = torch.rand(n)
    dst = torch.empty_like(src)
    nbytes = src.numel() * 4
    rows = []
    for t in threads:
        torch.set_num_threads(t)
        for op, fn, moved in (("copy", lambda: dst.copy_(src), 2 * nbytes), ("read", lambda: src.sum(), nbytes)):
            best, med, inner = _time(fn, repeats, min_time)
            rows.append({"op": op, "threads": t, "mib": mib, "bytes_moved": moved, "inner": inner, "s_min": best,
                         "s_median": med, "gb_s_best": moved / best / 1e9, "gb_s_median": moved / med / 1e9})
    return rows


def peaks(mm, bw, threads):
    out = {}
    for t in threads:
        r = [x for x in mm if x["threads"] == t]
        out[str(t)] = {
            "gflops": max(x["gflops_best"] for x in r),
            "gflops_by_m": {str(m): max(x["gflops_best"] for x in r if x["m"] == m) for m in MS},
            "read_gb_s": next(x["gb_s_best"] for x in bw if x["threads"] == t and x["op"] == "read"),
            "copy_gb_s": next(x["gb_s_best"] for x in bw if x["threads"] == t and x["op"] == "copy"),
        }
    return out


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", help="an HF config.json whose layer shapes to time (default: SmolLM2-135M's)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.05, help="seconds each repeat lasts at least")
    ap.add_argument("--mib", type=int, default=256, help="size of the bandwidth tensor (MiB)")
    ap.add_argument("--note", default="", help="recorded in the JSON (e.g. what else ran on the machine)")
    ap.add_argument("--out", default=str(rl.DEFAULT_PATH))
    a = ap.parse_args()
    config = json.loads(Path(a.config).read_text()) if a.config else rl.SMOLLM2_135M
    t0 = time.perf_counter()
    mm = matmuls(config, a.threads, a.repeats, a.min_time)
    bw = bandwidth(a.mib, a.threads, a.repeats, a.min_time)
    pk = peaks(mm, bw, a.threads)
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    result = {
        "command": shlex.join(["python", "benchmarks/roofline.py", *sys.argv[1:]]),
        "machine": {"cpu": _cpu_name(), "cores": os.cpu_count(), "torch": torch.__version__,
                    "python": platform.python_version(), "loadavg_at_end": load},
        "note": a.note,
        "model": config.get("_name_or_path", a.config or "SmolLM2-135M (hard-coded shapes)"),
        "settings": {"repeats": a.repeats, "min_time_s": a.min_time, "dtype": "float32", "ms": list(MS)},
        "wall_s": round(time.perf_counter() - t0, 1),
        "peaks": pk, "matmul": mm, "bandwidth": bw,
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")

    print(f"fp32 matmul GFLOP/s, best (median) of {a.repeats}; y = x W^T, x: M x K, W: N x K")
    head = f"{'shape':<18} {'K x N':>11} " + " ".join(f"{f'M={m} t={t}':>14}" for m in MS for t in a.threads)
    print(head)
    for name, k, n in rl.layer_shapes(config):
        cells = []
        for m in MS:
            for t in a.threads:
                r = next(x for x in mm if x["shape"] == name and x["m"] == m and x["threads"] == t)
                cells.append(f"{r['gflops_best']:6.1f} ({r['gflops_median']:5.1f})")
        print(f"{name:<18} {f'{k}x{n}':>11} " + " ".join(f"{c:>14}" for c in cells))
    print(f"\nmemory bandwidth GB/s, {a.mib} MiB fp32 tensor, best (median)")
    for r in bw:
        print(f"  {r['op']:<5} threads={r['threads']}: {r['gb_s_best']:6.1f} ({r['gb_s_median']:5.1f})")
    print("\npeaks: " + "; ".join(f"{t} thread(s): {p['gflops']:.1f} GFLOP/s, read {p['read_gb_s']:.1f} GB/s"
                                  for t, p in pk.items()))
    print(f"wrote {out} ({result['wall_s']} s)")


if __name__ == "__main__":
    main()
