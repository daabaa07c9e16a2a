"""rl.async_rollouts: step k+1 is sampled in the background from the policy before step k's update."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from trajtune.algorithms.rl import RLRunConfig
from trajtune.config import ConfigError, load_config
from trajtune.train import run


def _cfg(tiny_dir, out, *extra):
    return load_config(None, RLRunConfig, [f"model={tiny_dir}", f"output_dir={out}", "env=home",
                                            "rollout.max_turns=2", "rollout.max_new_tokens=16",
                                            "rollout.max_length=512", "rl.tasks_per_step=2", "rl.group_size=4",
                                            "rl.n_train_tasks=8", "train.steps=3", "train.lr=3e-3",
                                            "train.save_every=1", "train.keep_last=5",
                                            # rewards by characters written, kept for cut turns (nearly
                                            # all of the untrained model's): they differ within a group
                                            "rl.reward={terms: {env: 1.0, 'envfixtures:reply_chars': -0.01}}",
                                            "rl.termination={length: keep}",
                                            *extra])


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _weights(out):
    return load_file(out / "final" / "model.safetensors")


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_async_rollouts_lag_one_step_deterministically_and_resume_exactly(tiny_dir, tmp_path):
    on = "rl.async_rollouts=true"
    run(_cfg(tiny_dir, tmp_path / "sync"), quiet=True)
    run(_cfg(tiny_dir, tmp_path / "a1", on), quiet=True)
    run(_cfg(tiny_dir, tmp_path / "a2", on), quiet=True)

    sync_eps, eps = _rows(tmp_path / "sync" / "rollouts.jsonl"), _rows(tmp_path / "a1" / "rollouts.jsonl")
    # which policy sampled each step's episodes: sync 0, 1, 2; one step ahead 0, 0, 1
    assert [e["metadata"]["policy_version"] for e in sync_eps] == [0] * 8 + [1] * 8 + [2] * 8
    assert [e["metadata"]["policy_version"] for e in eps] == [0] * 8 + [0] * 8 + [1] * 8
    assert eps[:8] == sync_eps[:8]  # step 1 is sampled in the foreground, from the same policy
    m = _rows(tmp_path / "a1" / "metrics.jsonl")
    assert [r["policy_lag"] for r in m] == [0.0, 1.0, 1.0]
    # the ratio to the sampling policy is 1 on fresh episodes and moves once they are a step old
    assert abs(m[0]["ratio"] - 1.0) < 1e-5
    assert abs(m[1]["ratio"] - 1.0) > 1e-4
    # thread timing never shows: two runs are identical
    assert (tmp_path / "a2" / "rollouts.jsonl").read_text() == (tmp_path / "a1" / "rollouts.jsonl").read_text()
    assert _same(_weights(tmp_path / "a1"), _weights(tmp_path / "a2"))
    assert not _same(_weights(tmp_path / "a1"), _weights(tmp_path / "sync"))

    # killed after step 2: its checkpoint holds step 3's experience (sampled by policy version 1), and the
    # resumed run ends exactly where the uninterrupted one did
    run(_cfg(tiny_dir, tmp_path / "k", on), quiet=True, stop_after=2)
    assert (tmp_path / "k" / "checkpoints" / "step-000002" / "source_state.pt").exists()
    assert [r["step"] for r in _rows(tmp_path / "k" / "rollouts.jsonl")] == [1] * 8 + [2] * 8
    run(_cfg(tiny_dir, tmp_path / "k", on), quiet=True, resume=True)
    assert (tmp_path / "k" / "rollouts.jsonl").read_text() == (tmp_path / "a1" / "rollouts.jsonl").read_text()
    assert _same(_weights(tmp_path / "k"), _weights(tmp_path / "a1"))


def test_async_rollouts_refuse_generate_fallback(tiny_dir, tmp_path):
    with pytest.raises(ConfigError, match="KV-cache sampler"):
        run(_cfg(tiny_dir, tmp_path / "x", "rl.async_rollouts=true", "rollout.reuse_kv_cache=false"), quiet=True)
