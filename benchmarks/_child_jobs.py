"""Training runs of the real-model benchmarks, each in its own child process.

A child process gives each run its own peak RSS (``ru_maxrss`` of the process that trained) and
frees the model's memory when it ends; a finished run leaves ``bench.json`` beside its outputs, so
rerunning a benchmark reads it back instead of training again, and an unfinished one resumes.

Imported by name from scripts in ``benchmarks/`` (Python puts a script's own directory on the path;
``benchmarks/`` is not a package). A script using it accepts ``--job SPEC`` (JSON) and then prints
``json.dumps(its_job(spec))`` as its last line of output.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def measured(work: Callable[[], Any]) -> tuple[Any, dict[str, float]]:
    """Call ``work`` in this (child) process: its result, and its wall seconds and the process's peak RSS."""
    t = time.time()
    result = work()
    return result, {"seconds": round(time.time() - t, 1),
                    "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def run_child(script: str, spec: dict[str, Any], done: Path, label: str) -> dict[str, Any]:
    """``done`` (a finished run's ``bench.json``) read back, or ``script --job SPEC`` run in a child
    process and its last line of output saved there. A failed child stops the benchmark with ``label``
    in the message; rerunning resumes the run."""
    if done.exists():
        return json.loads(done.read_text())  # type: ignore[no-any-return]
    proc = subprocess.run([sys.executable, script, "--job", json.dumps(spec)], stdout=subprocess.PIPE, text=True)
    if proc.returncode:
        raise SystemExit(f"{label} failed (exit {proc.returncode}); see above; rerun to resume")
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    done.parent.mkdir(parents=True, exist_ok=True)
    tmp = done.with_name(done.name + ".tmp")
    tmp.write_text(json.dumps(info, indent=1))
    tmp.replace(done)
    return info  # type: ignore[no-any-return]
