"""Run directories through the CLI: resume with a changed config, finished runs, runs killed before their
first checkpoint, Ctrl-C, and the file modes of what a run writes."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import trajtune
from trajtune.cli.main import app
from trajtune.algorithms.sft import SFTRunConfig
from trajtune.config import load_config
from trajtune.envs import make_env
from trajtune.errors import Interrupted, RunDirError, UsageError
from trajtune.schema import write_trajectories
from trajtune.train import run_sft

runner = CliRunner()


def _invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    env = make_env("home")
    p = tmp_path_factory.mktemp("data") / "train.jsonl"
    write_trajectories(p, [env.expert(t) for t in env.tasks("train", 16, seed=3)])
    return p


def _cfg(tmp_path: Path, tiny_dir: Path, data: Path, out: Path, steps: int = 6, save_every: int = 2) -> Path:
    p = tmp_path / "sft.yaml"
    p.write_text(f"model: {tiny_dir}\noutput_dir: {out}\nseed: 0\n"
                 f"data: {{path: {data}, format: ir, max_length: 512}}\n"
                 f"train: {{steps: {steps}, lr: 1.0e-3, schedule: constant, batch_size: 4, micro_batch_size: 4, "
                 f"save_every: {save_every}}}\n")
    return p


def _killed_after(cfg_path: Path, n: int, drop_checkpoints: bool = False) -> Path:
    """A run stopped after ``n`` steps with a checkpoint of step ``n`` (``stop_after``), or, with
    ``drop_checkpoints``, as if killed before any checkpoint was written."""
    cfg = load_config(cfg_path, SFTRunConfig)
    run_sft(cfg, quiet=True, stop_after=n)
    out = Path(cfg.output_dir)
    if drop_checkpoints:
        import shutil

        shutil.rmtree(out / "checkpoints")
    return out


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_resume_refuses_a_changed_config_and_shows_the_diff(tmp_path, tiny_dir, data):
    cfg = _cfg(tmp_path, tiny_dir, data, tmp_path / "run")
    out = _killed_after(cfg, 3)
    before = (out / "metrics.jsonl").read_text(), (out / "config.yaml").read_text()
    r = _invoke("sft", "--config", cfg, "--resume", "--set", "train.lr=0.5", "--set", "train.steps=8", "-q")
    assert r.exit_code == RunDirError.exit_code, r.output
    assert "train.lr: 0.001 → 0.5" in r.output and "train.steps: 6 → 8" in r.output
    assert "--allow-config-change" in r.output and "Traceback" not in r.output
    assert ((out / "metrics.jsonl").read_text(), (out / "config.yaml").read_text()) == before
    assert not (out / "config_changes.jsonl").exists()
    # A config.yaml written before a key existed (here: train.weight_decay) is read with the key's default.
    stored = yaml.safe_load((out / "config.yaml").read_text())
    del stored["train"]["weight_decay"]
    (out / "config.yaml").write_text(yaml.safe_dump(stored))
    # output_dir is how the run is found: a moved run directory is still the same run.
    moved = tmp_path / "moved"
    out.rename(moved)
    r = _invoke("sft", "--config", cfg, "--set", f"output_dir={moved}", "--resume", "-q")
    assert r.exit_code == 0, r.output
    assert [m["step"] for m in _metrics(moved)] == [1, 2, 3, 4, 5, 6]


def test_an_allowed_config_change_applies_from_the_resumed_step_and_is_recorded(tmp_path, tiny_dir, data):
    cfg = _cfg(tmp_path, tiny_dir, data, tmp_path / "run")
    out = _killed_after(cfg, 3)  # the latest checkpoint is step 3
    r = _invoke("sft", "--config", cfg, "--resume", "--allow-config-change", "--set", "train.lr=0.5",
                "--set", "train.steps=8", "-q")
    assert r.exit_code == 0, r.output
    lrs = {m["step"]: m["lr"] for m in _metrics(out)}
    assert sorted(lrs) == list(range(1, 9))
    assert all(lrs[s] == pytest.approx(1e-3) for s in (1, 2, 3)) and all(lrs[s] == pytest.approx(0.5) for s in range(4, 9))
    changes = [json.loads(line) for line in (out / "config_changes.jsonl").read_text().splitlines()]
    assert len(changes) == 1 and changes[0]["step"] == 3
    assert changes[0]["changes"] == {"train.lr": {"old": 0.001, "new": 0.5}, "train.steps": {"old": 6, "new": 8}}
    stored = yaml.safe_load((out / "config.yaml").read_text())
    assert stored["train"]["lr"] == 0.5 and stored["train"]["steps"] == 8
    assert json.loads((out / "result.json").read_text())["step"] == 8


def test_allow_config_change_without_resume_is_a_usage_error(tmp_path, tiny_dir, data):
    r = _invoke("sft", "--config", _cfg(tmp_path, tiny_dir, data, tmp_path / "run"), "--allow-config-change")
    assert r.exit_code == UsageError.exit_code and "--resume" in r.output
    assert not (tmp_path / "run").exists()


def test_resuming_a_finished_run_does_not_train_again(tmp_path, tiny_dir, data):
    cfg = _cfg(tmp_path, tiny_dir, data, tmp_path / "run", steps=4)
    assert _invoke("sft", "--config", cfg, "-q").exit_code == 0
    out = tmp_path / "run"
    metrics = (out / "metrics.jsonl").read_bytes()
    weights = (out / "final" / "model.safetensors").read_bytes()
    mtime = (out / "final" / "model.safetensors").stat().st_mtime_ns
    r = _invoke("sft", "--config", cfg, "--resume")
    assert r.exit_code == 0, r.output
    assert "already finished at step 4" in r.output
    assert json.loads(r.stdout)["step"] == 4 and json.loads(r.stdout)["already_finished"] is True
    assert (out / "metrics.jsonl").read_bytes() == metrics
    assert (out / "final" / "model.safetensors").read_bytes() == weights
    assert (out / "final" / "model.safetensors").stat().st_mtime_ns == mtime
    # A finished run is not continued with a new schedule; the message says how to train further.
    r = _invoke("sft", "--config", cfg, "--resume", "--allow-config-change", "--set", "train.steps=6")
    assert r.exit_code == RunDirError.exit_code and "finished" in r.output and f"model={out / 'final'}" in r.output
    # Without --resume/--overwrite it says what the directory holds.
    r = _invoke("sft", "--config", cfg)
    assert r.exit_code == RunDirError.exit_code and "finished run (step 4)" in r.output


def test_a_run_killed_before_its_first_checkpoint_restarts_from_step_0_with_resume(tmp_path, tiny_dir, data):
    cfg = _cfg(tmp_path, tiny_dir, data, tmp_path / "run", steps=4, save_every=2)
    out = _killed_after(cfg, 1, drop_checkpoints=True)
    assert [m["step"] for m in _metrics(out)] == [1]
    r = _invoke("sft", "--config", cfg)
    assert r.exit_code == RunDirError.exit_code
    assert "before its first checkpoint" in r.output and "--resume" in r.output and "--overwrite" in r.output
    r = _invoke("sft", "--config", cfg, "--resume")
    assert r.exit_code == 0, r.output
    assert "starting again from step 0" in r.output
    assert [m["step"] for m in _metrics(out)] == [1, 2, 3, 4]  # the killed run's step-1 line is not doubled


def _subprocess_env() -> dict[str, str]:
    src = str(Path(trajtune.__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _interruptible() -> None:
    """In the child before exec: take SIGINT's default back. A test run started in the background by
    a non-interactive shell inherits SIGINT ignored, and Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt_when(proc: subprocess.Popen, ready, limit_s: float = 300) -> tuple[int, str]:
    """Send SIGINT once ``ready()`` holds; return the exit code and stderr."""
    deadline = time.monotonic() + limit_s
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"the command ended or stalled before it could be interrupted:\n{err[-3000:]}")
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=limit_s)
    return proc.returncode, err


def test_ctrl_c_during_sft_says_where_it_stopped_and_how_to_continue(tmp_path, tiny_dir, data):
    out = tmp_path / "run"
    cfg = _cfg(tmp_path, tiny_dir, data, out, steps=100000, save_every=2)
    proc = subprocess.Popen([sys.executable, "-m", "trajtune.cli.main", "sft", "--config", str(cfg), "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_subprocess_env(),
                            preexec_fn=_interruptible)
    metrics = out / "metrics.jsonl"
    rc, err = _interrupt_when(proc, lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 3)
    assert rc == Interrupted.exit_code == 130, err
    line = [ln for ln in err.splitlines() if ln.startswith("interrupted at step ")]
    assert len(line) == 1 and "Traceback" not in err, err
    step = int(line[0].split("interrupted at step ")[1].split(";")[0])
    assert step >= 3 and "continue with --resume" in line[0]
    assert "latest checkpoint is step" in line[0]


def test_ctrl_c_during_eval_says_how_many_episodes_are_stored(tmp_path, tiny_dir):
    out = tmp_path / "ev"
    cmd = [sys.executable, "-m", "trajtune.cli.main", "eval", "--model", str(tiny_dir), "--env", "home",
           "--tasks", "2000", "--batch-size", "2", "--max-turns", "2", "--max-new-tokens", "8", "--out", str(out), "-q"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_subprocess_env(),
                            preexec_fn=_interruptible)
    episodes = out / "episodes.jsonl"
    rc, err = _interrupt_when(proc, lambda: episodes.exists() and len(episodes.read_text().splitlines()) >= 2)
    assert rc == 130, err
    stored = len(episodes.read_text().splitlines())
    assert f"interrupted with {stored} of 2000 episodes stored in {out}; continue with --resume" in err


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_run_outputs_get_normal_permissions(tmp_path, tiny_dir, data):
    old = os.umask(0o022)
    try:
        out = tmp_path / "run"
        r = _invoke("sft", "--config", _cfg(tmp_path, tiny_dir, data, out, steps=3, save_every=2), "-q")
        assert r.exit_code == 0, r.output
        files = [out / "config.yaml", out / "result.json", out / "final" / "model.safetensors",
                 out / "final" / "config.json", out / "checkpoints" / "step-000002" / "model.safetensors",
                 out / "checkpoints" / "step-000002" / "trainer_state.pt"]
        for f in files:
            assert _mode(f) == 0o644, (f, oct(_mode(f)))
        for d in (out / "final", out / "checkpoints" / "step-000002"):
            assert _mode(d) == 0o755, (d, oct(_mode(d)))
        ev = tmp_path / "ev"
        r = _invoke("eval", "--model", out / "final", "--env", "home", "--tasks", 1, "--max-turns", 1,
                    "--max-new-tokens", 4, "--out", ev, "-q")
        assert r.exit_code == 0, r.output
        assert _mode(ev / "results.json") == 0o644 and _mode(ev / "run.json") == 0o644
        os.umask(0o027)  # a stricter umask is respected, not overridden
        r = _invoke("data", "generate", "--env", "home", "--n", 1, "-o", tmp_path / "g.jsonl")
        assert r.exit_code == 0 and _mode(tmp_path / "g.jsonl") == 0o640
    finally:
        os.umask(old)
