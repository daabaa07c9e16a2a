"""``home``'s ``rationale`` option: the expert states what it read and what follows before each call
that depends on a reading; the text never changes what is scored."""

from __future__ import annotations

import pytest

from trajtune.chat.parsers import parse_tool_calls
from trajtune.envs.home import HomeEnv
from trajtune.schema import Message, ToolCall


def _tasks(env: HomeEnv, kind: str, n: int = 3):
    return [t for t in env.tasks("train", 60, seed=5) if t.data["kind"] == kind][:n]


def _assistant(traj) -> list[Message]:
    return [m for m in traj.messages if m.role == "assistant"]


@pytest.mark.parametrize("kind", ["copy", "toggle"])
def test_the_sentence_names_the_reading_and_the_state_the_call_writes(kind: str) -> None:
    env = HomeEnv(rationale=True)
    for t in _tasks(env, kind):
        d = t.data
        traj = env.expert(t)
        read, write, done = _assistant(traj)
        source = d["source_room"] if kind == "copy" else d["room"]
        seen = d["initial"][source][d["device"]]
        call = write.tool_calls[0]
        assert read.content is None and done.content == "Done." and traj.outcome.success
        assert call.arguments["state"] == d["goal"]
        # what it read, from the environment's table, not from the call
        assert write.content.startswith(f"The {source} {d['device']} is {seen}")
        assert write.content.endswith(f"must be {d['goal']}.")
        # a copy keeps the reading, a toggle flips it
        assert (d["goal"] == seen) == (kind == "copy")
        assert ("toggled" in write.content) == (kind == "toggle")


def test_set_tasks_and_the_default_carry_no_sentence() -> None:
    t = _tasks(HomeEnv(), "set", 1)[0]
    assert [m.content for m in _assistant(HomeEnv(rationale=True).expert(t))] == [None, "Done."]
    for kind in ("copy", "toggle"):
        t = _tasks(HomeEnv(), kind, 1)[0]
        assert all(m.content in (None, "Done.") for m in _assistant(HomeEnv().expert(t)))


def test_chores_get_one_sentence_per_chore_that_reads() -> None:
    env = HomeEnv(rationale=True, chores=4)
    t = env.tasks("train", 1, seed=2)[0]
    traj = env.expert(t)
    reading = [c for c in t.data["chores"] if c["kind"] != "set"]
    said = [m.content for m in _assistant(traj) if m.tool_calls and m.content]
    assert traj.outcome.success and len(said) == len(reading) and reading
    for c, text in zip(reading, said):
        assert text.endswith(f"the {c['room']} {c['device']} must be {c['goal']}.") or \
            (c["kind"] == "toggle" and text.endswith(f"toggled, it must be {c['goal']}."))


def test_scoring_ignores_the_text_a_wrong_sentence_with_the_right_call_succeeds() -> None:
    env = HomeEnv(rationale=True)
    t = _tasks(env, "copy", 1)[0]
    d = t.data
    env.reset(t)
    env.step(Message(role="assistant", tool_calls=[ToolCall(id="a", name="get_state",
                                                            arguments={"room": d["source_room"], "device": d["device"]})]))
    wrong = "The moon is made of cheese, so it must be off."
    env.step(Message(role="assistant", content=wrong, tool_calls=[ToolCall(
        id="b", name="set_device", arguments={"room": d["room"], "device": d["device"], "state": d["goal"]})]))
    assert env.step(Message(role="assistant", content="Done.")).reward == 1.0


def test_a_sampled_sentence_before_the_call_parses_into_content_and_call() -> None:
    text = ('The attic fan is on, so the office fan must be on.\n<tool_call>\n{"name": "set_device", '
            '"arguments": {"room": "office", "device": "fan", "state": "on"}}\n</tool_call>')
    r = parse_tool_calls(text, "hermes")
    assert r.content == "The attic fan is on, so the office fan must be on."
    assert [(c.name, c.arguments) for c in r.tool_calls] == [
        ("set_device", {"room": "office", "device": "fan", "state": "on"})]


def test_rationale_must_be_a_boolean() -> None:
    with pytest.raises(ValueError, match="rationale must be true or false"):
        HomeEnv(rationale="yes")  # type: ignore[arg-type]


def _copy_task():
    return _tasks(HomeEnv(), "copy", 1)[0]


def test_a_wrong_state_after_a_sentence_is_placed_where_the_sentence_went_wrong() -> None:
    from benchmark_module import load  # pytest puts tests/ on sys.path

    issue = load("real_multiturn")._sentence_issue
    d = _copy_task().data
    seen = d["initial"][d["source_room"]][d["device"]]
    other = "off" if seen == "on" else "on"
    assert seen == d["goal"]  # a copy
    assert issue(f"The {d['source_room']} {d['device']} is {other}, so it must be {other}.", d) == \
        " (sentence misreads the state)"
    assert issue(f"The {d['source_room']} {d['device']} is {seen}, so it must be {other}.", d) == \
        " (sentence reads right, concludes wrong)"
    assert issue(f"The {d['source_room']} {d['device']} is {seen}, so it must be {seen}.", d) == \
        " (call contradicts a right sentence)"
    assert issue("Setting it now.", d) == " (sentence without a reading and a conclusion)"


@pytest.mark.parametrize("kind", ["copy", "toggle"])
def test_the_probe_plays_each_task_under_both_readings_and_finds_the_state_words(kind: str) -> None:
    from benchmark_module import load

    probe = load("home_state_probe")
    task = _tasks(HomeEnv(), kind, 1)[0]
    for reading in ("on", "off"):
        t = probe.variant(task, reading)
        d = t.data
        look = d["source_room"] if kind == "copy" else d["room"]
        assert d["initial"][look][d["device"]] == reading
        assert (d["goal"] == reading) == (kind == "copy")
        assert d["initial"][d["room"]][d["device"]] != d["goal"]  # the call is still a change
        traj = HomeEnv(rationale=True).expert(t)
        assert traj.outcome.success
        text = "".join((m.content or "") + "".join(str(c.arguments) for c in m.tool_calls or [])
                       for m in traj.messages)
        text = text.replace("'state': '", '"state": "')
        at = probe.probe_points(text, t, rationale=True)
        assert text[at["read"]:].startswith(reading)
        assert text[at["decide"]:].startswith(d["goal"]) and text[at["call"]:].startswith(d["goal"])
    assert task.data["initial"] == _tasks(HomeEnv(), kind, 1)[0].data["initial"]  # the task itself is untouched
