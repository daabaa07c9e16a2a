"""``home``'s reward terms: ``observed`` (every target that needed a reading was read before it was
switched) and ``grounded`` (success and observed), against hand-played episodes of known outcome."""

from __future__ import annotations

from trajtune.envs.home import HomeEnv, _other
from trajtune.schema import Message, ToolCall


def _act(env: HomeEnv, name: str | None = None, **args: str):
    if name is None:
        return env.step(Message(role="assistant", content="Done."))
    return env.step(Message(role="assistant", tool_calls=[ToolCall(id=f"c{env.turns}", name=name, arguments=args)]))


def _play(env: HomeEnv, task, *calls: tuple[str, dict[str, str]], reset: bool = True):
    """The calls in order, then the final answer: that step's result."""
    if reset:
        env.reset(task)
    for name, args in calls:
        _act(env, name, **args)
    return _act(env)


def _task(env: HomeEnv, kind: str):
    return next(t for t in env.tasks("train", 40, seed=3) if t.data["kind"] == kind)


def _read(room: str, device: str) -> tuple[str, dict[str, str]]:
    return "get_state", {"room": room, "device": device}


def _set(d: dict, state: str | None = None) -> tuple[str, dict[str, str]]:
    return "set_device", {"room": d["room"], "device": d["device"], "state": state or d["goal"]}


def test_observed_then_set_is_grounded_and_a_blind_lucky_set_is_not():
    env = HomeEnv()
    t = _task(env, "copy")
    d = t.data
    end = _play(env, t, _read(d["source_room"], d["device"]), _set(d))  # the expert's way
    assert end.info["success"] and end.info["reward_terms"] == {"observed": 1.0, "grounded": 1.0}
    end = _play(env, t, _set(d))  # the right state, guessed without reading: success, but not grounded
    assert end.info["success"] and end.reward == 1.0
    assert end.info["reward_terms"] == {"observed": 0.0, "grounded": 0.0}
    # reading the wrong device first, or the right one afterwards, does not undo a blind switch
    end = _play(env, t, _read(d["room"], d["device"]), _set(d), _read(d["source_room"], d["device"]))
    assert end.info["reward_terms"] == {"observed": 0.0, "grounded": 0.0}


def test_observed_but_wrong_is_observed_not_grounded_and_set_tasks_need_no_reading():
    env = HomeEnv()
    t = _task(env, "toggle")
    d = t.data
    end = _play(env, t, _read(d["room"], d["device"]), _set(d, _other(d["goal"])))  # read, then wrong
    assert not end.info["success"] and end.info["reward_terms"] == {"observed": 1.0, "grounded": 0.0}
    s = _task(env, "set")
    assert _play(env, s, _set(s.data)).info["reward_terms"] == {"observed": 1.0, "grounded": 1.0}


def test_a_failed_read_does_not_count_and_snapshot_keeps_the_readings():
    env = HomeEnv()
    t = _task(env, "copy")
    d = t.data
    env.reset(t)
    _act(env, "get_state", room=d["source_room"])  # missing 'device': an error, nothing read
    saved = env.snapshot()
    _act(env, "get_state", room=d["source_room"], device=d["device"])
    after_read = env.snapshot()
    env.restore(saved)  # back before the read: switching now is blind
    assert _play(env, t, _set(d), reset=False).info["reward_terms"]["observed"] == 0.0
    env.restore(after_read)  # after it: observed
    assert _play(env, t, _set(d), reset=False).info["reward_terms"] == {"observed": 1.0, "grounded": 1.0}


def test_every_expert_episode_is_grounded_in_chores_too():
    for env in (HomeEnv(), HomeEnv(chores=4)):
        for t in env.tasks("test", 12, seed=5):
            rec = env.expert(t)
            assert rec.outcome.success
            assert env.blind is False and env.success()
    env = HomeEnv(chores=3)  # one blind chore among read ones makes the whole episode unobserved
    t = next(t for t in env.tasks("train", 30, seed=0) if any(c["kind"] != "set" for c in t.data["chores"]))
    blind = next(c for c in t.data["chores"] if c["kind"] != "set")
    calls = []
    for c in t.data["chores"]:
        if c is not blind and c["kind"] != "set":
            calls.append(_read(c.get("source_room", c["room"]), c["device"]))
        calls.append(_set(c))
    end = _play(env, t, *calls)
    assert end.info["success"] and end.info["reward_terms"] == {"observed": 0.0, "grounded": 0.0}
