"""Early experience (``rft.early_experience``): alternatives at the expert's states, executed in the
environment, become world-model and self-reflection records."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from trajtune.algorithms.early_experience import (
    ENDED,
    REFLECTION_PROMPT,
    WORLD_MODEL_SYSTEM,
    EarlyExperienceSpec,
    describe,
    early_experience_mine,
    expert_states,
    outcome_text,
)
from trajtune.chat.render import ChatRenderer
from trajtune.envs import make_env
from trajtune.errors import ConfigError
from trajtune.rollout import RolloutConfig
from trajtune.schema import Message, ToolCall, Trajectory


def _expert(min_actions: int = 3):
    env = make_env("home")
    return next((t, e) for t in env.tasks("train", 50, seed=0) for e in [env.expert(t)]
                if sum(m.role == "assistant" for m in e.messages) >= min_actions)


def test_expert_states_are_evenly_spaced_assistant_turns():
    msgs = [Message(role="user", content="u")]
    for k in range(5):
        msgs += [Message(role="assistant", content=f"a{k}"), Message(role="tool", content="r")]
    t = Trajectory(id="t", messages=msgs)
    assert expert_states(t, 2) == [1, 7]  # actions 0 and 3 (every 3rd of 5)
    assert expert_states(t, 5) == [1, 3, 5, 7, 9] and expert_states(t, 9) == [1, 3, 5, 7, 9]
    assert expert_states(Trajectory(id="e", messages=msgs[:1]), 3) == []


WRONG = Message(role="assistant", tool_calls=[ToolCall(id="w1", name="no_such_tool", arguments={"x": 1})])


def test_alternatives_are_executed_and_become_records(tiny_tok, monkeypatch):
    """A fake policy proposes, at every state, the expert's own action (a duplicate, dropped) and a
    call to a tool that does not exist; the environment really executes it. Each world-model target
    is what the environment returns for that action, replayed here independently."""
    import trajtune.rollout as ro_mod

    task, expert = _expert()
    seen_reflection_prompts: list[str] = []

    def fake(model, tok, env_factory, tasks, rollout, seed=0, renderer=None, prefixes=None, **kw):
        out = []
        for n, t in enumerate(tasks):
            env = env_factory()
            if prefixes is None:  # the reflection request: one greedy turn
                assert rollout.temperature == 0.0 and rollout.max_turns == 1
                ask = env.reset(t).messages
                seen_reflection_prompts.append(ask[-1].text())
                said = Message(role="assistant", content=f"The expert looked first ({t.id}).")
                out.append(SimpleNamespace(turns=1, trajectory=Trajectory(id=t.id, messages=[*ask, said])))
                continue
            assert rollout.max_turns == 1
            history, _, _ = env.reach(t, prefixes[n])
            if n % 2 == 0:  # the expert's own action at this state
                action = expert.messages[len(prefixes[n])]
            else:
                action = WRONG
            obs = env.step(action).observations
            out.append(SimpleNamespace(turns=1, trajectory=Trajectory(id=t.id, messages=[*history, action, *obs])))
        return out

    monkeypatch.setattr(ro_mod, "run_rollouts", fake)
    spec = EarlyExperienceSpec(alternatives=2, states=2)
    records, counts = early_experience_mine(None, tiny_tok, ChatRenderer(tiny_tok), lambda: make_env("home"),
                                            [(task, expert)], RolloutConfig(), spec, seed=0)
    states = expert_states(expert, 2)
    # the environment answers every action but a final answer (the episode's last message), which ends it
    silent = sum(i == len(expert.messages) - 1 for i in states)
    assert counts == {"experts": 1, "states": 2, "alternatives": 2, "duplicates": 2, "world_model_records": 4,
                      "silent_outcomes": silent, "reflection_records": 2, "empty_reflections": 0}
    wm = [r for r in records if r.metadata["early_experience"] == "world_model"]
    for r in wm:
        i = r.metadata["state"]
        assert i in states and [m.role for m in r.messages] == ["system", "user", "assistant"]
        assert r.messages[0].text() == WORLD_MODEL_SYSTEM and r.messages[2].train is True
        env = make_env("home")
        env.reach(task, expert.messages[:i])
        action = expert.messages[i] if r.metadata["expert_action"] else WRONG
        want = outcome_text(env.step(action).observations)
        assert r.messages[2].text() == want
        assert describe(action) in r.messages[1].text()
        if not r.metadata["expert_action"]:
            assert "no_such_tool" in want  # the environment's own error for the unknown tool
    assert sorted((r.metadata["state"], r.metadata["expert_action"]) for r in wm) == \
        sorted((i, e) for i in states for e in (True, False))
    sr = [r for r in records if r.metadata["early_experience"] == "reflection"]
    assert sorted(r.metadata["state"] for r in sr) == states
    for r in sr:
        i = r.metadata["state"]
        last = r.messages[-1]
        assert len(r.messages) == i + 1 and last.tool_calls == expert.messages[i].tool_calls
        assert last.thought == "The expert looked first (0:%d)." % i and last.train is True
        assert all(m.train is False for m in r.messages[:-1] if m.role == "assistant")
        sample = ChatRenderer(tiny_tok).render_samples(r)[0]  # only the last turn trains, thought included
        trained = tiny_tok.decode([t for t, w in zip(sample.ids, sample.weight) if w > 0])
        assert "The expert looked first" in trained
    assert len(seen_reflection_prompts) == 2
    assert all("Expert action:" in p and "Other action 1:" in p and "no_such_tool" in p and "Other action 2" not in p
               for p in seen_reflection_prompts)


def test_outcome_of_a_final_answer_is_the_end():
    assert outcome_text([]) == ENDED
    assert REFLECTION_PROMPT.startswith("Below is a task")


def test_config_checks(tiny_dir, tmp_path):
    from trajtune.algorithms.rft import RFTRunConfig
    from trajtune.config import load_config

    base = [f"model={tiny_dir}", "env=home", "output_dir=o"]
    with pytest.raises(ConfigError, match="rft.k: 0 mines no attempt"):
        load_config(None, RFTRunConfig, base + ["rft.k=0", "data.path=x.jsonl"])
    with pytest.raises(ConfigError, match="rft.early_experience needs data.path"):
        load_config(None, RFTRunConfig, base + ["rft.early_experience.alternatives=2"])
    with pytest.raises(ConfigError, match="both false"):
        load_config(None, RFTRunConfig, base + ["data.path=x.jsonl", "rft.early_experience.world_model=false",
                                                "rft.early_experience.reflection=false"])
    with pytest.raises(ConfigError, match="apply to mined successes"):
        load_config(None, RFTRunConfig, base + ["data.path=x.jsonl", "rft.k=0", "rft.dedup=false",
                                                "rft.early_experience.states=2"])


def test_rft_run_with_early_experience_and_no_success_mining(tmp_path, tiny_dir):
    from trajtune.algorithms.rft import RFTRunConfig
    from trajtune.config import load_config
    from trajtune.envs.expert_data import write_expert_data
    from trajtune.train import run

    env = make_env("home")
    data = tmp_path / "experts.jsonl"
    write_expert_data("home", {}, env.tasks("train", 3, seed=0), data)
    out = tmp_path / "rft"
    cfg = load_config(None, RFTRunConfig, [
        f"model={tiny_dir}", "env=home", f"output_dir={out}", f"data.path={data}", "rft.k=0", "rft.iterations=1",
        "rft.n_tasks=3", "rft.early_experience.alternatives=2", "rft.early_experience.states=2",
        "rollout.max_new_tokens=16", "train.steps=2", "train.batch_size=2", "report=false"])
    run(cfg, quiet=True)
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in metrics if "mined/ee_states" in r)
    assert first["mined/ee_states"] == sum(len(expert_states(env.expert(t), 2)) for t in env.tasks("train", 3, seed=0))
    assert "mined/attempts" not in first  # no attempt was mined for success
    mined = [json.loads(x) for x in next((out / "rft").glob("iter-*.jsonl")).read_text().splitlines()]
    kinds = [m["metadata"]["early_experience"] for m in mined]
    assert kinds.count("world_model") == first["mined/ee_world_model_records"] >= first["mined/ee_states"]
    assert kinds.count("reflection") == first["mined/ee_reflection_records"]
    # one reflection asked per state with an alternative (the tiny model's greedy replies may be empty)
    assert 0 < first["mined/ee_reflection_records"] + first["mined/ee_empty_reflections"] <= first["mined/ee_states"]


def test_single_turn_environment_leaves_nothing_to_predict_and_the_run_says_so(tmp_path, tiny_dir, capsys):
    """fncall with ``single_turn: true`` ends every episode at the first call, with no observation:
    every world-model record would predict ENDED. The counts say so and the run prints why."""
    from trajtune.algorithms.rft import RFTRunConfig
    from trajtune.config import load_config
    from trajtune.envs.expert_data import write_expert_data
    from trajtune.train import run

    kwargs = {"single_turn": True}
    env = make_env("fncall", **kwargs)
    data = tmp_path / "experts.jsonl"
    write_expert_data("fncall", kwargs, env.tasks("train", 2, seed=0), data)
    out = tmp_path / "rft"
    cfg = load_config(None, RFTRunConfig, [
        f"model={tiny_dir}", "env.name=fncall", "env.kwargs.single_turn=true", f"output_dir={out}",
        f"data.path={data}", "rft.k=0", "rft.iterations=1", "rft.n_tasks=2", "rft.early_experience.alternatives=1",
        "rft.early_experience.reflection=false", "rollout.max_new_tokens=8", "train.steps=1", "train.batch_size=2",
        "train.warmup_steps=0", "report=false"])
    run(cfg, quiet=False)
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in metrics if "mined/ee_states" in r)
    assert first["mined/ee_world_model_records"] >= 2  # the expert's call at each of the 2 states, at least
    assert first["mined/ee_silent_outcomes"] == first["mined/ee_world_model_records"]
    mined = [json.loads(x) for x in next((out / "rft").glob("iter-*.jsonl")).read_text().splitlines()]
    assert {m["messages"][-1]["content"] for m in mined} == {ENDED}
    said = " ".join(capsys.readouterr().err.split())
    assert "answered none of the" in said and "single_turn: false" in said
