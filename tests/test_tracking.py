"""tracking: [tensorboard, trackio, wandb]: each backend runs offline here, and the test reads back what
it wrote (metrics per step, the config, the final eval table) in the backend's own format."""

from __future__ import annotations

import json
import os
import sqlite3
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from trajtune.errors import ConfigError


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory, tiny_dir, home_experts) -> tuple[Path, Path, subprocess.CompletedProcess]:
    from trajtune.schema import write_trajectories

    tmp = tmp_path_factory.mktemp("tracking")
    data = tmp / "data.jsonl"
    write_trajectories(data, home_experts[:12])
    cfg = tmp / "sft.yaml"
    out = tmp / "run-tracked"
    cfg.write_text(f"algorithm: sft\nmodel: {tiny_dir}\noutput_dir: {out}\nseed: 0\n"
                   f"data: {{path: {data}, format: ir}}\neval: {{env: home, n_tasks: 2}}\n"
                   "train: {steps: 3, lr: 1.0e-3, batch_size: 2, schedule: constant}\n"
                   "tracking: [tensorboard, trackio, wandb]\nreport: false\n")
    trackio_dir = tmp / "trackio"
    env = {**os.environ, "TRACKIO_DIR": str(trackio_dir), "WANDB_MODE": "offline", "WANDB_SILENT": "true",
           "WANDB_DISABLE_GIT": "true", "WANDB_CACHE_DIR": str(tmp / "wandb-cache"),
           "WANDB_CONFIG_DIR": str(tmp / "wandb-config")}
    env.pop("WANDB_API_KEY", None)
    r = subprocess.run([sys.executable, "-m", "trajtune.cli", "train", "-c", str(cfg)], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return out, trackio_dir, r


def _metrics(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]


def test_tensorboard_holds_every_step_the_config_and_the_eval_table(tracked_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, _, _ = tracked_run
    acc = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    losses = {e.step: e.value for e in acc.Scalars("loss")}
    expected = {m["step"]: m["loss"] for m in _metrics(out) if "loss" in m}
    assert sorted(losses) == [1, 2, 3] and sorted(expected) == [1, 2, 3]
    assert all(abs(losses[s] - expected[s]) < 1e-5 for s in expected)
    result = json.loads((out / "result.json").read_text())
    success = float(result["eval"]["success"])
    assert [e.value for e in acc.Scalars("final_eval/success")] == pytest.approx([success])
    texts = {tag: acc.Tensors(tag)[0].tensor_proto.string_val[0].decode() for tag in acc.Tags()["tensors"]}
    config = next(v for k, v in texts.items() if k.startswith("config"))
    assert '"algorithm": "sft"' in config and "run-tracked" in config
    table = next(v for k, v in texts.items() if k.startswith("final_eval"))
    assert "| success |" in table


def test_trackio_database_holds_the_run(tracked_run):
    out, trackio_dir, _ = tracked_run
    db = trackio_dir / "trajtune.db"
    assert db.exists(), sorted(p.name for p in trackio_dir.iterdir())
    con = sqlite3.connect(db)
    rows = con.execute("SELECT run_name, step, metrics FROM metrics ORDER BY step").fetchall()
    con.close()
    assert {r[0] for r in rows} == {"run-tracked"}
    logged = {}
    for _, step, blob in rows:
        for k, v in json.loads(blob).items():
            logged.setdefault(k, {})[step] = v
    expected = {m["step"]: m["loss"] for m in _metrics(out) if "loss" in m}
    assert {s: pytest.approx(v, abs=1e-5) for s, v in expected.items()} == logged["loss"]
    table = logged["final_eval"][3]
    assert table["_type"] == "trackio.table"
    cells = {row["metric"]: row["value"] for row in table["_value"]}
    assert cells["success"] == pytest.approx(json.loads((out / "result.json").read_text())["eval"]["success"])


def _wandb_records(path: Path) -> list:
    """Read a W&B offline ``.wandb`` file: a LevelDB-style log (7-byte header, 32 KiB blocks, chunks of
    crc32c(4) length(2, little endian) type(1): 1 full, 2 first, 3 middle, 4 last)."""
    from wandb.proto import wandb_internal_pb2

    raw = path.read_bytes()
    assert raw[:4] == b":W&B"
    data, pos, block = raw[7:], 0, 32768
    records, pending = [], b""
    offset = 7
    while pos < len(data):
        room = block - ((pos + offset) % block)
        if room < 7:  # block trailer padding
            pos += room
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        pending += chunk
        if kind in (1, 4):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(pending)
            records.append(rec)
            pending = b""
    return records


def test_wandb_offline_run_holds_history_config_and_table(tracked_run):
    out, _, _ = tracked_run
    files = list((out / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1, list((out / "wandb").rglob("*"))
    records = _wandb_records(files[0])
    history: dict[int, dict] = {}
    config: dict[str, str] = {}
    for rec in records:
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item}
            history[int(row["_step"])] = row
        elif kind == "config":
            config.update({i.key: i.value_json for i in rec.config.update})
        elif kind == "run":
            config.update({i.key: i.value_json for i in rec.run.config.update})
            assert rec.run.display_name == "run-tracked"
    expected = {m["step"]: m["loss"] for m in _metrics(out) if "loss" in m}
    assert {s: history[s]["loss"] for s in expected} == pytest.approx(expected, abs=1e-5)
    assert json.loads(config["algorithm"]) == "sft"
    table = {k.split("/", 1)[1]: v for k, v in history[3].items() if k.startswith("final_eval/")}
    assert table["_type"] == "table-file" and table["ncols"] == 2
    stored = json.loads((files[0].parent / "files" / table["path"]).read_text())
    cells = dict(stored["data"])
    assert cells["success"] == pytest.approx(json.loads((out / "result.json").read_text())["eval"]["success"])


def test_stdout_stays_the_commands_own(tracked_run):
    _, _, r = tracked_run
    assert "wandb" not in r.stdout.lower() and "trackio" not in r.stdout.lower(), r.stdout


def test_a_missing_backend_is_a_one_line_error_naming_the_extra(monkeypatch, tmp_path, tiny_dir):
    import importlib.util

    from trajtune.config import load_config
    from trajtune.train import run
    from trajtune.algorithms.sft import SFTRunConfig

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    out = tmp_path / "never"
    cfg = load_config(None, SFTRunConfig, [f"model={tiny_dir}", f"output_dir={out}", "data.path=x.jsonl",
                                           "tracking=[wandb]"])
    with pytest.raises(ConfigError) as e:
        run(cfg, quiet=True)
    msg = str(e.value)
    assert "\n" not in msg and "wandb is not installed" in msg and "trajtune[tracking]" in msg
    assert not out.exists()  # refused before anything was written


def test_a_backend_listed_twice_or_unknown_is_refused(tiny_dir):
    from trajtune.algorithms.sft import SFTRunConfig
    from trajtune.config import load_config

    with pytest.raises(ConfigError, match="twice"):
        load_config(None, SFTRunConfig, [f"model={tiny_dir}", "output_dir=o", "data.path=x.jsonl",
                                         "tracking=[wandb, wandb]"])
    with pytest.raises(ConfigError, match="tensorboard"):
        load_config(None, SFTRunConfig, [f"model={tiny_dir}", "output_dir=o", "data.path=x.jsonl",
                                         "tracking=[mlflow]"])
