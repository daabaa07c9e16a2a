"""GEM plug-in: real episodes of the real package's games through the gym adapter."""

from __future__ import annotations

import json
import re
import threading

import pytest
from turns import call, say

pytest.importorskip("gem", reason="gem-llm is not installed (pip install --no-deps gem-llm==0.1.0 and its "
                                  "dependencies, docs/envs.md; make test installs them)")

from trajtune.envs import make_env  # noqa: E402
from trajtune.errors import EnvError  # noqa: E402
from trajtune.plugins.gem_env import GemEnv, guess_range  # noqa: E402


def _target(env: GemEnv) -> int:
    """The hidden number of the running GEM game (the test peeks; the agent cannot)."""
    return int(env.gym.env.game_number)


def _guesses(traj) -> list[int]:
    return [int(re.fullmatch(r"\\boxed\{(\d+)\}", m.text()).group(1)) for m in traj.messages if m.role == "assistant"]


def test_the_task_seed_is_the_games_seed_and_the_expert_wins_by_binary_search():
    env = make_env("gem", env_id="game:GuessTheNumber-v0-easy")
    tasks = env.tasks("test", 8, seed=0)
    assert {t.seed % 2 for t in tasks} == {1} and {t.seed % 2 for t in env.tasks("train", 4)} == {0}
    targets = []
    for t in tasks:
        traj = env.expert(t)
        targets.append(_target(env))
        assert traj.outcome.success and traj.outcome.termination == "done" and traj.reward == 1.0, t.id
        guesses = _guesses(traj)
        assert guesses[-1] == targets[-1] and len(guesses) <= 4  # binary search on 1-10: at most 4 guesses
    again = make_env("gem", env_id="game:GuessTheNumber-v0-easy")
    for t, want in zip(tasks, targets):
        again.reset(t)
        assert _target(again) == want  # the same seed, the same hidden number
    assert len(set(targets)) > 2


def test_parallel_resets_draw_each_game_from_its_own_seed():
    # GEM seeds the global random module at reset: episodes reset in threads must not mix their draws
    envs = [make_env("gem", env_id="game:GuessTheNumber-v0-hard") for _ in range(8)]
    tasks = envs[0].tasks("train", 8, seed=3)
    alone = []
    for t in tasks:
        envs[0].reset(t)
        alone.append(_target(envs[0]))
    threads = [threading.Thread(target=e.reset, args=(t,)) for e, t in zip(envs, tasks)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert [_target(e) for e in envs] == alone


def test_hints_come_with_the_next_turns_instruction_and_a_win_ends_the_game():
    env = GemEnv()
    task = env.tasks("train", 1, seed=5)[0]
    res = env.reset(task)
    assert [m.role for m in res.messages] == ["system", "user"] and res.tools == []
    assert "between 1 and 10" in res.messages[1].text() and "\\boxed{" in res.messages[0].text()
    target = _target(env)
    wrong = 1 if target > 1 else 10
    out = env.step(say(f"My guess: \\boxed{{{wrong}}}"))
    text = out.observations[0].text()
    assert not out.done and out.reward == 0.0
    assert ("higher" if target > wrong else "lower") in text and text.endswith("Enter your next guess.")
    want = (wrong + 1, 10) if target > wrong else (1, wrong - 1)
    assert guess_range(res.messages + [say(""), *out.observations]) == want
    out = env.step(say(f"\\boxed{{{target}}}"))
    assert out.done and out.reward == 1.0 and env.success() and out.info["success"] is True
    assert "Enter your next guess" not in out.observations[0].text()


def test_running_out_of_turns_is_max_turns_with_gem_s_partial_reward_and_no_success():
    env = GemEnv(env_id="game:GuessTheNumber-v0-easy")  # 1-10 in 4 turns
    env.reset(env.tasks("train", 1, seed=1)[0])
    target = _target(env)
    wrong = [g for g in range(1, 11) if g != target][:4]
    for g in wrong[:3]:
        assert not env.step(say(f"\\boxed{{{g}}}")).done
    out = env.step(say(f"\\boxed{{{wrong[3]}}}"))
    assert out.done and out.termination == "max_turns" and not env.success()
    # GEM's closeness of the last guess: 1 - |guess - target| / (max - min)
    assert out.reward == pytest.approx(1 - abs(wrong[3] - target) / 9)


def test_an_answer_without_a_box_is_gem_s_invalid_action_and_a_tool_call_is_told_off():
    env = GemEnv()
    env.reset(env.tasks("test", 1)[0])
    out = env.step(call("guess", n=3))  # no tools are offered: told, not crashed, and the game goes on
    assert not out.done and out.info["invalid_action"] and "no tools" in out.observations[0].text()
    out = env.step(say("I think it is 3"))
    assert out.done and out.reward == pytest.approx(-0.1) and out.info["invalid_action"] and not env.success()


@pytest.mark.parametrize("options, words", [
    ({"env_id": "game:GuessTheNumbr-v0"}, "did you mean game:GuessTheNumber"),
    ({"colour": 1}, "known options: env_id, max_turns, instructions"),
    ({"max_turns": 0}, "max_turns"),
])
def test_bad_options_are_one_clear_error(options, words):
    with pytest.raises(EnvError, match=re.escape(words)):
        make_env("gem", **options)


def test_a_task_of_another_game_is_refused():
    env = GemEnv()
    other = GemEnv(env_id="game:Mastermind-v0-easy").tasks("test", 1)[0]
    with pytest.raises(EnvError, match="Mastermind"):
        env.reset(other)
    with pytest.raises(NotImplementedError, match="GuessTheNumber games have one"):
        GemEnv(env_id="game:Mastermind-v0-easy").expert(other)


def test_eval_runs_a_model_on_gem_games_end_to_end(tmp_path, tiny_dir):
    from typer.testing import CliRunner

    from trajtune.cli.main import app

    r = CliRunner().invoke(app, ["eval", "--model", str(tiny_dir), "--env", "gem", "--env-arg",
                                 "env_id=game:GuessTheNumber-v0-easy", "--tasks", "3", "--max-new-tokens", "8",
                                 "--out", str(tmp_path / "ev"), "-q", "--no-report"])
    assert r.exit_code == 0, r.output
    eps = [json.loads(x) for x in (tmp_path / "ev" / "episodes.jsonl").read_text().splitlines()]
    assert len(eps) == 3
    for e in eps:  # an untrained model's turn is cut or boxes nothing: GEM's invalid answer, never a crash
        assert e["messages"][1]["content"].startswith("You are playing Guess The Number")
        assert e["outcome"]["success"] is False
    assert json.loads((tmp_path / "ev" / "results.json").read_text())["metrics"]["success"] == 0.0

