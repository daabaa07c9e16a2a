"""MiniWoB++ plug-in: real web tasks in a headless Chromium, operated through tool calls."""

from __future__ import annotations

import gc
import json
import shutil

import pytest
from turns import call, say

pytest.importorskip("miniwob", reason="the miniwob extra is not installed (pip install 'trajtune[miniwob]'; "
                                      "make test installs it)")
if not (shutil.which("chromium") or shutil.which("chromium-browser")) or not shutil.which("chromedriver"):
    pytest.skip("no Chromium with chromedriver on PATH (make test installs them as root: apt-get install chromium "
                "chromium-driver)", allow_module_level=True)

from trajtune.envs import make_env  # noqa: E402
from trajtune.errors import EnvError  # noqa: E402
from trajtune.plugins.miniwob_env import BROWSERS, MiniWoBEnv  # noqa: E402


def _ref(env: MiniWoBEnv, **want) -> int:
    return next(int(el["ref"]) for el in env.elements if all(str(el.get(k)) == v for k, v in want.items()))


def test_the_expert_clicks_the_named_button_and_the_seed_is_the_pages_seed():
    env = make_env("miniwob", task="click-button")
    tasks = env.tasks("test", 4)
    assert {t.seed % 2 for t in tasks} == {1}
    said = []
    for t in tasks:
        traj = env.expert(t)
        assert traj.outcome.success and traj.reward == 1.0 and traj.outcome.termination == "done", t.id
        said.append(env.utterance)
        call_msg = next(m for m in traj.messages if m.role == "assistant")
        assert call_msg.tool_calls[0].name == "click"
    assert len(set(said)) > 1  # different seeds, different pages
    again = make_env("miniwob", task="click-button")
    again.reset(tasks[0])
    assert again.utterance == said[0]  # the same seed, the same page


def test_the_page_is_text_and_typing_then_submitting_solves_enter_text():
    env = MiniWoBEnv(task="enter-text")
    res = env.reset(env.tasks("train", 1, seed=2)[0])
    assert [t.name for t in res.tools] == ["click", "type_text"]
    page = res.messages[1].text()
    assert page.startswith("Task: Enter ") and 'button "Submit" id=subbtn' in page and "input_text id=tt" in page
    word = env.utterance.split('"')[1]
    out = env.step(call("type_text", ref=_ref(env, id="tt"), text=word))
    assert not out.done and f'value="{word}"' in out.observations[0].text()  # the page re-read after the action
    out = env.step(call("click", ref=_ref(env, id="subbtn")))
    assert out.done and out.reward == 1.0 and env.success() and out.info["success"]
    assert 0 < out.info["miniwob_env_reward"] <= 1.0


def test_a_wrong_click_fails_and_mistakes_in_calls_are_tool_errors_not_actions():
    env = MiniWoBEnv(task="click-test-2")
    env.reset(env.tasks("test", 1)[0])
    target = env.utterance.removeprefix("Click button ").rstrip(".")
    out = env.step(call("click", ref=9999))
    assert not out.done and "no element [9999]" in out.observations[0].text()
    out = env.step(call("click", ref="4"))
    assert not out.done and "integer ref" in out.observations[0].text()
    out = env.step(call("scroll", ref=1))
    assert not out.done and "unknown tool" in out.observations[0].text()
    other = next(int(el["ref"]) for el in env.elements if el["tag"] == "button" and el["text"] != target)
    out = env.step(call("click", ref=other))
    assert out.done and out.reward == -1.0 and not env.success()
    env.reset(env.tasks("test", 1)[0])
    out = env.step(say("I clicked it."))  # a text answer ends the episode unsolved
    assert out.done and not env.success()


def test_browsers_are_reused_across_episodes_and_an_abandoned_one_comes_back():
    env = MiniWoBEnv(task="click-test")
    for t in env.tasks("train", 3):
        env.expert(t)
    started = len(BROWSERS.all)
    cut = MiniWoBEnv(task="click-test")
    cut.reset(cut.tasks("train", 1)[0])  # never finished, like an episode cut at max_turns
    assert BROWSERS.idle["click-test"] == [] and len(BROWSERS.all) == started  # it took the idle browser
    del cut
    gc.collect()
    assert len(BROWSERS.idle["click-test"]) == 1  # given back when its environment went
    for t in env.tasks("test", 3):
        env.expert(t)
    assert len(BROWSERS.all) == started  # no browser started for the later episodes


@pytest.mark.parametrize("options, words", [
    ({"task": "click-buton"}, "did you mean click-button"),
    ({"colour": 1}, "known options: task, max_turns, max_elements"),
])
def test_bad_options_are_one_clear_error(options, words):
    with pytest.raises(EnvError, match=words):
        make_env("miniwob", **options)


def test_eval_runs_a_model_on_miniwob_end_to_end(tmp_path, tiny_dir):
    from typer.testing import CliRunner

    from trajtune.cli.main import app

    r = CliRunner().invoke(app, ["eval", "--model", str(tiny_dir), "--env", "miniwob", "--env-arg", "task=click-test-2",
                                 "--tasks", "2", "--max-new-tokens", "8", "--out", str(tmp_path / "ev"), "-q",
                                 "--no-report"])
    assert r.exit_code == 0, r.output
    eps = [json.loads(x) for x in (tmp_path / "ev" / "episodes.jsonl").read_text().splitlines()]
    assert len(eps) == 2 and all(e["messages"][1]["content"].startswith("Task: Click button") for e in eps)
    assert all(e["outcome"]["success"] is False for e in eps)  # an untrained model: recorded, never a crash
