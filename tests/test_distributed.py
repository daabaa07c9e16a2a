"""Data-parallel training with 2 CPU processes (gloo): the same weights as one process on the same
global batch, one writer, and exact resume."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from trajtune.cli.main import app

runner = CliRunner()


def _torchrun(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "trajtune.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run / "final" / "model.safetensors"))


def test_two_processes_train_like_one_and_resume_exactly(tmp_path, tiny_dir, home_experts):
    from trajtune.schema import write_trajectories

    data = tmp_path / "data.jsonl"
    write_trajectories(data, home_experts[:40])
    cfg = tmp_path / "sft.yaml"
    # 6 rows per step, micro-batches of 2: each rank gets 3 rows, so ranks run different micro-batches
    cfg.write_text(f"algorithm: sft\nmodel: {tiny_dir}\nseed: 0\ndata: {{path: {data}, format: ir}}\n"
                   "train: {steps: 4, lr: 1.0e-3, batch_size: 6, micro_batch_size: 2, schedule: constant, "
                   "save_every: 2}\n")
    r = runner.invoke(app, ["train", "--config", str(cfg), "--set", f"output_dir={tmp_path / 'one'}", "-q"],
                      catch_exceptions=False)
    assert r.exit_code == 0, r.output
    p = _torchrun("train", "--config", str(cfg), "--set", f"output_dir={tmp_path / 'two'}", "-q")
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.count('"step": 4') == 1  # one result, from rank 0
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
    assert p.returncode == 0, p.stderr[-3000:]
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
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.count('"step": 2') == 1
    # 3 groups per step sampled by 2 ranks (groups 0, 2 and 1): rank 0 writes all of them, once, in group order
    rows = [json.loads(x) for x in (tmp_path / "rl" / "rollouts.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1] * 6 + [2] * 6
    ids = [r["id"] for r in rows[:6]]
    assert ids[0] == ids[1] and ids[2] == ids[3] and ids[4] == ids[5] and len(set(ids)) == 3
    metrics = [json.loads(x) for x in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]  # the weights stayed in sync (checked at the final save)
