"""Trained self-correction: the ``retry`` environment wrapper, first/second-attempt metrics, the
BFCL single-turn environment, and ``rl.train_turns`` (only the reflection or the retry trains)."""

from __future__ import annotations

import json

import pytest

from trajtune.algorithms.advantages import assign_advantages
from trajtune.algorithms.self_correction import chosen_turns, restrict_to_turns
from trajtune.envs.adapters.retry import ERROR_TEXT, FAILED_TEXT, REFLECT_TEXT, RETRY_TEXT, injected, retry_marks
from trajtune.envs.base import Task
from trajtune.envs.registry import make_env
from trajtune.eval.metrics import retry_summary, summarize
from trajtune.rollout import Episode
from trajtune.schema import Message, Outcome, ToolCall, Trajectory
from trajtune.tokens import SOURCE_ENV, SOURCE_POLICY, TokenTrajectory

FNCALL = {"single_turn": True, "system_prompt": False}


def _right_call(task: Task) -> Message:
    """The task's correct call, from a separate environment (the expert plays a whole episode)."""
    expert = make_env("fncall", **FNCALL).expert(task)
    return next(m for m in expert.messages if m.role == "assistant")


def _wrong_call() -> Message:
    return Message(role="assistant", tool_calls=[ToolCall(id="c1", name="no_such_function", arguments={})])


def test_a_failed_attempt_gets_a_reflection_request_then_a_fresh_retry():
    env = make_env("retry", env="fncall", kwargs=FNCALL)
    task = env.tasks("test", 1, seed=3)[0]
    right = _right_call(task)
    env.reset(task)
    first = env.step(_wrong_call())
    assert not first.done and first.reward == 0.0
    assert [m.extra for m in first.observations] == [{"retry": "reflect"}]
    assert first.observations[0].text() == f"{FAILED_TEXT} {REFLECT_TEXT}"  # binary feedback: no detail
    assert first.info["failed_attempt"]["reward_terms"]["call_name"] == 0.0
    assert "reward_terms" not in first.info  # a retried attempt adds nothing to the episode's reward terms
    # the reflection is not executed, even when it holds a call (this one would be right)
    reflection = env.step(Message(role="assistant", content="I called a function that does not exist.",
                                  tool_calls=right.tool_calls))
    assert not reflection.done and reflection.reward == 0.0 and not env.success()
    assert [(m.role, m.text(), m.extra) for m in reflection.observations] == [("user", RETRY_TEXT, {"retry": "retry"})]
    last = env.step(right)
    assert last.done and last.reward == 1.0 and env.success() and last.info["attempt"] == 2


def test_retries_run_out_and_options_change_the_feedback():
    env = make_env("retry", env="fncall", kwargs=FNCALL, reflect=False, feedback="detail", retries=2)
    task = env.tasks("test", 1, seed=4)[0]
    env.reset(task)
    for attempt in (1, 2):
        out = env.step(_wrong_call())
        assert not out.done and out.info["attempt"] == attempt
        text = out.observations[0].text()
        assert text.startswith(FAILED_TEXT) and "no_such_function" in text and text.endswith(RETRY_TEXT)
        assert out.observations[0].extra == {"retry": "retry"}
    out = env.step(_wrong_call())  # the third attempt is the last
    assert out.done and out.info["attempt"] == 3 and not env.success()
    assert "failed_attempt" not in out.info  # the last attempt keeps its own reward and terms
    # solved at once: the wrapper adds nothing
    env.reset(task)
    out = env.step(_right_call(task))
    assert out.done and out.reward == 1.0 and out.observations == []


def test_unknown_retry_option_is_named():
    from trajtune.errors import EnvError

    with pytest.raises(EnvError, match="retry option reflection"):
        make_env("retry", env="fncall", reflection=True)


def test_injected_tool_error_replaces_the_first_call_result_once():
    env = make_env("retry", env="fncall", kwargs=FNCALL, inject_error=1.0)
    task = env.tasks("test", 1, seed=5)[0]
    right = _right_call(task)
    env.reset(task)
    out = env.step(right)
    assert not out.done and not env.success() and out.info["injected_error"] is True
    assert [(m.role, m.text(), m.tool_call_id, m.extra) for m in out.observations] == \
        [("tool", ERROR_TEXT, right.tool_calls[0].id, {"retry": "injected_error"})]
    out = env.step(right)
    assert out.done and out.reward == 1.0 and env.success()
    # a share of tasks: decided by the task alone, the same in every instance
    tasks = [Task(id=f"t{i}", seed=i) for i in range(400)]
    hits = [injected(t, 0.25) for t in tasks]
    assert hits == [injected(t, 0.25) for t in tasks]
    assert 0.18 < sum(hits) / len(hits) < 0.32


def _traj(marks: list[str], success: bool) -> Trajectory:
    msgs = [Message(role="user", content="do it"), Message(role="assistant", content="a")]
    for mark in marks:
        role = "tool" if mark == "injected_error" else "user"
        msgs += [Message(role=role, content="x", extra={"retry": mark}), Message(role="assistant", content="b")]
    return Trajectory(id="t", messages=msgs, metadata={"env": "retry(fncall)"},
                      outcome=Outcome(success=success, termination="done"))


def test_retry_summary_counts_attempts_from_the_marks():
    eps = [_traj([], True), _traj([], False), _traj(["reflect", "retry"], True), _traj(["reflect", "retry"], False),
           _traj(["injected_error"], True), _traj(["injected_error", "reflect", "retry", "reflect", "retry"], True)]
    r = retry_summary(eps)
    assert r == {"episodes": 6, "first_attempt_success": 2 / 6,
                 "success_by_attempt": {"1": 2 / 6, "2": 3 / 6, "3": 4 / 6},
                 "retried": 3 / 6, "recovered": 2 / 3, "reflections": 4,
                 "injected_errors": 2, "recovery_after_error": 1.0}
    assert summarize(eps)["retry"] == r
    plain = _traj([], True)
    plain.metadata["env"] = "fncall"
    assert retry_summary([plain]) is None and "retry" not in summarize([plain])


def test_chosen_turns_finds_the_reflection_and_the_retried_attempt():
    def msg(role: str, mark: str | None = None) -> Message:
        return Message(role=role, content="x", extra={"retry": mark} if mark else {})

    # a multi-turn attempt (call, result, answer), reflection, a multi-turn retry
    msgs = [msg("user"), msg("assistant"), msg("tool"), msg("assistant"), msg("user", "reflect"), msg("assistant"),
            msg("user", "retry"), msg("assistant"), msg("tool"), msg("assistant")]
    assert chosen_turns(msgs, "reflection") == {2}
    assert chosen_turns(msgs, "retry") == {3, 4}
    # an injected error inside the first attempt changes nothing
    msgs2 = [msg("user"), msg("assistant"), msg("tool", "injected_error"), msg("assistant")]
    assert chosen_turns(msgs2, "reflection") == set() and chosen_turns(msgs2, "retry") == set()


def _episode(n_turns: int, reflect_at: int | None, reward: float, group: str = "g") -> Episode:
    """An episode of ``n_turns`` assistant turns of 2 tokens each, after a 3-token prompt; with a
    reflection request before turn ``reflect_at``."""
    msgs = [Message(role="user", content="q")]
    ids, source, turn = [1, 2, 3], [SOURCE_ENV] * 3, [0, 0, 0]
    for k in range(n_turns):
        if k == reflect_at:
            msgs.append(Message(role="user", content="reflect", extra={"retry": "reflect"}))
            ids += [9]
            source += [SOURCE_ENV]
            turn += [k]
        msgs.append(Message(role="assistant", content=f"turn {k}"))
        ids += [10 + k, 20 + k]
        source += [SOURCE_POLICY] * 2
        turn += [k, k]
    tt = TokenTrajectory(ids=ids, source=source, turn=turn, weight=[float(s == SOURCE_POLICY) for s in source],
                         traj_id="t", group=group, reward=reward, meta={"turns": n_turns})
    traj = Trajectory(id="t", messages=msgs, outcome=Outcome(success=reward > 0, termination="done"))
    return Episode(trajectory=traj, tokens=tt)


def test_only_reflection_tokens_train_and_first_attempt_wins_leave_the_baseline():
    solved_first = _episode(1, None, 1.0)
    r_ok = _episode(3, 1, 1.0)
    r_bad1 = _episode(3, 1, 0.0)
    r_bad2 = _episode(3, 1, 0.0)
    eps = [solved_first, r_ok, r_bad1, r_bad2]
    m = restrict_to_turns(eps, "reflection")
    assert m == {"reflection/episodes": 0.75, "reflection/success": 1 / 3}
    assert solved_first.tokens.meta["masked"] and not any(solved_first.tokens.weight)
    # the prompt (3), turn 0 (2), reflection request (1), turn 1 = the reflection (2), turn 2 (2)
    assert r_ok.tokens.weight == [0, 0, 0, 0, 0, 0, 1, 1, 0, 0]
    kept, _ = assign_advantages([e.tokens for e in eps], "grpo")
    # GRPO over the three reflections only: rewards 1, 0, 0 -> mean 1/3, sample std 1/sqrt(3)
    a_ok, a_bad = (2 / 3) * 3 ** 0.5, -(1 / 3) * 3 ** 0.5
    assert r_ok.tokens.advantages[6] == pytest.approx(a_ok, rel=1e-5)
    assert r_bad1.tokens.advantages[6] == pytest.approx(a_bad, rel=1e-5)
    assert all(a == 0 for a in solved_first.tokens.advantages)
    # the retry setting trains the turns after "try again" (none in these episodes: all masked)
    eps2 = [_episode(3, 1, 1.0)]
    assert restrict_to_turns(eps2, "retry") == {"retry/episodes": 0.0, "retry/success": 0.0}
    assert eps2[0].tokens.meta["masked"]


def test_bfcl_single_turn_env_gives_the_suites_verdict_and_no_train_split():
    from trajtune.plugins.bfcl.data import load_bfcl
    from trajtune.plugins.bfcl.runner import default_parse_fn, score_single_turn

    env = make_env("bfcl_single_turn", limit=5)
    with pytest.raises(ValueError, match="only a 'test' split"):
        env.tasks("train", 2)
    tasks = env.tasks("test", 5)
    assert [t.id for t in tasks] == [f"simple_python_{i}" for i in range(5)]
    refs = {t.id: t for t in load_bfcl("simple_python", limit=5)}
    for task in tasks:
        res = env.reset(task)
        assert [t.name for t in res.tools] == [t.name for t in refs[task.id].tools]
        gt = refs[task.id].reference.data["ground_truth"][0]
        name = next(iter(gt))
        args = {k: v[0] for k, v in gt[name].items() if v and v[0] != ""}
        for call_args in (args, {}):  # the ground truth's first choice, and a call with no arguments
            env.reset(task)
            action = Message(role="assistant", tool_calls=[ToolCall(id="a", name=name, arguments=call_args)])
            out = env.step(action)
            text = "<tool_call>\n" + json.dumps({"name": name, "arguments": call_args}) + "\n</tool_call>"
            want = score_single_turn(refs[task.id], text, default_parse_fn("hermes"))
            assert (out.done, out.info["success"], out.info["bfcl_reason"]) == (True, want.valid, want.reason)
            assert env.success() is want.valid
            assert want.valid is bool(call_args)  # every one of these entries needs an argument
    env.reset(tasks[0])  # an answer that did not parse is BFCL's format error
    out = env.step(Message(role="assistant", content="x", extra={"parse_errors": ["bad json"], "raw_text": "x"}))
    assert out.info["bfcl_reason"] == "format_error" and not env.success()


def test_train_turns_config_errors(tiny_dir):
    from trajtune.algorithms.rl import RLRunConfig
    from trajtune.algorithms.self_correction import check_retry_env
    from trajtune.config import load_config
    from trajtune.errors import ConfigError

    base = [f"model={tiny_dir}", "output_dir=o"]
    with pytest.raises(ConfigError, match="works with rl.credit: episode"):
        load_config(None, RLRunConfig, base + ["env=home", "rl.train_turns=reflection", "rl.credit=turn"])
    with pytest.raises(ConfigError, match="masked_in_baseline"):
        load_config(None, RLRunConfig, base + ["env=home", "rl.train_turns=retry", "rl.masked_in_baseline=true"])
    with pytest.raises(ConfigError, match="wrap the environment"):
        check_retry_env(make_env("home"), "reflection")
    with pytest.raises(ConfigError, match="no reflection turn"):
        check_retry_env(make_env("retry", env="home", reflect=False), "reflection")
    check_retry_env(make_env("retry", env="home", reflect=False), "retry")  # fine


def test_rl_run_trains_only_reflections(tmp_path, tiny_dir):
    from trajtune.algorithms.rl import RLRunConfig
    from trajtune.config import load_config
    from trajtune.train import run

    out = tmp_path / "rl"
    cfg = load_config(None, RLRunConfig, [
        f"model={tiny_dir}", f"output_dir={out}", "env.name=retry", "env.kwargs.env=home",
        "rl.train_turns=reflection", "rollout.max_turns=8", "rl.tasks_per_step=2", "rl.group_size=3",
        "train.steps=1", "report=false"])
    run(cfg, quiet=True)
    eps = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    assert len(eps) == 6
    reflected = [e for e in eps if any(m.get("extra", {}).get("retry") == "reflect" for m in e["messages"])]
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in metrics if "reflection/episodes" in r)
    assert step["reflection/episodes"] == pytest.approx(len(reflected) / 6)
    assert reflected  # the tiny model fails some home tasks
    for e in eps:
        assert e["metadata"]["env"] == "retry(home)"
        if e not in reflected:  # nothing of it trains
            assert e["metadata"].get("advantage", 0.0) == 0.0
        assert retry_marks(Trajectory.model_validate({k: v for k, v in e.items() if k != "step"})) in (
            [], ["reflect"], ["reflect", "retry"])


def test_eval_reports_first_and_second_attempt_success():
    """``trajtune eval`` through the wrapper: a scripted model fails the first attempt of the tasks
    whose request has an odd length, reflects, then makes the right call."""
    from trajtune.eval.backends import TextBackend
    from trajtune.eval.harness import EvalSettings, run_evaluation

    kwargs = {"single_turn": True, "system_prompt": False}
    tasks = make_env("fncall", **kwargs).tasks("test", 6, seed=0)
    right = {}
    for t in tasks:
        call = _right_call(t).tool_calls[0]
        request = make_env("fncall", **kwargs).reset(t).messages[-1].text()
        right[request] = "<tool_call>\n" + json.dumps({"name": call.name, "arguments": call.arguments}) + "\n</tool_call>"
    fails = {r for r in right if len(r) % 2}

    def gen(messages, tools):
        last = messages[-1]
        if last.extra.get("retry") == "reflect":
            return "I called the wrong function; I will call the one the request asks for."
        request = messages[0].text()
        if last.extra.get("retry") == "retry" or request not in fails:
            return right[request]
        return '<tool_call>\n{"name": "no_such_function", "arguments": {}}\n</tool_call>'

    env_kwargs = {"env": "fncall", "kwargs": kwargs}
    r = run_evaluation(EvalSettings(model="scripted", env="retry", env_kwargs=env_kwargs, tasks=6, batch_size=3),
                       TextBackend(gen))
    m, n_fail = r["metrics"], len(fails)
    assert 0 < n_fail < 6
    assert m["success"] == 1.0
    assert m["retry"]["first_attempt_success"] == pytest.approx((6 - n_fail) / 6)
    assert m["retry"]["success_by_attempt"] == {"1": pytest.approx((6 - n_fail) / 6), "2": 1.0}
    assert m["retry"]["retried"] == pytest.approx(n_fail / 6) and m["retry"]["recovered"] == 1.0
    assert m["retry"]["reflections"] == n_fail and m["mean_turns"] == pytest.approx(1 + 2 * n_fail / 6)
