"""TextWorld adapter: real games from TextWorld's generator, plus the adapter's logic against a
duck-typed fake game (fast, and independent of the engine)."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from trajtune.plugins.textworld import (
    TOOLS,
    RealTextWorld,
    TextWorldEnv,
    TextWorldNotInstalledError,
    clean_feedback,
)
from trajtune.schema import Message, ToolCall


def _cmd(name, i=0, **args):
    return Message(role="assistant", tool_calls=[ToolCall(id=f"c{i}", name=name, arguments=args)])


# --------------------------------------------------------------------------------------------
# real TextWorld


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    env = TextWorldEnv(nb_rooms=3, nb_objects=5, quest_length=4, game_dir=tmp_path_factory.mktemp("games"))
    task = env.tasks("test", 1, seed=0)[0]
    yield env, task
    env.close()


def test_walkthrough_reaches_max_score(real):
    env, task = real
    traj = env.expert(task)
    assert env.max_score > 0
    assert traj.outcome.success and env.won
    assert env.score == env.max_score == traj.reward
    calls = [c for m in traj.messages for c in (m.tool_calls or [])]
    assert len(calls) >= 1 and all(c.name == "command" for c in calls)
    # Tool results are the game's feedback with the status line removed.
    assert all(m.text() and ">" not in m.text().splitlines()[-1] for m in traj.messages if m.role == "tool")


def test_rewards_add_up_to_the_score(real):
    env, task = real
    env.reset(task)
    walkthrough = list(env.state["policy_commands"])
    total = 0.0
    res = None
    for i, c in enumerate(walkthrough):
        res = env.step(_cmd("command", i, command=c))
        total += res.reward
    assert res.done and res.info["success"] and total == env.max_score


def test_random_policy_does_not_reach_max_score(real):
    env, task = real
    for seed in range(3):
        reset = env.reset(task)
        assert [t.name for t in reset.tools] == ["look", "inventory", "command"]
        assert reset.messages[1].text()  # the objective and the first room
        rng = random.Random(seed)
        for i in range(8):
            res = env.step(_cmd("command", i, command=rng.choice(env.admissible_commands())))
            if res.done:
                break
        assert not env.success() and env.score < env.max_score


def test_look_and_inventory_tools(real):
    env, task = real
    env.reset(task)
    look = env.step(_cmd("look"))
    assert look.observations[0].tool_call_id == "c0" and "-=" in look.observations[0].text()
    inv = env.step(_cmd("inventory", 1))
    assert "carrying" in inv.observations[0].text().lower()
    assert env.step(_cmd("look", 2, extra="x")).observations[0].text() == "error: look takes no arguments"


def test_games_are_cached_by_seed(real):
    env, task = real
    path = env.game_path(task)
    mtime = path.stat().st_mtime_ns
    assert env.game_path(task) == path and path.stat().st_mtime_ns == mtime
    assert path.with_suffix(".json").is_file()  # the metadata TextWorld reads for the walkthrough


# --------------------------------------------------------------------------------------------
# adapter logic against a fake game


class FakeGame:
    """A three-step game: 'take key', 'open door', 'go north' (1 point each)."""

    PLAN = ["take key", "open door", "go north"]

    def __init__(self):
        self.done_steps = 0
        self.closed = False

    def _state(self, feedback):
        return {"feedback": feedback + "\n\n>  -= Hall =-%d/3" % self.done_steps, "score": self.done_steps,
                "max_score": 3, "won": self.done_steps == 3, "lost": False, "objective": "Leave the hall.",
                "description": "-= Hall =-\nA hall.", "policy_commands": self.PLAN[self.done_steps:],
                "admissible_commands": ["look", "inventory", *self.PLAN]}

    def reset(self):
        self.done_steps = 0
        return self._state("Welcome!")

    def step(self, command):
        if self.done_steps < 3 and command == self.PLAN[self.done_steps]:
            self.done_steps += 1
            return self._state(f"You {command}."), self.done_steps, self.done_steps == 3
        return self._state("Nothing happens."), self.done_steps, False

    def close(self):
        self.closed = True


class FakeBackend:
    version = "fake-1"

    def __init__(self):
        self.made: list[int] = []
        self.games: list[FakeGame] = []

    def make_game(self, seed, nb_rooms, nb_objects, quest_length, path: Path) -> Path:
        self.made.append(seed)
        path.write_text(f"game {seed}")
        path.with_suffix(".json").write_text("{}")
        return path

    def start(self, path):
        self.games.append(FakeGame())
        return self.games[-1]


@pytest.fixture()
def fake(tmp_path):
    backend = FakeBackend()
    env = TextWorldEnv(backend=backend, game_dir=tmp_path, max_steps=5)
    return env, backend, env.tasks("train", 1, seed=3)[0]


def test_fake_expert_and_rewards(fake):
    env, backend, task = fake
    traj = env.expert(task)
    assert traj.outcome.success and traj.reward == 3.0
    assert [c.arguments["command"] for m in traj.messages for c in (m.tool_calls or [])] == FakeGame.PLAN
    assert traj.messages[1].text() == "Leave the hall.\n\n-= Hall =-\nA hall."
    assert traj.messages[3].text() == "You take key."  # status line stripped
    env.reset(task)
    assert backend.games[0].closed  # the previous game is closed on reset
    assert backend.made == [task.seed]  # generated once, then cached


def test_fake_episode_rules(fake):
    env, _, task = fake
    env.reset(task)
    res = env.step(_cmd("command", command="take key"))
    assert res.reward == 1.0 and not res.done
    res = env.step(_cmd("command", 1, command="dance"))
    assert res.reward == 0.0 and res.observations[0].text() == "Nothing happens."
    bad = env.step(Message(role="assistant", tool_calls=[
        ToolCall(id="a", name="command", arguments={"command": ""}),
        ToolCall(id="b", name="command", arguments={"command": "x\ny"}),
        ToolCall(id="c", name="fly", arguments={}),
        ToolCall(id="d", name="command", arguments=None, arguments_raw="{oops")]))
    assert [o.tool_call_id for o in bad.observations] == ["a", "b", "c", "d"]
    assert all(o.text().startswith("error:") for o in bad.observations)
    # Calls after the game ends in the same message are answered, not executed.
    res = env.step(Message(role="assistant", tool_calls=[
        ToolCall(id="e", name="command", arguments={"command": "open door"}),
        ToolCall(id="f", name="command", arguments={"command": "go north"}),
        ToolCall(id="g", name="look", arguments={})]))
    assert res.done and res.reward == 2.0 and env.success()
    assert res.observations[2].text() == "The game is over."


def test_fake_give_up_and_step_limit(fake):
    env, _, task = fake
    env.reset(task)
    res = env.step(Message(role="assistant", content="I give up."))
    assert res.done and res.info["gave_up"] and not env.success()
    env.reset(task)
    for i in range(5):
        res = env.step(_cmd("look", i))
    assert res.done and res.termination == "max_turns" and not env.success()


def test_task_splits_never_share_a_game(fake):
    env, _, _ = fake
    train = env.tasks("train", 50, seed=1)
    test = env.tasks("test", 50, seed=1)
    assert {t.seed % 2 for t in train} == {0} and {t.seed % 2 for t in test} == {1}
    assert [t.id for t in env.tasks("test", 50, seed=1)] == [t.id for t in test]
    with pytest.raises(ValueError, match="split must be"):
        env.tasks("dev", 1)


def test_clean_feedback():
    raw = "\nYou open the chest.\n\n\n\n>                      -= Attic =-1/4"
    assert clean_feedback(raw) == "You open the chest."
    assert [t.name for t in TOOLS] == ["look", "inventory", "command"]


def test_missing_textworld_names_the_install_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "textworld", None)  # makes `import textworld` fail
    with pytest.raises(TextWorldNotInstalledError, match=r"pip install 'trajtune\[textworld\]'"):
        RealTextWorld()
