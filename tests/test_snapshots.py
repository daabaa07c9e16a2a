"""Environment.snapshot() / restore(): a state can be returned to without replaying actions, so
MC-Critic works on environments that are not deterministic."""

from __future__ import annotations

import json
import re

import pytest

from trajtune.envs import make_env
from trajtune.schema import Message, ToolCall


def _call(name: str, **args) -> Message:
    return Message(role="assistant", tool_calls=[ToolCall(id=f"c{name}", name=name, arguments=args)])


@pytest.mark.parametrize("name", ["memory", "trip", "home", "workspace"])
def test_snapshot_restore_round_trip(name):
    env = make_env(name)
    task = env.tasks("train", 1, seed=0)[0]
    env.reset(task)
    expert = make_env(name).expert(task)
    actions = [m for m in expert.messages if m.role == "assistant"]
    env.step(actions[0])
    snap = env.snapshot()
    first = env.render()
    for a in actions[1:]:
        env.step(a)
    assert repr(env.snapshot()) != repr(snap)  # the later steps changed the state (at least the turn count)
    fresh = make_env(name)
    fresh.restore(snap)
    assert fresh.render() == first and repr(fresh.snapshot()) == repr(snap)  # the same state, in a new instance
    if len(actions) > 1:  # and it goes on from there as the original did
        a = fresh.step(actions[1])
        b = make_env(name)
        b.restore(snap)
        assert [o.text() for o in b.step(actions[1]).observations] == [o.text() for o in a.observations]
    env.restore(snap)
    assert env.render() == first and repr(env.snapshot()) == repr(snap)


def test_environments_without_snapshots_say_so():
    from envfixtures import LevelsEnv

    env = LevelsEnv()
    assert not env.can_snapshot() and make_env("memory").can_snapshot()
    with pytest.raises(NotImplementedError, match="cannot take snapshots"):
        env.snapshot()


def _bumper(tok, renderer):
    text = '<tool_call>\n{"name": "bump", "arguments": {}}\n</tool_call>'
    ids = tok.encode(text, add_special_tokens=False) + [renderer.stop_ids()[0]]

    class Bump:  # a sampler that calls bump() every turn
        def turn(self, rows, room, seed):
            return [(list(ids), [0.0] * len(ids), True, None) for _ in rows]

    return Bump()


def test_rollouts_keep_a_snapshot_before_each_turn_and_restore_from_it(tiny_model, tiny_tok):
    from envfixtures import Drift

    from trajtune.chat.render import ChatRenderer
    from trajtune.rollout import RolloutConfig, StartState, run_rollouts

    renderer = ChatRenderer(tiny_tok)
    sampler = _bumper(tiny_tok, renderer)
    cfg = RolloutConfig(max_turns=3, snapshots=True)
    ep = run_rollouts(tiny_model, tiny_tok, Drift, Drift().tasks("train", 1), cfg, renderer=renderer,
                      sampler=sampler)[0]
    assert ep.turns == 3 and len(ep.snapshots) == 3
    seen = [float(re.search(r"total ([\d.]+)", m.text()).group(1)) for m in ep.trajectory.messages if m.role == "tool"]
    assert [s["total"] for s, _ in ep.snapshots] == pytest.approx([0.0] + seen[:2], abs=1e-6)
    # an episode from the state before turn 2: restored, not replayed (replaying would draw new amounts)
    prefix = ep.trajectory.messages[:ep.trajectory.messages.index(
        [m for m in ep.trajectory.messages if m.role == "assistant"][2])]
    before = Drift.restores
    again = run_rollouts(tiny_model, tiny_tok, Drift, Drift().tasks("train", 1), RolloutConfig(max_turns=1),
                         renderer=renderer, sampler=sampler,
                         prefixes=[StartState(ep.snapshots[2][0], prefix, ep.snapshots[2][1])])[0]
    assert Drift.restores == before + 1 and again.turns == 1
    new = float(re.search(r"total ([\d.]+)", again.trajectory.messages[-1].text()).group(1))
    assert new > seen[1]  # it went on from the restored total
    assert again.tokens.meta["turn_rewards"] == [0.0]  # only its own turn


def test_mc_critic_on_an_environment_that_is_not_deterministic(tmp_path, tiny_dir):
    from envfixtures import Drift

    from trajtune.algorithms.rl import RLRunConfig
    from trajtune.config import load_config
    from trajtune.errors import ConfigError
    from trajtune.train import run

    base = [f"model={tiny_dir}", "env=envfixtures:Drift", "rl.credit=mc_critic", "rl.mc_critic={samples: 2}",
            "rollout.max_turns=2", "rollout.max_new_tokens=8", "rl.tasks_per_step=1", "rl.group_size=2",
            "train.steps=1", "report=false"]
    before = Drift.restores
    run(load_config(None, RLRunConfig, base + [f"output_dir={tmp_path / 'rl'}"]), quiet=True)
    row = json.loads((tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["mc_rollouts"] >= 4 and Drift.restores - before == row["mc_rollouts"]  # every one restored
    with pytest.raises(ConfigError, match="Ray rollout workers"):
        run(load_config(None, RLRunConfig, base + [f"output_dir={tmp_path / 'r'}", "rollout.ray={num_workers: 1}"]),
            quiet=True)
