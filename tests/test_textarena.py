"""TextArena plug-in: real one- and two-player games of the real package through the gym adapter."""

from __future__ import annotations

import re
import sys

import pytest
from turns import say

from trajtune.envs import make_env
from trajtune.envs.runner import run_episode
from trajtune.errors import EnvError
from trajtune.plugins.textarena_env import (
    TextArenaEnv,
    TextArenaNotInstalledError,
    available_moves,
    new_text,
    tictactoe_move,
)
from trajtune.schema import Message, ToolCall


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
    out = env.step(say(f"I think it is [{low}]"))
    assert not out.done and out.reward == 0.0
    text = out.observations[0].text()
    assert "[Player]" not in text and ("higher" if target > low else "lower") in text.lower()
    assert "You are playing" not in text  # the rules are not shown again
    out = env.step(say(f"[{target}]"))
    assert out.done and out.reward == 1.0 and env.success() and out.info["success"] is True
    assert "correct" in out.info["reason"].lower()


def test_rejected_moves_are_the_games_rule_and_end_as_a_counted_loss():
    env = TextArenaEnv(game="GuessTheNumber-v0")
    env.reset(env.tasks("test", 1)[0])
    out = env.step(Message(role="assistant", tool_calls=[ToolCall(id="c0", name="guess", arguments={"n": 3})]))
    assert not out.done and "no tools" in out.observations[0].text()
    steps = [env.step(say("no idea")) for _ in range(5)]
    ended = [s for s in steps if s.done]
    assert ended, "the game's error allowance ends the game"
    last = ended[0]
    assert last.reward == 0.0 and not env.success()
    assert last.info["invalid_move"] is True and "invalid" in last.info["reason"].lower()


def test_an_episode_through_the_runner_records_the_games_verdict():
    env = TextArenaEnv(game="TowerOfHanoi-v0", max_turns=3)
    task = env.tasks("test", 1)[0]
    traj = run_episode(env, task, lambda messages, tools: say("[A C]"))
    assert traj.outcome.termination in ("max_turns", "done") and not traj.outcome.success
    assert sum(m.role == "assistant" for m in traj.messages) <= 3


@pytest.mark.parametrize(("options", "says"), [
    ({"game": "TicTacToe-v0"}, "needs an opponent"),
    ({"game": "TicTacToe-v0", "seat": 2}, "option seat"),
    ({"game": "GuessTheNumbr-v0"}, "not registered"),
    ({"max_turns": 0}, "option max_turns"),
    ({"gmae": "GuessTheNumber-v0"}, "option gmae"),
])
def test_bad_options_are_one_clear_error(options, says):
    with pytest.raises(EnvError, match="textarena") as e:
        env = make_env("textarena", **options)
        env.reset(env.tasks("test", 1)[0])
    assert says in str(e.value)


def test_a_two_player_game_without_an_opponent_says_how_to_give_one():
    env = TextArenaEnv(game="TicTacToe-v0")
    with pytest.raises(EnvError, match="opponent=random"):
        env.reset(env.tasks("test", 1)[0])


def _board(text: str) -> dict[int, str]:
    """Cell -> mark of the last board drawn in ``text``."""
    rows = re.findall(r"^ (\S) \| (\S) \| (\S) $", text, re.M)[-3:]
    return {i: c for i, c in enumerate(x for r in rows for x in r)}


def test_tictactoe_against_a_random_opponent_alternates_seats_and_scores_the_agents_seat():
    env = make_env("textarena", game="TicTacToe-v0", opponent="random")
    first = lambda messages, tools: say(available_moves(messages[-1].text())[0])  # noqa: E731
    seats, results = [], []
    for task in env.tasks("test", 6):
        traj = run_episode(env, task, first)
        info = env.info
        seats.append(info["seat"])
        assert info["seat"] == (task.seed // 2) % 2 and info["opponent"] == "random"
        assert traj.outcome.termination == "done" and traj.reward == info["game_reward"]
        assert traj.outcome.success == (info["game_reward"] >= 1.0)
        results.append(info["game_reward"])
        # seat 1 moves second: the opponent has already played when the agent first looks
        opening = _board(traj.messages[1].text())
        marks = sum(c in "XO" for c in opening.values())
        assert marks == info["seat"]
    assert set(seats) == {0, 1} and set(results) <= {-1.0, 0.0, 1.0}
    # the same task, the same opponent moves (seeded by the task)
    task = env.tasks("test", 1)[0]
    run_episode(env, task, first)
    again = list(env.gym.opponent_moves)
    run_episode(env, task, first)
    assert env.gym.opponent_moves == again and again


def test_an_agent_that_always_plays_first_loses_to_nothing_against_itself():
    # both seats play the first available move: the seat-0 player takes 0, 1, 2 (top row) and wins
    env = make_env("textarena", game="TicTacToe-v0", opponent="first", seat=0)
    traj = run_episode(env, env.tasks("test", 1)[0], lambda m, t: say(available_moves(m[-1].text())[0]))
    assert traj.outcome.success and traj.reward == 1.0
    env = make_env("textarena", game="TicTacToe-v0", opponent="first", seat=1)
    traj = run_episode(env, env.tasks("test", 1)[0], lambda m, t: say(available_moves(m[-1].text())[0]))
    assert not traj.outcome.success and traj.reward == -1.0


def test_a_failing_opponent_is_an_env_error_and_a_listless_game_needs_a_model():
    from test_judge import FakeJudgeServer

    server = FakeJudgeServer([""])
    try:
        env = make_env("textarena", game="TicTacToe-v0", opponent=f"openai:{server.url}", seat=1)
        traj = run_episode(env, env.tasks("test", 1)[0], lambda m, t: say("[4]"))
        assert traj.outcome.termination == "env_error" and not traj.outcome.success
        assert "opponent openai:default answered nothing" in traj.metadata["error"]
    finally:
        server.close()
    assert available_moves("Available Moves: '[0]', '[5]'\nAvailable Moves: '[5]'") == ["[5]"]
    with pytest.raises(EnvError, match="lists its moves"):
        from trajtune.plugins.textarena_env import Opponent

        Opponent("random").move("no list here")


def test_the_tictactoe_expert_never_loses_and_beats_a_random_opponent_mostly():
    from trajtune.plugins.textarena_env import tictactoe_move

    env = make_env("textarena", game="TicTacToe-v0", opponent="random")
    rewards = [env.expert(t).reward for t in env.tasks("train", 20)]
    assert min(rewards) >= 0.0 and sum(r == 1.0 for r in rewards) >= 14  # perfect play: no loss
    # it completes a row when it can, and blocks the opponent's row otherwise (hand-built boards)
    shown = "As Player 0, you will be 'X', while your opponent is 'O'.\n{}"
    board = " X | X | 2 \n---+---+---\n O | O | 5 \n---+---+---\n 6 | 7 | 8 "
    assert tictactoe_move([Message(role="user", content=shown.format(board))]) == 2
    board = " X | 1 | 2 \n---+---+---\n O | O | 5 \n---+---+---\n X | 7 | 8 "
    assert tictactoe_move([Message(role="user", content=shown.format(board))]) == 5


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


def _first_move(messages, tools):
    return say(available_moves(messages[-1].text())[0])


def test_self_play_gives_each_seat_its_own_turn_and_reward():
    # both seats play the first available move: player 0 takes 0, 2, 4, 6 and wins on the 2-4-6 diagonal
    env = make_env("textarena", game="TicTacToe-v0", opponent="self")
    assert env.roles == ("player0", "player1")
    view = env.reset(env.tasks("test", 1)[0]).messages[-1]
    acted = []
    for _ in range(9):
        acted.append(env.acting_role())
        out = env.step(_first_move([view], []))
        if out.done:
            break
        view = out.observations[-1]
    assert acted == ["player0", "player1"] * 3 + ["player0"]
    assert out.info["role_rewards"] == {"player0": 1.0, "player1": -1.0}
    assert out.reward == 0.0 and env.success()  # the mean of the seats'; played to the end without an invalid move


def test_self_play_views_rejected_moves_and_options():
    env = make_env("textarena", game="TicTacToe-v0", opponent="self")
    traj = run_episode(env, env.tasks("test", 1)[0], _first_move)
    users = [m.text() for m in traj.messages if m.role == "user"]
    assert [u.splitlines()[0] for u in users[:3]] == ["[Player 0 to move]", "[Player 1 to move]", "[Player 0 to move]"]
    # each player reads its own rules once, with its own mark, and never the other's
    assert "As Player 0, you will be 'O'" in users[0] and "Player 1, you will" not in users[0]
    assert "As Player 1, you will be 'X'" in users[1] and "Player 0, you will" not in users[1]
    assert "You are Player" not in "".join(users[2:])
    assert "[Player 0] " not in users[1]  # the move's echo is the assistant message, not repeated
    # a rejected move: the game asks the same seat again, so the same role acts again
    env.reset(env.tasks("test", 1)[0])
    env.step(say("[4]"))
    assert env.acting_role() == "player1"
    out = env.step(say("[44]"))
    assert not out.done and env.acting_role() == "player1" and "invalid move" in out.observations[0].text()
    while not out.done:  # the seat keeps failing: the game's allowance runs out and that seat loses
        out = env.step(say("[44]"))
    assert out.info["role_rewards"]["player1"] < out.info["role_rewards"]["player0"]
    assert out.info["invalid_move"] and not env.success()
    assert out.reward == sum(out.info["role_rewards"].values()) / 2
    # the perfect expert in both seats: every game a draw, also when it draws among equally good moves
    import random

    rng = random.Random(0)
    games = set()
    for task in env.tasks("test", 6, seed=1):
        t = env.expert(task)
        assert t.outcome.success and t.reward == 0.0
        t = run_episode(env, task, lambda m, tools: say(f"[{tictactoe_move(m, rng)}]"))
        assert t.outcome.success and t.reward == 0.0
        games.add(tuple(m.text() for m in t.messages if m.role == "assistant"))
    assert len(games) > 1
    for bad in ({"seat": 0}, {"opponent_model": "x"}):
        with pytest.raises(EnvError, match="mean nothing in self-play"):
            make_env("textarena", game="TicTacToe-v0", opponent="self", **bad)
