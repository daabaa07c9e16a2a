"""rl.curriculum: tasks bucketed by data['difficulty'], the next level added once the current one is
solved often enough; the level history is part of the checkpoint, so resume is exact."""

from __future__ import annotations

import json
import shutil

import pytest

from trajtune.algorithms.curriculum import Curriculum, CurriculumSpec
from trajtune.envs.base import Task
from trajtune.errors import ConfigError
from trajtune.rollout import Episode
from trajtune.schema import Outcome, Trajectory
from trajtune.tokens import TokenTrajectory


def _tasks(n: int = 9) -> list[Task]:
    return [Task(id=f"t{i}", seed=i, data={"difficulty": i % 3}) for i in range(n)]


def _ep(task: Task, ok: bool) -> Episode:
    tt = TokenTrajectory(ids=[1], source=[0], turn=[0], weight=[0.0])
    return Episode(trajectory=Trajectory(id=task.id, outcome=Outcome(success=ok)), tokens=tt, task=task)


def test_promotion_counts_only_the_current_level():
    tasks = _tasks()
    c = Curriculum(CurriculumSpec(promote_at=0.5, min_episodes=4), tasks)
    assert {t.data["difficulty"] for t in c.pool()} == {0}
    assert [t.id for t in c.pick(0, 0, 2, seed=0)] == ["t0", "t3"] and [t.id for t in c.pick(1, 0, 2, 0)] == ["t6", "t0"]
    lvl0, lvl1 = tasks[0], tasks[1]
    m = c.observe([_ep(lvl0, True), _ep(lvl0, True), _ep(lvl0, False), _ep(lvl1, False)])
    assert m == {"curriculum_level": 0.0, "curriculum_success": pytest.approx(2 / 3), "curriculum_promoted": 0.0}
    m = c.observe([_ep(lvl0, False), _ep(lvl0, True)])  # 5 seen, 3 solved: 0.6 ≥ 0.5
    assert m["curriculum_level"] == 1.0 and m["curriculum_promoted"] == 1.0
    assert {t.data["difficulty"] for t in c.pool()} == {0, 1} and c.state_dict() == {"level": 1, "seen": 0, "solved": 0}
    c.load_state_dict({"level": 2, "seen": 3, "solved": 3})
    m = c.observe([_ep(tasks[2], True)] * 5)  # the last level: nothing to promote to
    assert m["curriculum_level"] == 2.0 and m["curriculum_promoted"] == 0.0


def test_tasks_without_levels_are_refused():
    with pytest.raises(ConfigError, match="no numeric data\\['difficulty'\\]"):
        Curriculum(CurriculumSpec(), [Task(id="x", seed=0)])
    with pytest.raises(ConfigError, match="at least two levels"):
        Curriculum(CurriculumSpec(), [Task(id="x", seed=0, data={"difficulty": 1})] * 3)


def test_an_rl_run_climbs_the_levels_and_resumes_exactly(tmp_path, tiny_dir, monkeypatch):
    import trajtune.experience as experience
    from trajtune.algorithms.rl import RLRunConfig
    from trajtune.config import load_config
    from trajtune.train import run

    real = experience.run_rollouts

    def solved(*args, **kwargs):  # the untrained tiny model rarely ends a turn: call every episode solved
        eps = real(*args, **kwargs)
        for e in eps:
            e.trajectory.outcome.success = True
        return eps

    monkeypatch.setattr(experience, "run_rollouts", solved)

    def cfg(out):
        return load_config(None, RLRunConfig, [
            f"model={tiny_dir}", f"output_dir={out}", "env=envfixtures:LevelsEnv", "rl.n_train_tasks=9",
            "rl.curriculum={promote_at: 0.5, min_episodes: 2}", "rl.tasks_per_step=1", "rl.group_size=2",
            "rollout.max_turns=1", "rollout.max_new_tokens=4", "train.steps=4", "train.save_every=1",
            "train.keep_last=5", "report=false"])

    run(cfg(tmp_path / "full"), quiet=True)
    logs = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    # step 1 draws pool[0] (level 0) and promotes; step 2 pool {0, 1}[1] = level 1, promotes; then all levels
    assert [m["curriculum_level"] for m in logs] == [1.0, 2.0, 2.0, 2.0]
    eps = [json.loads(x) for x in (tmp_path / "full" / "rollouts.jsonl").read_text().splitlines()]
    assert [e["id"] for e in eps][::2] == ["levels-train-0", "levels-train-1", "levels-train-2", "levels-train-3"]
    run(cfg(tmp_path / "killed"), quiet=True, stop_after=2)
    shutil.rmtree(tmp_path / "killed" / "checkpoints" / "step-000002")
    run(cfg(tmp_path / "killed"), quiet=True, resume=True)
    assert (tmp_path / "killed" / "rollouts.jsonl").read_text() == (tmp_path / "full" / "rollouts.jsonl").read_text()
    with pytest.raises(ConfigError, match="async_rollouts"):
        load_config(None, RLRunConfig, [f"model={tiny_dir}", "output_dir=o", "env=home", "rl.curriculum={}",
                                        "rl.async_rollouts=true"])
