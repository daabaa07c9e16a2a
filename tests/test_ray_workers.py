"""Rollout workers as Ray actors (rollout.ray), on a local Ray cluster started by these tests."""

from __future__ import annotations

import gc
import json
import time

import pytest
import ray  # the test extra installs it
import torch

from trajtune.envs import make_env
from trajtune.errors import EnvError, WorkerLost
from trajtune.rollout import RolloutConfig, run_rollouts

@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def _pool(**kw):
    from trajtune.envs.ray_workers import RayEnvPool

    return RayEnvPool("home", {}, num_workers=2, **kw)


def test_remote_episodes_equal_in_process_ones_and_workers_forget_them(cluster, tiny_model, tiny_tok):
    pool = _pool()
    tasks = make_env("home").tasks("test", 6, seed=3)
    cfg = RolloutConfig(max_turns=3, max_new_tokens=24, max_length=512, batch_size=4, temperature=1.0)
    local = run_rollouts(tiny_model, tiny_tok, lambda: make_env("home"), tasks, cfg, seed=5)
    remote = run_rollouts(tiny_model, tiny_tok, pool.factory, tasks, cfg, seed=5)
    assert [e.tokens.ids for e in remote] == [e.tokens.ids for e in local]
    assert [e.tokens.source for e in remote] == [e.tokens.source for e in local]
    assert [e.trajectory.reward for e in remote] == [e.trajectory.reward for e in local]
    assert [e.trajectory.outcome.success for e in remote] == [e.trajectory.outcome.success for e in local]
    assert [e.trajectory.messages for e in remote] == [e.trajectory.messages for e in local]
    # both workers held episodes, and a finished episode's state is dropped once its env is collected
    del remote
    gc.collect()
    deadline = time.monotonic() + 10
    while pool.live_envs() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pool.live_envs() == 0
    pool.shutdown()


def test_bad_environment_arguments_fail_when_the_pool_starts(cluster):
    with pytest.raises(EnvError, match="home"):
        _pool_with_kwargs({"no_such_argument": 1})


def _pool_with_kwargs(kwargs):
    from trajtune.envs.ray_workers import RayEnvPool

    return RayEnvPool("home", kwargs, num_workers=1)


def test_a_dead_worker_stops_the_step_with_a_clear_error(cluster):
    """A lost worker is not an environment error for the policy to see: the step runner raises."""
    from trajtune.rollout import default_step
    from trajtune.schema import Message

    pool = _pool()
    task = make_env("home").tasks("test", 1, seed=3)[0]
    envs = [pool.factory(), pool.factory()]  # one on each worker
    for e in envs:
        e.reset(task)
    act = Message(role="assistant", content="done")
    assert len(default_step(envs, [act, act], 5.0)) == 2  # both answer while the workers live
    ray.kill(pool.workers[1])
    with pytest.raises(WorkerLost) as err:
        default_step(envs, [act, act], 5.0)
    msg = str(err.value)
    assert "worker 1 of 2" in msg and "--resume" in msg and "stepping" in msg


def _rl_cfg(tiny_dir, out, *extra):
    from trajtune.algorithms.rl import RLRunConfig
    from trajtune.config import load_config

    return load_config(None, RLRunConfig, [f"model={tiny_dir}", f"output_dir={out}", "env=home",
                                            "rollout.max_turns=2", "rollout.max_new_tokens=16",
                                            "rollout.max_length=512", "rl.tasks_per_step=2", "rl.group_size=2",
                                            "rl.n_train_tasks=8", "train.steps=3", "train.lr=1e-3",
                                            "train.save_every=1", "train.keep_last=5",
                                            # the penalty on length gives rewards that differ within a group
                                            "rl.overlong={max_length: 36, cache: 32}", *extra])


def test_rl_on_ray_workers_equals_in_process_and_resumes_after_a_lost_worker(cluster, tiny_dir, tmp_path,
                                                                             monkeypatch):
    from safetensors.torch import load_file

    from trajtune.envs import ray_workers
    from trajtune.train import run

    on_ray = ("rollout.ray.num_workers=2",)
    run(_rl_cfg(tiny_dir, tmp_path / "local"), quiet=True)
    run(_rl_cfg(tiny_dir, tmp_path / "ray", *on_ray), quiet=True)
    local = (tmp_path / "local" / "rollouts.jsonl").read_text()
    assert (tmp_path / "ray" / "rollouts.jsonl").read_text() == local
    a = load_file(tmp_path / "local" / "final" / "model.safetensors")
    b = load_file(tmp_path / "ray" / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    # a worker dies while step 2's episodes start: the run stops with WorkerLost, step 1's checkpoint is whole
    made = {"n": 0}
    real_factory = ray_workers.RayEnvPool.factory

    def factory(self):
        made["n"] += 1
        if made["n"] == 5:  # the first environment of step 2 (a step is 2 tasks x 2 samples)
            ray.kill(self.workers[0])
        return real_factory(self)

    monkeypatch.setattr(ray_workers.RayEnvPool, "factory", factory)
    with pytest.raises(WorkerLost, match="resetting"):
        run(_rl_cfg(tiny_dir, tmp_path / "lost", *on_ray), quiet=True)
    ckpts = sorted(p.name for p in (tmp_path / "lost" / "checkpoints").iterdir())
    assert ckpts == ["step-000001"]
    assert {json.loads(line)["step"] for line in (tmp_path / "lost" / "rollouts.jsonl").read_text().splitlines()} == {1}
    monkeypatch.setattr(ray_workers.RayEnvPool, "factory", real_factory)
    run(_rl_cfg(tiny_dir, tmp_path / "lost", *on_ray), quiet=True, resume=True)
    assert (tmp_path / "lost" / "rollouts.jsonl").read_text() == local
    c = load_file(tmp_path / "lost" / "final" / "model.safetensors")
    assert all(torch.equal(a[k], c[k]) for k in a)


def test_rollout_ray_section_is_validated():
    from trajtune.algorithms.rl import RLRunConfig
    from trajtune.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="num_workrs"):
        load_config(None, RLRunConfig, ["model=x", "output_dir=o", "env=home", "rollout.ray.num_workrs=2"])
    cfg = load_config(None, RLRunConfig, ["model=x", "output_dir=o", "env=home", "rollout.ray.num_workers=3"])
    assert cfg.rollout.ray.num_workers == 3 and not hasattr(cfg.rollout.to_config(), "ray")
