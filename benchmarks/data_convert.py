"""Benchmark: streaming convert and validate throughput and peak memory on a large synthetic file.

Not a test. Generates N OpenAI-chat records (parallel calls, unicode, tool specs) in a temp dir,
then runs each phase in its own subprocess so that each phase's peak RSS is its own:

    PYTHONPATH=src python benchmarks/data_convert.py --n 200000 --json benchmarks/results/data_convert.json

Peak RSS staying flat as --n grows is the point: conversion and validation stream line by line.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def make_record(i: int) -> dict:
    """A realistic small agent record; every 7th has parallel calls, every 11th unicode."""
    city = "Zürich 東京" if i % 11 == 0 else f"city-{i % 97}"
    calls = [{"id": f"call_{i}_0", "type": "function",
              "function": {"name": "get_weather", "arguments": json.dumps({"city": city, "unit": "C"})}}]
    if i % 7 == 0:
        calls.append({"id": f"call_{i}_1", "type": "function",
                      "function": {"name": "get_time", "arguments": json.dumps({"tz": "Europe/Paris"})}})
    msgs = [{"role": "system", "content": "You are a helpful assistant with tools."},
            {"role": "user", "content": f"What is the weather in {city}? (request {i})"},
            {"role": "assistant", "content": None, "tool_calls": calls}]
    msgs += [{"role": "tool", "tool_call_id": c["id"], "content": f"{{\"temp\": {i % 35}}}"} for c in calls]
    msgs.append({"role": "assistant", "content": f"It is {i % 35}°C in {city}."})
    return {"id": f"bench-{i}", "messages": msgs, "tools": [
        {"type": "function", "function": {"name": "get_weather", "description": "Weather now", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["C", "F"]}},
            "required": ["city"]}}},
        {"type": "function", "function": {"name": "get_time", "description": "Clock", "parameters": {
            "type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}}]}


def generate(path: Path, n: int) -> None:
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps(make_record(i), ensure_ascii=False) + "\n")


def _peak_rss_mib() -> float:
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return kib / 1024


def phase(name: str, inp: Path, out: Path, to: str) -> dict:
    """Run one phase in this process and return its numbers (called in a fresh subprocess)."""
    from trajtune.formats import LoadStats, get_format, iter_records
    from trajtune.schema import AtomicJsonlWriter
    from trajtune.validate import iter_findings

    base = _peak_rss_mib()
    t0 = time.perf_counter()
    if name == "convert":
        export = get_format(to).from_ir
        stats = LoadStats()
        with AtomicJsonlWriter(out, overwrite=True) as w:
            for _, traj, _ in iter_records(inp, "openai", stats=stats):
                w.write(export(traj)[0])
        n = w.count
        extra = {"to": to}
    else:
        st: dict = {}
        findings = sum(1 for _ in iter_findings(inp, "openai", stats=st))
        n = st["records"]
        extra = {"findings": findings}
    dt = time.perf_counter() - t0
    return {"phase": name, "records": n, "seconds": round(dt, 2), "records_per_s": round(n / dt, 1),
            "peak_rss_mib": round(_peak_rss_mib(), 1), "rss_at_start_mib": round(base, 1), **extra}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200_000, help="records to generate")
    ap.add_argument("--to", default="adp", help="target format of the convert phase")
    ap.add_argument("--json", type=Path, default=None, help="write results here")
    ap.add_argument("--phase", choices=["convert", "validate"], help=argparse.SUPPRESS)
    ap.add_argument("--input", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--output", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.phase:  # child mode
        print(json.dumps(phase(args.phase, args.input, args.output, args.to)))
        return
    with tempfile.TemporaryDirectory(prefix="trajtune-bench-") as tmp:
        inp = Path(tmp) / "in.jsonl"
        t0 = time.perf_counter()
        generate(inp, args.n)
        gen_s = time.perf_counter() - t0
        size_mib = inp.stat().st_size / 2**20
        results = []
        for ph in ("convert", "validate"):
            cmd = [sys.executable, __file__, "--phase", ph, "--input", str(inp), "--output", str(Path(tmp) / "out.jsonl"),
                   "--to", args.to]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
            if proc.returncode != 0:
                sys.exit(f"{ph} failed:\n{proc.stderr}")
            results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    report = {"n": args.n, "input_mib": round(size_mib, 1), "generate_seconds": round(gen_s, 1),
              "python": sys.version.split()[0], "cpus": os.cpu_count(),
              "load_avg_1m_at_end": round(os.getloadavg()[0], 2),  # shared machines: read throughput with this
              "results": results}
    print(f"input: {args.n} records, {size_mib:.1f} MiB (generated in {gen_s:.1f}s)")
    print(f"{'phase':<14}{'records':>10}{'seconds':>10}{'records/s':>12}{'peak RSS MiB':>14}")
    for r in results:
        label = r["phase"] + (f"->{r['to']}" if r["phase"] == "convert" else "")
        print(f"{label:<14}{r['records']:>10}{r['seconds']:>10}{r['records_per_s']:>12}{r['peak_rss_mib']:>14}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
