"""Peak memory per rank: data-parallel (``train.sharding: none``) vs sharded (``fsdp``) training.

Runs ``trajtune train`` (SFT, 2 steps) on W CPU processes (gloo) through ``torchrun``, once per
layout, on a locally made model sized up from the tiny presets (nothing is downloaded), and reads
each rank's peak resident memory (``VmHWM`` in ``/proc``, polled while it runs). Also prints the
model state each rank holds by construction: parameters + gradients + AdamW's two moments, all
float32 (data-parallel: all of it on every rank; sharded: 1/W of it, plus one layer gathered at a time).

A benchmark, not a test: nothing is asserted. On CPU the gathered checkpoint and final model also
land in the same memory (rank 0's peak includes one full copy of the weights while it saves; on
GPUs that copy is in host memory), so rank 1's peak is the cleaner comparison.

    nice -n 10 python benchmarks/sharding_memory.py --hidden 1024 --layers 8 --out bench_sharding.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _setup(work: Path, hidden: int, layers: int) -> tuple[Path, Path, int]:
    """A sized-up tiny Qwen2 model and home-environment SFT data; returns (model, data, parameters)."""
    from trajtune.chat.render import message_to_template_dict, tools_to_template
    from trajtune.envs import make_env
    from trajtune.models.tiny import build_tokenizer, create_tiny_model
    from trajtune.schema import write_trajectories

    env = make_env("home")
    trajs = [env.expert(t) for t in env.tasks("train", 32, seed=0)]
    probe = build_tokenizer(["probe"], 300)
    texts = [probe.apply_chat_template([message_to_template_dict(m) for m in t.messages],
                                       tools=tools_to_template(t.tools), tokenize=False) for t in trajs]
    model = create_tiny_model(work / "model", texts, vocab_size=1024, preset="small", hidden_size=hidden,
                              intermediate_size=int(2.75 * hidden), num_hidden_layers=layers,
                              num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64)
    write_trajectories(work / "data.jsonl", trajs)
    from safetensors import safe_open

    with safe_open(str(model / "model.safetensors"), "pt") as f:
        n = sum(_numel(f.get_slice(k).get_shape()) for k in f.keys())
    return model, work / "data.jsonl", n


def _numel(shape: list[int]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def _peaks(launcher: subprocess.Popen, tag: str) -> dict[int, int]:
    """Poll the launcher's worker processes (their environment carries ``tag``) until it exits:
    {rank: peak RSS in bytes}."""
    peaks: dict[int, int] = {}
    while launcher.poll() is None:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            tags = dict(e.split(b"=", 1) for e in env if b"=" in e)
            if tags.get(b"TRAJTUNE_BENCH") != tag.encode() or b"RANK" not in tags:
                continue
            hwm = next((int(ln.split()[1]) * 1024 for ln in status.splitlines() if ln.startswith("VmHWM")), 0)
            rank = int(tags[b"RANK"])
            peaks[rank] = max(peaks.get(rank, 0), hwm)
        time.sleep(0.2)
    return peaks


def measure(model: Path, data: Path, work: Path, layout: str, world: int) -> dict[int, int]:
    cfg = work / "sft.yaml"
    cfg.write_text(f"algorithm: sft\nmodel: {model}\nseed: 0\nreport: false\n"
                   f"data: {{path: {data}, format: ir, max_length: 512}}\n"
                   "train: {steps: 2, lr: 1.0e-4, batch_size: 4, micro_batch_size: 1, schedule: constant}\n")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(world),
           "-m", "trajtune.cli", "train", "--config", str(cfg), "--set", f"train.sharding={layout}",
           "--set", f"output_dir={work / layout}", "--overwrite", "-q"]
    tag = f"{os.getpid()}-{layout}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRAJTUNE_BENCH": tag}
    with tempfile.TemporaryFile("w+") as err:
        launcher = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err, text=True)
        peaks = _peaks(launcher, tag)
        if launcher.returncode != 0:
            err.seek(0)
            raise SystemExit(f"{layout} run failed:\n{err.read()[-3000:]}")
    return peaks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="trajtune-shard-mem-"))
    model, data, n = _setup(work, a.hidden, a.layers)
    state = 4 * 4 * n  # float32 parameters, gradients, AdamW exp_avg and exp_avg_sq
    rows = {}
    for layout in ("none", "fsdp"):
        peaks = measure(model, data, work, layout, a.world)
        held = state if layout == "none" else state // a.world
        rows[layout] = {"model_state_bytes_per_rank": held, "peak_rss_bytes": {str(r): peaks[r] for r in sorted(peaks)}}
        print(f"{layout:5s}  model state/rank {held / 2**20:8.1f} MiB   peak RSS "
              + "  ".join(f"rank {r}: {peaks[r] / 2**20:8.1f} MiB" for r in sorted(peaks)), flush=True)
    result = {"parameters": n, "hidden": a.hidden, "layers": a.layers, "world": a.world, "layouts": rows}
    print(json.dumps(result))
    if a.out is not None:
        a.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
