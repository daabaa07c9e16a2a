"""Data-parallel training with 2 CPU processes (gloo): the same weights as one process on the same
global batch, one writer, exact resume; a rank that dies stops the others with a clear error, and
the crashed run resumes (without half-written files) to the uninterrupted run's weights."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from wire_fixtures import launch_two

from trajtune.cli.main import app

runner = CliRunner()


def _torchrun(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "trajtune.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def _why(p: subprocess.CompletedProcess) -> str:
    """A failed launch's story: the lines that say what went wrong anywhere in stderr, then its tail."""
    keys = ("terminate", "Error", "error:", "abort", "Abort", "Exception", "Traceback")
    said = [ln for ln in p.stderr.splitlines() if any(k in ln for k in keys)][:40]
    return "\n".join(said) + "\n---\n" + p.stderr[-3000:]


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run / "final" / "model.safetensors"))


@pytest.fixture(scope="module")
def sft_two(tmp_path_factory, tiny_dir, home_experts) -> tuple[Path, Path, str]:
    """An SFT config and its uninterrupted 2-process run: (config, run dir, the launcher's stdout)."""
    from trajtune.schema import write_trajectories

    tmp_path = tmp_path_factory.mktemp("dist")
    data = tmp_path / "data.jsonl"
    write_trajectories(data, home_experts[:40])
    cfg = tmp_path / "sft.yaml"
    # 6 rows per step, micro-batches of 2: each rank gets 3 rows, so ranks run different micro-batches
    cfg.write_text(f"algorithm: sft\nmodel: {tiny_dir}\nseed: 0\ndata: {{path: {data}, format: ir}}\n"
                   "train: {steps: 4, lr: 1.0e-3, batch_size: 6, micro_batch_size: 2, schedule: constant, "
                   "save_every: 2}\n")
    p = _torchrun("train", "--config", str(cfg), "--set", f"output_dir={tmp_path / 'two'}", "-q")
    assert p.returncode == 0, _why(p)
    return cfg, tmp_path / "two", p.stdout


def test_two_processes_train_like_one_and_resume_exactly(tmp_path, tiny_dir, sft_two):
    cfg, two_dir, stdout = sft_two
    r = runner.invoke(app, ["train", "--config", str(cfg), "--set", f"output_dir={tmp_path / 'one'}", "-q"],
                      catch_exceptions=False)
    assert r.exit_code == 0, r.output
    shutil.copytree(two_dir, tmp_path / "two")
    assert stdout.count('"step": 4') == 1  # one result, from rank 0
    one, two = _weights(tmp_path / "one"), _weights(tmp_path / "two")
    start = load_file(str(Path(tiny_dir) / "model.safetensors"))
    assert any(not torch.equal(one[k], start[k]) for k in one)
    for k in one:
        torch.testing.assert_close(two[k], one[k], atol=2e-5, rtol=1e-4)
    rows = [[json.loads(x) for x in (tmp_path / d / "metrics.jsonl").read_text().splitlines()] for d in ("one", "two")]
    assert [r["step"] for r in rows[1]] == [1, 2, 3, 4]  # rank 0 alone logs
    for a, b in zip(*rows):
        assert abs(a["loss"] - b["loss"]) < 1e-5 and a["tokens"] == b["tokens"]

    # a 2-process run killed after step 3: its checkpoint (step 2), metrics up to step 3, no final model
    killed = tmp_path / "killed"
    shutil.copytree(tmp_path / "two", killed)
    shutil.rmtree(killed / "final")
    (killed / "result.json").unlink()
    lines = (killed / "metrics.jsonl").read_text().splitlines()
    (killed / "metrics.jsonl").write_text("\n".join(lines[:3]) + "\n")
    p = _torchrun("train", "--config", str(cfg), "--set", f"output_dir={killed}", "--resume", "-q")
    assert p.returncode == 0, _why(p)
    resumed = _weights(killed)
    assert all(torch.equal(resumed[k], two[k]) for k in two)
    assert [json.loads(x)["step"] for x in (killed / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]


def test_two_processes_share_the_rollouts_of_an_rl_step(tmp_path, tiny_dir):
    cfg = tmp_path / "rl.yaml"
    cfg.write_text(f"algorithm: rl\nmodel: {tiny_dir}\nenv: home\nseed: 0\noutput_dir: {tmp_path / 'rl'}\n"
                   "rollout: {max_turns: 2, max_new_tokens: 8, max_length: 1024, temperature: 1.0}\n"
                   "rl: {tasks_per_step: 3, group_size: 2, n_train_tasks: 16}\n"
                   "train: {steps: 2, lr: 1.0e-3, micro_batch_size: 2, schedule: constant}\n")
    p = _torchrun("train", "--config", str(cfg), "-q")
    assert p.returncode == 0, _why(p)
    assert p.stdout.count('"step": 2') == 1
    # 3 groups per step sampled by 2 ranks (groups 0, 2 and 1): rank 0 writes all of them, once, in group order
    rows = [json.loads(x) for x in (tmp_path / "rl" / "rollouts.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1] * 6 + [2] * 6
    ids = [r["id"] for r in rows[:6]]
    assert ids[0] == ids[1] and ids[2] == ids[3] and ids[4] == ids[5] and len(set(ids)) == 3
    metrics = [json.loads(x) for x in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]  # the weights stayed in sync (checked at the final save)


def test_a_crashed_rank_stops_the_other_clearly_and_the_run_resumes_without_half_written_files(tmp_path, sft_two):
    from trajtune.learner import interrupted_writes

    cfg, two_dir, _ = sft_two
    run = tmp_path / "crashed"
    # rank 1 dies (os._exit, test-only hook) as it starts step 3; the checkpoint of step 2 is complete
    procs = launch_two("train", "--config", str(cfg), "--set", f"output_dir={run}", "-q",
                        env={"TRAJTUNE_TEST_CRASH_RANK": "1", "TRAJTUNE_TEST_CRASH_STEP": "3",
                             "TRAJTUNE_DIST_TIMEOUT_S": "60"})
    outs = [p.communicate(timeout=300) for p in procs]  # a hang would fail here, not block the suite
    assert procs[1].returncode == 17, outs[1][1][-2000:]
    assert procs[0].returncode == 9, outs[0][1][-3000:]  # RankFailed, not a traceback
    err = [ln for ln in outs[0][1].splitlines() if ln.startswith("error:")]
    assert err == ["error: rank 1 lost at step 3; resume with the same command and --resume: the last checkpoint "
                   "is step 2 (seen by rank 0)"], outs[0][1][-3000:]
    assert "Traceback" not in outs[0][1]
    assert not (run / "final").exists() and [json.loads(x)["step"] for x in
                                             (run / "metrics.jsonl").read_text().splitlines()] == [1, 2]

    # what a crash in the middle of a write leaves (os._exit above struck between writes, so plant it):
    # a torn last line, an atomic write's temp file, a checkpoint's temp directory
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "loss": 0.4')
    (run / ".result.json.k2j3h4.tmp").write_text("{")
    (run / "checkpoints" / ".tmp-step-000004-4242").mkdir()
    (run / "checkpoints" / ".tmp-step-000004-4242" / "model.safetensors").write_bytes(b"half")
    assert len(interrupted_writes(run)) == 2

    p = _torchrun("train", "--config", str(cfg), "--set", f"output_dir={run}", "--resume", "-q")
    assert p.returncode == 0, _why(p)
    assert "dropped a torn last line" in p.stderr and "removed 2 temp file(s)" in p.stderr
    assert interrupted_writes(run) == [] and not list(run.rglob("*.tmp"))
    resumed, uninterrupted = _weights(run), _weights(two_dir)
    assert all(torch.equal(resumed[k], uninterrupted[k]) for k in uninterrupted)
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]


def test_a_torn_last_line_is_dropped_with_a_warning_and_corruption_before_it_is_refused(tmp_path):
    from trajtune.errors import DataError
    from trajtune.learner import truncate_step_log

    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n{"step": 4, "lo')
    warning = truncate_step_log(log, 2)
    assert warning is not None and "torn last line (line 4" in warning
    assert log.read_text() == '{"step": 1}\n{"step": 2}\n'
    assert truncate_step_log(log, 2) is None  # nothing torn: no warning
    log.write_text('{"step": 1}\n{"st\n{"step": 2}\n')
    with pytest.raises(DataError, match=r"metrics.jsonl:2: invalid JSON before the last line"):
        truncate_step_log(log, 2)


def test_leftovers_of_interrupted_atomic_writes_are_found_and_removed_and_nothing_else(tmp_path):
    from trajtune.learner import interrupted_writes, remove_interrupted_writes
    from trajtune.schema import atomic_write_text

    (tmp_path / "checkpoints" / "step-000002").mkdir(parents=True)
    (tmp_path / "checkpoints" / ".tmp-step-000004-77").mkdir()
    (tmp_path / "checkpoints" / ".tmp-step-000004-77" / "model.safetensors").write_bytes(b"x")
    (tmp_path / ".tmp-final-77").mkdir()
    (tmp_path / ".config.yaml.abc.tmp").write_text("")
    (tmp_path / ".reward.png.tmp.png").write_bytes(b"")
    keep = [tmp_path / "notes.tmp", tmp_path / "checkpoints" / "step-000002" / "model.safetensors",
            tmp_path / ".hidden"]
    for p in keep:
        p.write_text("mine")
    atomic_write_text(tmp_path / "ok.json", "{}")  # a finished atomic write leaves nothing behind
    assert [p.name for p in interrupted_writes(tmp_path)] == [".config.yaml.abc.tmp", ".reward.png.tmp.png",
                                                              ".tmp-final-77", ".tmp-step-000004-77"]
    assert len(remove_interrupted_writes(tmp_path)) == 4
    assert interrupted_writes(tmp_path) == [] and all(p.exists() for p in keep)


def test_the_collective_timeout_comes_from_the_environment(monkeypatch):
    from trajtune import distributed as dist
    from trajtune.errors import ConfigError

    monkeypatch.delenv(dist.TIMEOUT_ENV, raising=False)
    assert dist.timeout_s() == dist.DEFAULT_TIMEOUT_S
    monkeypatch.setenv(dist.TIMEOUT_ENV, "45")
    assert dist.timeout_s() == 45.0
    for bad in ("0", "-3", "soon"):
        monkeypatch.setenv(dist.TIMEOUT_ENV, bad)
        with pytest.raises(ConfigError, match=dist.TIMEOUT_ENV):
            dist.timeout_s()


def test_the_lost_rank_message_names_rank_step_and_checkpoint(monkeypatch):
    from trajtune import distributed as dist
    from trajtune.errors import EXIT_CODES, RankFailed

    monkeypatch.setenv("RANK", "0")
    msg = str(dist.describe_loss(RankFailed("x", [1]), 3, 2))
    assert msg == "rank 1 lost at step 3; resume with the same command and --resume: the last checkpoint is step 2 " \
                  "(seen by rank 0)"
    assert "no checkpoint yet" in str(dist.describe_loss(RankFailed("x"), 1, None))
    assert RankFailed.exit_code in EXIT_CODES


def test_configurations_several_processes_cannot_run_are_refused_before_anything_is_written(tmp_path, monkeypatch,
                                                                                           tiny_dir):
    from trajtune.algorithms.registry import load_run_config
    from trajtune.errors import ConfigError
    from trajtune.train import run

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    base = [f"model={tiny_dir}", "env=home", f"output_dir={tmp_path / 'r'}"]
    for extra, needle in ((["rollout.ray.num_workers=2"], "rollout.ray with 2 processes"),
                          (["rl.async_rollouts=true"], "rl.async_rollouts with 2 processes"),
                          (["rollout.server=http://127.0.0.1:9"], "rollout.server with 2 processes")):
        cfg = load_run_config(None, [*base, *extra], algorithm="rl")
        with pytest.raises(ConfigError, match=needle):
            run(cfg)
    assert not (tmp_path / "r").exists()
