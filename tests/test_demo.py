"""``trajtune demo``: the run directory it promises, and how it picks the under-trained checkpoint."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from typer.testing import CliRunner

from trajtune import demo as demo_mod
from trajtune.cli.main import app
from trajtune.errors import RunDirError

runner = CliRunner()


def _fake_ckpts(root: Path, steps: list[int]) -> None:
    for s in steps:
        (root / f"step-{s:06d}").mkdir(parents=True)


def test_weak_checkpoint_is_the_newest_that_still_fails_the_probe(tmp_path, monkeypatch):
    _fake_ckpts(tmp_path, [10, 20, 30, 40, 50])
    success = {50: 1.0, 40: 0.95, 30: 0.5, 20: 0.2, 10: 0.0}
    seen: list[int] = []

    def fake_evaluate(model_dir, p, tasks, label, seed):
        step = int(Path(model_dir).name.split("-")[1])
        seen.append(step)
        assert all(t.split == "train" for t in tasks) and len(tasks) == p["weak_probe_tasks"]
        return {"success": success[step]}, []

    monkeypatch.setattr(demo_mod, "_evaluate", fake_evaluate)
    p = {**demo_mod.DEFAULTS, "weak_probe_tasks": 6, "weak_max_success": 0.9}
    chosen, probed = demo_mod.select_weak_checkpoint(tmp_path, p, seed=0)
    assert chosen.name == "step-000030"
    assert seen == [50, 40, 30]  # newest first, and it stops at the first failing one
    assert probed == {50: 1.0, 40: 0.95, 30: 0.5}

    # Every kept checkpoint already solves the probe: the oldest is the least trained one left.
    success.update({30: 0.99, 20: 0.97, 10: 0.91})
    chosen, probed = demo_mod.select_weak_checkpoint(tmp_path, p, seed=0)
    assert chosen.name == "step-000010" and len(probed) == 5


def test_demo_writes_the_promised_run_directory(tmp_path):
    out = tmp_path / "demo"
    small = ["n_train=48", "n_test=6", "sft_steps=12", "weak_save_every=4", "weak_keep=3", "weak_probe_tasks=4",
             "rl_steps=2", "rl_steps_full=1", "rl_warmup=0", "tasks_per_step=2", "group_size=2", "preset=nano", "vocab_size=400",
             "batch_size=4", "max_new_tokens=24"]
    args = ["demo", "--out", str(out)] + [a for kv in small for a in ("--set", kv)]
    r = runner.invoke(app, args, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    s = json.loads((out / "summary.json").read_text())
    for k in ("success_before_sft", "success_after_sft", "success_after_rl", "success_weak_sft",
              "success_weak_after_rl"):
        assert 0.0 <= s[k] <= 1.0, k
    assert s["wall_seconds"] > 0 and s["settings"]["n_test"] == 6
    # The under-trained checkpoint came from the search, and only it is left of the candidates.
    probed = {int(k): v for k, v in s["weak_probe_train_success"].items()}
    assert list(probed) == sorted(probed, reverse=True) and set(probed) <= {4, 8}
    assert s["weak_sft_step"] == min(probed)
    assert all(v >= 0.9 for k, v in probed.items() if k != s["weak_sft_step"])
    left = sorted(c.name for c in (out / "sft" / "checkpoints").iterdir())
    assert left == [f"step-{s['weak_sft_step']:06d}"]
    # Each stage's held-out episodes are recorded and match the reported success.
    for name, key in [("base", "success_before_sft"), ("sft", "success_after_sft"), ("rl", "success_after_rl"),
                      ("sft-weak", "success_weak_sft"), ("rl-weak", "success_weak_after_rl")]:
        doc = json.loads((out / "eval" / f"{name}.json").read_text())
        assert len(doc["episodes"]) == 6
        assert sum(e["outcome"]["success"] for e in doc["episodes"]) / 6 == s[key]
    for png in ("sft_loss.png", "rl_reward.png", "rl_weak_reward.png", "success.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    assert "n_train: 48" in (out / "demo_config.yaml").read_text()
    # Saved models are readable like any other output (umask applied, not mkstemp's 0600).
    umask = os.umask(0)
    os.umask(umask)
    for f in (out / "base-model" / "model.safetensors", out / "sft" / "final" / "model.safetensors",
              out / "summary.json"):
        assert stat.S_IMODE(f.stat().st_mode) == 0o666 & ~umask, f

    # An existing run directory is never overwritten without --overwrite; nothing in it changes.
    before = (out / "summary.json").read_bytes()
    r = runner.invoke(app, ["demo", "--out", str(out), "--set", "n_train=4"])
    assert r.exit_code == RunDirError.exit_code and "--overwrite" in r.output and "make demo-again" in r.output
    assert (out / "summary.json").read_bytes() == before


def test_demo_rejects_unknown_settings(tmp_path):
    r = runner.invoke(app, ["demo", "--out", str(tmp_path / "d"), "--set", "rl_learning_rate=1"])
    assert r.exit_code == 2 and "rl_learning_rate" in r.output and "rl_lr" in r.output
    assert not (tmp_path / "d").exists()
