"""``fncall``: randomised function-calling tasks, the AST-style call check, the expert, splits and holdouts."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
from typer.testing import CliRunner

from trajtune.cli.main import app
from trajtune.envs import make_env
from trajtune.errors import EnvError
from trajtune.envs.fncall import check_action, synthetic_result
from trajtune.envs.fncall_gen import function_pool, name_candidates, num_text
from trajtune.envs.fncall_vocab import FUNCS, HOLDOUT_DOMAINS, PARAMS, _P, Param
from trajtune.schema import Message, ToolCall, read_trajectories

runner = CliRunner()

# A hand-written target (not produced by the generator) for the verifier tests.
SCHEMA = {"type": "object", "required": ["city", "days", "rate", "unit", "scores"], "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "rate": {"type": "number"},
    "unit": {"type": "string", "enum": ["metric", "imperial"]}, "scores": {"type": "array", "items": {"type": "integer"}},
    "hourly": {"type": "boolean"}, "limit": {"type": "integer"}}}
TARGET = {"name": "weather.get_forecast", "arguments": {"city": "New York", "days": 5, "rate": 2.0, "unit": "metric",
                                                       "scores": [3, 1, 2], "hourly": True},
          "defaults": {"hourly": False, "limit": 10}}
GOOD = dict(TARGET["arguments"])


def verdict(args=None, name="weather.get_forecast", raw=None):
    call = ToolCall(id="c1", name=name, arguments=args, arguments_raw=raw)
    return check_action(Message(role="assistant", tool_calls=[call]), TARGET, SCHEMA).kind


def test_verifier_accepts_the_expected_call_and_benchmark_tolerances():
    assert verdict(GOOD) == "correct"
    assert verdict({**GOOD, "rate": 2}) == "correct"  # an int where a number is expected
    assert verdict({**GOOD, "city": "new york!"}) == "correct"  # case and punctuation do not matter
    assert verdict({**GOOD, "limit": 10}) == "correct"  # an optional parameter given its default
    assert verdict(raw=json.dumps(GOOD)) == "correct"  # arguments only as raw JSON text


def test_verifier_accepts_an_omitted_optional_parameter():
    target = {**TARGET, "arguments": {k: v for k, v in GOOD.items() if k != "hourly"}}
    call = ToolCall(id="c1", name=TARGET["name"], arguments=target["arguments"])
    assert check_action(Message(role="assistant", tool_calls=[call]), target, SCHEMA).kind == "correct"


@pytest.mark.parametrize("args,name,kind", [
    (GOOD, "weather.get_weather", "wrong_name"),
    ({k: v for k, v in GOOD.items() if k != "days"}, None, "missing_param"),
    ({k: v for k, v in GOOD.items() if k != "hourly"}, None, "missing_param"),  # mentioned optional left out
    ({**GOOD, "country": "US"}, None, "extra_param"),
    ({**GOOD, "days": 5.0}, None, "wrong_type"),  # a float for an integer, even a whole one
    ({**GOOD, "days": "5"}, None, "wrong_type"),
    ({**GOOD, "days": True}, None, "wrong_type"),
    ({**GOOD, "hourly": 1}, None, "wrong_type"),
    ({**GOOD, "scores": [3, 1, 2.5]}, None, "wrong_type"),
    ({**GOOD, "unit": "kelvin"}, None, "wrong_value"),  # not in the enum
    ({**GOOD, "unit": "imperial"}, None, "wrong_value"),  # in the enum, but not what was asked
    ({**GOOD, "city": "Newark"}, None, "wrong_value"),
    ({**GOOD, "rate": 2.5}, None, "wrong_value"),
    ({**GOOD, "scores": [1, 2, 3]}, None, "wrong_value"),  # lists are order-sensitive
    ({**GOOD, "limit": 3}, None, "wrong_value"),  # an optional that was not asked for, not at its default
])
def test_verifier_rejects(args, name, kind):
    assert verdict(args, name=name or TARGET["name"]) == kind


def test_verifier_rejects_bad_shapes():
    assert verdict(raw="{not json") == "format_error"
    msg = Message(role="assistant", content="It will be sunny.")
    assert check_action(msg, TARGET, SCHEMA).kind == "no_call"
    two = [ToolCall(id=f"c{i}", name=TARGET["name"], arguments=GOOD) for i in range(2)]
    assert check_action(Message(role="assistant", tool_calls=two), TARGET, SCHEMA).kind == "multiple_calls"


def test_tasks_are_deterministic_by_seed():
    env = make_env("fncall")
    a, b = env.tasks("train", 30, seed=4), env.tasks("train", 30, seed=4)
    assert [t.data for t in a] == [t.data for t in b]
    c = env.tasks("train", 30, seed=5)
    assert [t.data["prompt"] for t in a] != [t.data["prompt"] for t in c]


@pytest.mark.parametrize("single_turn", [False, True])
def test_expert_solves_every_task(single_turn):
    env = make_env("fncall", single_turn=single_turn)
    for task in env.tasks("train", 200, seed=0):
        traj = make_env("fncall", single_turn=single_turn).expert(task)
        assert traj.outcome.success and traj.reward == 1.0 and traj.outcome.termination == "done", traj.metadata
        last = traj.messages[-1]
        assert last.role == "assistant"
        if single_turn:
            assert last.tool_calls and not any(m.role == "tool" for m in traj.messages)
        else:
            assert not last.tool_calls and [m.role for m in traj.messages].count("tool") == 1


def _stated(p: Param, value, prompt: str) -> bool:
    if p.type == "boolean":
        return any(ph in prompt for ph in (p.yes if value else p.no))
    if isinstance(value, list):
        return all(_stated(p, x, prompt) for x in value)
    text = num_text(value) if isinstance(value, (int, float)) else value
    # not part of a longer word or number ("1860s", a decade, is fine)
    return re.search(r"(?<![\w.])" + re.escape(text) + r"(?!\.\d)(?:s\b|(?!\w))", prompt) is not None


def test_every_argument_value_is_stated_exactly_in_the_request():
    for task in make_env("fncall").tasks("train", 400, seed=2):
        target = task.data["target"]
        for name, value in target["arguments"].items():
            assert _stated(PARAMS[target["params"][name]], value, task.data["prompt"]), (name, value, task.data["prompt"])


def test_wrong_call_ends_the_episode_with_an_error_and_no_success():
    env = make_env("fncall")
    task = next(t for t in env.tasks("train", 50, seed=0) if len(t.data["tools"]) > 1)
    env.reset(task)
    other = next(t["name"] for t in task.data["tools"] if t["name"] != task.data["target"]["name"])
    res = env.step(Message(role="assistant", tool_calls=[ToolCall(id="c1", name=other, arguments={})]))
    assert res.done and res.reward == 0.0 and not env.success() and res.info["call_check"] == "wrong_name"
    assert res.observations[0].tool_call_id == "c1" and res.observations[0].text().startswith("Error:")


def test_correct_call_gets_a_deterministic_result_then_text_ends_the_episode():
    env = make_env("fncall")
    task = env.tasks("test", 1, seed=3)[0]
    env.reset(task)
    t = task.data["target"]
    res = env.step(Message(role="assistant", tool_calls=[ToolCall(id="c9", name=t["name"], arguments=t["arguments"])]))
    assert not res.done and res.reward == 1.0 and env.success()
    assert json.loads(res.observations[0].text()) == synthetic_result(t["name"], t["arguments"], task.data["result"])
    again = env.step(Message(role="assistant", tool_calls=[ToolCall(id="c10", name=t["name"], arguments=t["arguments"])]))
    assert not again.done and again.observations[0].text().startswith("Error:")
    assert env.step(Message(role="assistant", content="Done.")).done and env.success()


def test_synthetic_result_depends_on_the_call():
    spec = {"kind": "number", "noun": "compound interest", "family": "calc"}
    assert synthetic_result("f", {"a": 1}, spec) == synthetic_result("f", {"a": 1}, spec)
    assert synthetic_result("f", {"a": 1}, spec) != synthetic_result("f", {"a": 2}, spec)


def test_single_turn_text_reply_is_a_failed_episode():
    env = make_env("fncall", single_turn=True)
    env.reset(env.tasks("train", 1)[0])
    res = env.step(Message(role="assistant", content="I don't know."))
    assert res.done and res.reward == 0.0 and res.info["call_check"] == "no_call" and not env.success()


@pytest.mark.parametrize("holdout", ["none", "functions", "domains"])
def test_train_and_test_tasks_are_disjoint(holdout):
    env = make_env("fncall", holdout=holdout)
    train, test = env.tasks("train", 300, seed=1), env.tasks("test", 300, seed=1)
    assert not {t.seed for t in train} & {t.seed for t in test}
    assert not {t.data["prompt"] for t in train} & {t.data["prompt"] for t in test}


@pytest.mark.parametrize("holdout", ["functions", "domains"])
def test_holdout_test_tasks_share_no_function_name_with_train(holdout):
    env = make_env("fncall", holdout=holdout)
    names = {split: {tool["name"] for t in env.tasks(split, 600, seed=0) for tool in t.data["tools"]}
             for split in ("train", "test")}
    assert names["train"] and names["test"] and not names["train"] & names["test"]
    test_domains = {t.data["domain"] for t in env.tasks("test", 300, seed=0)}
    if holdout == "domains":
        assert test_domains <= set(HOLDOUT_DOMAINS)
        assert not {t.data["domain"] for t in env.tasks("train", 300, seed=0)} & set(HOLDOUT_DOMAINS)
    else:
        assert len(test_domains) >= 10  # held-out functions are spread over the domains
    held = function_pool("test", holdout)
    assert 0.1 < len(held) / len(FUNCS) < 0.35


def test_no_two_functions_can_get_the_same_name():
    owner: dict[str, str] = {}
    for f in FUNCS:
        plain, dotted = name_candidates(f)
        for n in plain + dotted:
            assert owner.setdefault(n, f.key) == f.key, f"{n!r} is a name of both {owner[n]} and {f.key}"
            assert re.fullmatch(r"([a-z_]+\.)?[a-z][a-z0-9_]*", n), n


def test_vocabulary_is_consistent():
    assert len({p.key for p in _P}) == len(_P)  # no key defined twice
    for f in FUNCS:
        assert 1 <= len(f.params) <= 5, f.key
        assert any(not k.startswith("?") for k in f.params), f.key
        for ref in f.params:
            p = PARAMS[ref.lstrip("?")]
            if ref.startswith("?"):
                assert p.default is not None, f"{f.key}: optional {p.key} has no default"
        if f.family in ("check", "convert"):
            assert f.asks, f"{f.key}: check/convert functions need explicit request phrases"
    for p in _P:
        assert all("{v}" in s for s in p.says), p.key
        if p.type == "enum" and p.default is not None:
            assert p.default in p.pool, p.key
        if p.pool:  # case/punctuation-insensitive comparison must not merge two different values
            norm = [re.sub(r"[\W_]+", "", x.lower()) for x in p.pool]
            assert len(set(norm)) == len(norm) and all(norm), p.key


def test_variety_over_2000_tasks_is_above_a_floor():
    tasks = [t.data for t in make_env("fncall").tasks("train", 2000, seed=0)]
    target = [next(s for s in d["tools"] if s["name"] == d["target"]["name"]) for d in tasks]
    assert len({d["target"]["name"] for d in tasks}) >= 1200
    assert len({json.dumps(s, sort_keys=True) for s in target}) >= 1800
    assert len({d["function"] for d in tasks}) >= 220 and len({d["domain"] for d in tasks}) >= 25
    assert len({d["template"] for d in tasks}) >= 1000 and len({d["skeleton"] for d in tasks}) >= 1900
    kinds = Counter("enum" if "enum" in p else p["type"] for s in target for p in s["parameters"]["properties"].values())
    assert set(kinds) == {"string", "integer", "number", "boolean", "array", "enum"} and min(kinds.values()) >= 40
    assert set(Counter(len(d["tools"]) for d in tasks)) == {1, 2, 3, 4}
    domain_of = {n: f.domain for f in FUNCS for n in sum(name_candidates(f), [])}
    near = sum(any(domain_of[s["name"]] == d["domain"] for s in d["tools"] if s["name"] != d["target"]["name"])
               for d in tasks)
    assert near >= 600  # several tools of the target's domain in many tasks
    assert any("." in d["target"]["name"] for d in tasks) and any(len(s["parameters"]["required"]) < len(
        s["parameters"]["properties"]) for s in target)


def test_same_domain_distractors_follow_the_option():
    def share(p: float) -> float:
        tasks = make_env("fncall", same_domain=p, min_distractors=3).tasks("train", 200, seed=0)
        pairs = [(d.data["domain"], t["name"]) for d in tasks for t in d.data["tools"] if t["name"] != d.data["target"]["name"]]
        by_name = {n: f.domain for f in FUNCS for n in sum(name_candidates(f), [])}
        return sum(by_name[n] == dom for dom, n in pairs) / len(pairs)

    assert share(1.0) > 0.9 and share(0.0) < 0.3


def test_options_are_validated():
    with pytest.raises(ValueError, match="nope"):
        make_env("fncall", nope=1)
    with pytest.raises(ValueError, match="min_distractors"):
        make_env("fncall", min_distractors=3, max_distractors=1)
    assert {len(t.data["tools"]) for t in make_env("fncall", max_distractors=0).tasks("train", 20)} == {1}


def test_generate_writes_valid_ir_for_both_shapes(tmp_path):
    out = tmp_path / "fc.jsonl"
    r = runner.invoke(app, ["data", "generate", "--env", "fncall", "--n", "50", "-o", str(out)])
    assert r.exit_code == 0 and "50/50 expert successes" in r.output, r.output
    r = runner.invoke(app, ["data", "validate", str(out), "--strict"])
    assert r.exit_code == 0, r.output
    one = tmp_path / "fc1.jsonl"
    r = runner.invoke(app, ["data", "generate", "--env", "fncall", "--n", "20", "-o", str(one), "--env-arg", "single_turn=true"])
    assert r.exit_code == 0, r.output
    trajs = list(read_trajectories(one))
    assert len(trajs) == 20 and all(t.messages[-1].tool_calls and t.outcome.success for t in trajs)
    r = runner.invoke(app, ["data", "generate", "--env", "fncall", "--n", "2", "-o", str(tmp_path / "x.jsonl"),
                            "--env-arg", "holdout=sideways"])
    assert r.exit_code == EnvError.exit_code and "holdout" in r.output and "Traceback" not in r.output


def test_envs_show_documents_fncall():
    r = runner.invoke(app, ["envs", "show", "fncall"])
    assert r.exit_code == 0 and "single_turn" in r.output and "success=True" in r.output, r.output


def test_system_prompt_can_be_left_out_like_single_turn_benchmarks():
    env = make_env("fncall", single_turn=True, system_prompt=False)
    task = env.tasks("train", 1, seed=3)[0]
    traj = env.expert(task)
    assert [m.role for m in traj.messages] == ["user", "assistant"]
    with_system = make_env("fncall", single_turn=True).expert(task)
    assert with_system.messages[0].role == "system" and with_system.messages[1:] == traj.messages


# -- the decomposed call reward (info["reward_terms"]) ---------------------------------------------

def terms(args=None, name="weather.get_forecast", raw=None, calls=None):
    from trajtune.envs.fncall import call_terms

    if calls is None:
        calls = [ToolCall(id="c1", name=name, arguments=args, arguments_raw=raw)]
    return call_terms(Message(role="assistant", tool_calls=calls), TARGET, SCHEMA)


def test_call_terms_of_the_right_call_are_all_one():
    assert terms(GOOD) == {"call_format": 1.0, "call_name": 1.0, "call_required": 1.0, "call_types": 1.0,
                           "call_values": 1.0}


def test_call_terms_count_parts_by_hand():
    # SCHEMA requires 5 (city days rate unit scores); TARGET expects 6 (the 5 + hourly)
    no_days = {k: v for k, v in GOOD.items() if k != "days"}
    assert terms(no_days) == {"call_format": 1.0, "call_name": 1.0, "call_required": 4 / 5, "call_types": 1.0,
                              "call_values": 5 / 6}
    # a string for the integer: present (required ok), 1 of 6 given has the wrong type, its value is wrong
    assert terms({**GOOD, "days": "5"}) == {"call_format": 1.0, "call_name": 1.0, "call_required": 1.0,
                                            "call_types": 5 / 6, "call_values": 5 / 6}
    # an unknown parameter: wrong type (the schema lacks it) and a wrong value over 7 keys
    t = terms({**GOOD, "country": "US"})
    assert t["call_types"] == 6 / 7 and t["call_values"] == 6 / 7 and t["call_required"] == 1.0
    # an unasked optional at its default is right; away from it, wrong
    assert terms({**GOOD, "limit": 10})["call_values"] == 1.0
    assert terms({**GOOD, "limit": 3})["call_values"] == 6 / 7
    # two wrong values of six
    assert terms({**GOOD, "city": "Newark", "unit": "imperial"})["call_values"] == 4 / 6


def test_call_terms_of_calls_that_are_not_json_wrong_name_or_not_one_call():
    zero = dict.fromkeys(["call_format", "call_name", "call_required", "call_types", "call_values"], 0.0)
    assert terms(raw='{"city": "New York", "days": 5C}') == {**zero, "call_name": 1.0}  # a number with its unit
    assert terms(GOOD, name="weather.get_weather") == {**zero, "call_format": 1.0}
    assert terms(calls=[]) == zero
    two = [ToolCall(id=f"c{i}", name=TARGET["name"], arguments=GOOD) for i in range(2)]
    assert terms(calls=two) == zero
    assert terms({}) == {"call_format": 1.0, "call_name": 1.0, "call_required": 0.0, "call_types": 0.0,
                         "call_values": 0.0}


def test_the_environment_reports_the_call_terms_on_the_call_turn():
    env = make_env("fncall", single_turn=True)
    task = env.tasks("train", 1, seed=3)[0]
    env.reset(task)
    target = task.data["target"]
    args = dict(target["arguments"])
    first = next(iter(args))
    args.pop(first)
    res = env.step(Message(role="assistant", tool_calls=[ToolCall(id="c", name=target["name"], arguments=args)]))
    rt = res.info["reward_terms"]
    assert rt["call_format"] == 1.0 and rt["call_name"] == 1.0
    assert rt["call_values"] == pytest.approx((len(target["arguments"]) - 1) / len(target["arguments"]))
    assert res.reward == 0.0
