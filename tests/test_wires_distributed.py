"""Several processes: mining (rank 0 mines an iteration and writes it, the other ranks wait for the file;
every rank must take the same collectives whichever of them looks at the file first), and DualTune on
2 processes (torchrun, gloo on CPU) training every adapter as one process does."""

from __future__ import annotations

import pytest
import torch

from wire_fixtures import torchrun

from trajtune import distributed as dist
from trajtune.experience import IterativeSource


def _source(tmp_path, mined: list):
    def mine(it, model):
        mined.append(it)
        return [{"x": it}], {"records": 1.0}

    return IterativeSource(mine=mine, render=lambda recs: [[r] for r in recs], load=lambda s: {"x": 0},
                           dump=lambda r: '{"x": 0}', steps_per_iteration=2, batch_size=1, cache_dir=tmp_path)


def test_a_rank_that_finds_the_mined_file_already_written_still_meets_rank_0_at_its_barrier(tmp_path, monkeypatch):
    """Rank 1 arrives after rank 0 has mined and written iteration 0 (rank 0 was quicker to start): rank 0
    did not find the file, so it waits at one barrier for the others; rank 1 must take that barrier too
    (the 2-process RFT/DPO run hung here), and must not mine."""
    calls: list[str] = []
    monkeypatch.setattr(dist, "world_size", lambda: 2)
    monkeypatch.setattr(dist, "rank", lambda: 1)
    monkeypatch.setattr(dist, "is_main", lambda: False)
    monkeypatch.setattr(dist, "barrier", lambda: calls.append("barrier"))
    monkeypatch.setattr(dist, "all_gather", lambda obj: calls.append("all_gather") or [False, obj])  # rank 0: no file
    (tmp_path / "iter-000.jsonl").write_text('{"x": 0}\n')  # already there when rank 1 looks
    mined: list = []
    rows, metrics = _source(tmp_path, mined).batch(0, None)
    assert calls.count("barrier") == 1 and mined == [] and rows == [{"x": 0}]

    # a resumed run: rank 0 found the file too, so nobody waits and nobody mines
    calls.clear()
    monkeypatch.setattr(dist, "all_gather", lambda obj: calls.append("all_gather") or [True, obj])
    _source(tmp_path, mined).batch(0, None)
    assert "barrier" not in calls and mined == []


def test_rank_0_mines_a_missing_iteration_once_and_then_waits_for_the_others(tmp_path, monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(dist, "world_size", lambda: 2)
    monkeypatch.setattr(dist, "rank", lambda: 0)
    monkeypatch.setattr(dist, "is_main", lambda: True)
    monkeypatch.setattr(dist, "barrier", lambda: calls.append("barrier"))
    monkeypatch.setattr(dist, "all_gather", lambda obj: [obj, obj])
    mined: list = []
    _source(tmp_path, mined).batch(0, None)
    assert mined == [0] and calls == ["barrier"] and (tmp_path / "iter-000.jsonl").exists()


@pytest.mark.slow
def test_dualtune_on_two_processes_trains_every_adapter_like_one_process(tmp_path, tiny_dir, home_experts):
    from safetensors.torch import load_file
    from typer.testing import CliRunner

    from trajtune.cli.main import app
    from trajtune.schema import write_trajectories

    write_trajectories(tmp_path / "d.jsonl", home_experts[:8])
    cfg = tmp_path / "dt.yaml"
    cfg.write_text(f"algorithm: dualtune\nmodel: {{name_or_path: {tiny_dir}, lora: {{r: 4, alpha: 8}}}}\n"
                   f"data: {{path: {tmp_path / 'd.jsonl'}, max_length: 512}}\ndualtune: {{arguments: shared}}\n"
                   "train: {steps: 2, lr: 1.0e-2, batch_size: 4, micro_batch_size: 2, schedule: constant}\n"
                   "report: false\n")
    p = torchrun("train", "--config", str(cfg), "--set", f"output_dir={tmp_path / 'two'}", "-q")
    assert p.returncode == 0, p.stderr[-3000:]
    r = CliRunner().invoke(app, ["train", "--config", str(cfg), "--set", f"output_dir={tmp_path / 'one'}", "-q"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    for sub in ("", "arguments/"):  # the selector (default) and the shared argument adapter
        one = load_file(str(tmp_path / "one" / "final" / sub / "adapter_model.safetensors"))
        two = load_file(str(tmp_path / "two" / "final" / sub / "adapter_model.safetensors"))
        assert one.keys() == two.keys()
        assert any(float(v.abs().max()) > 0 for k, v in one.items() if "lora_B" in k)  # it trained
        for k in one:
            torch.testing.assert_close(two[k], one[k], atol=2e-5, rtol=1e-4)
