"""TextArena plug-in: real one-player games of the real package through the gym adapter."""

from __future__ import annotations

import re
import sys

import pytest

from trajtune.envs import make_env
from trajtune.envs.runner import run_episode
from trajtune.errors import EnvError
from trajtune.plugins.textarena_env import TextArenaEnv, TextArenaNotInstalledError, new_text
from trajtune.schema import Message, ToolCall


def _say(text: str) -> Message:
    return Message(role="assistant", content=text)


def _target(env: TextArenaEnv) -> int:
    """The hidden number, read from the running TextArena game (the test peeks; the agent cannot)."""
    return int(env.gym.env.state.game_state["game_number"])


def test_the_task_seed_is_the_games_seed_and_the_expert_wins_by_binary_search():
    env = make_env("textarena", game="GuessTheNumber-v0")
    tasks = env.tasks("test", 6, seed=2)
    assert {t.seed % 2 for t in tasks} == {1}
    targets = []
    for t in tasks:
        traj = env.expert(t)
        targets.append(_target(env))
        assert traj.outcome.success and traj.reward == 1.0, t.id
        guesses = [int(re.fullmatch(r"\[(\d+)\]", m.text()).group(1)) for m in traj.messages if m.role == "assistant"]
        assert guesses[-1] == targets[-1] and len(guesses) <= 5  # binary search on 1-20: at most 5 guesses
    again = make_env("textarena", game="GuessTheNumber-v0")
    for t, want in zip(tasks, targets):
        again.reset(t)
        assert _target(again) == want  # the same seed, the same hidden number
    assert len(set(targets)) > 1


def test_observations_are_the_new_game_text_without_the_echo_of_the_move():
    env = TextArenaEnv(game="GuessTheNumber-v0")
    task = env.tasks("train", 1, seed=5)[0]
    res = env.reset(task)
    assert [m.role for m in res.messages] == ["system", "user"] and res.tools == []
    assert "between 1 and 20" in res.messages[1].text()
    target = _target(env)
    low = 1 if target > 1 else 2
    out = env.step(_say(f"I think it is [{low}]"))
    assert not out.done and out.reward == 0.0
    text = out.observations[0].text()
    assert "[Player]" not in text and ("higher" if target > low else "lower") in text.lower()
    assert "You are playing" not in text  # the rules are not shown again
    out = env.step(_say(f"[{target}]"))
    assert out.done and out.reward == 1.0 and env.success() and out.info["success"] is True
    assert "correct" in out.info["reason"].lower()


def test_rejected_moves_are_the_games_rule_and_end_as_a_counted_loss():
    env = TextArenaEnv(game="GuessTheNumber-v0")
    env.reset(env.tasks("test", 1)[0])
    out = env.step(Message(role="assistant", tool_calls=[ToolCall(id="c0", name="guess", arguments={"n": 3})]))
    assert not out.done and "no tools" in out.observations[0].text()
    steps = [env.step(_say("no idea")) for _ in range(5)]
    ended = [s for s in steps if s.done]
    assert ended, "the game's error allowance ends the game"
    last = ended[0]
    assert last.reward == 0.0 and not env.success()
    assert last.info["invalid_move"] is True and "invalid" in last.info["reason"].lower()


def test_an_episode_through_the_runner_records_the_games_verdict():
    env = TextArenaEnv(game="TowerOfHanoi-v0", max_turns=3)
    task = env.tasks("test", 1)[0]
    traj = run_episode(env, task, lambda messages, tools: _say("[A C]"))
    assert traj.outcome.termination in ("max_turns", "done") and not traj.outcome.success
    assert sum(m.role == "assistant" for m in traj.messages) <= 3


@pytest.mark.parametrize(("options", "says"), [
    ({"game": "TicTacToe-v0"}, "not a one-player game"),
    ({"game": "GuessTheNumbr-v0"}, "not registered"),
    ({"max_turns": 0}, "option max_turns"),
    ({"gmae": "GuessTheNumber-v0"}, "option gmae"),
])
def test_bad_options_are_one_clear_error(options, says):
    with pytest.raises(EnvError, match="textarena") as e:
        env = make_env("textarena", **options)
        env.reset(env.tasks("test", 1)[0])
    assert says in str(e.value)


def test_two_player_refusal_says_self_play_is_missing():
    env = TextArenaEnv(game="TicTacToe-v0")
    with pytest.raises(EnvError, match="self-play"):
        env.reset(env.tasks("test", 1)[0])


def test_games_without_an_expert_say_so():
    env = TextArenaEnv(game="TowerOfHanoi-v0")
    with pytest.raises(NotImplementedError, match="GuessTheNumber"):
        env.expert(env.tasks("train", 1)[0])


def test_new_text_keeps_only_the_unseen_part():
    seen = "[GAME] rules\n"
    log = seen + "[Player] [5]\n[GAME] The target number is higher.\n"
    assert new_text(seen, log) == "[GAME] The target number is higher."
    assert new_text("something else", "[GAME] fresh") == "[GAME] fresh"  # a log that restarted: all of it


def test_missing_package_names_the_install_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "textarena", None)
    with pytest.raises(TextArenaNotInstalledError, match=r"pip install 'trajtune\[textarena\]'"):
        TextArenaEnv()


def test_a_game_that_needs_an_nltk_corpus_offline_names_the_resource(monkeypatch):
    import textarena

    def make(game):  # what a word game does offline: NLTK cannot find (or fetch) its corpus
        raise LookupError("\n****\n  Resource 'words' not found.\n  Please use the NLTK Downloader\n****")

    monkeypatch.setattr(textarena, "make", make)
    with pytest.raises(EnvError, match=r"NLTK resource 'words' \(python -m nltk.downloader words"):
        TextArenaEnv(game="Wordle-v0")
