"""benchmarks/_child_jobs.py: a run goes to a child process once; its bench.json is read back after."""

from __future__ import annotations

import json

import pytest

from benchmark_module import load  # pytest puts tests/ on sys.path

cj = load("_child_jobs")

SCRIPT = """
import json, sys
from pathlib import Path
spec = json.loads(sys.argv[2])
calls = Path(spec["calls"])
calls.write_text(calls.read_text() + "x" if calls.exists() else "x")
print("progress noise")
if spec.get("fail"):
    sys.exit(3)
print(json.dumps({"doubled": spec["n"] * 2}))
"""


def test_a_run_goes_to_the_child_once_and_is_read_back_after(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    done = tmp_path / "run" / "bench.json"
    spec = {"n": 21, "calls": str(tmp_path / "calls")}
    assert cj.run_child(str(script), spec, done, "job") == {"doubled": 42}  # the last line, not the noise
    assert json.loads(done.read_text()) == {"doubled": 42}
    assert cj.run_child(str(script), spec, done, "job") == {"doubled": 42}
    assert (tmp_path / "calls").read_text() == "x"  # the second call read bench.json; no second child
    assert not list(done.parent.glob("*.tmp"))


def test_a_failed_child_stops_with_its_label_and_leaves_no_bench_json(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    done = tmp_path / "run" / "bench.json"
    with pytest.raises(SystemExit, match=r"ee_world \(seed 1\) failed \(exit 3\)"):
        cj.run_child(str(script), {"n": 1, "calls": str(tmp_path / "calls"), "fail": True}, done, "ee_world (seed 1)")
    assert not done.exists()


def test_measured_returns_the_result_and_a_peak_rss_at_least_what_it_allocated():
    result, cost = cj.measured(lambda: len(bytearray(64 << 20)))
    assert result == 64 << 20
    assert cost["peak_rss_mb"] >= 64 and cost["seconds"] >= 0
