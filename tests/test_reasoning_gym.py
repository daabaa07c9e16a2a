"""reasoning-gym plug-in: real entries of the real package, scored by the package's own verifiers."""

from __future__ import annotations

import json
import sys

import pytest
import reasoning_gym
from turns import say

from trajtune.envs import make_env
from trajtune.errors import EnvError
from trajtune.eval.backends import TextBackend
from trajtune.eval.harness import EvalSettings, run_evaluation
from trajtune.eval.store import EvalStore
from trajtune.plugins.reasoning_gym_env import (
    ReasoningGymEnv,
    ReasoningGymNotInstalledError,
    split_overlap,
)
from trajtune.schema import Message, ToolCall

SMALL = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


def _true_value(question: str) -> int:
    """The value of a basic_arithmetic question, computed here (integers, + - * and exact /)."""
    import ast
    import operator

    ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.USub: operator.neg}

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.UnaryOp):
            return ops[type(node.op)](ev(node.operand))
        assert isinstance(node, ast.BinOp)
        return ops[type(node.op)](ev(node.left), ev(node.right))

    value = ev(ast.parse(question.removeprefix("Calculate").strip().rstrip("."), mode="eval").body)
    assert value == int(value)
    return int(value)


def test_tasks_are_the_packages_entries_by_seed_and_splits_never_share_a_seed():
    env = make_env("reasoning_gym", dataset="basic_arithmetic", config=SMALL)
    train, test = env.tasks("train", 20, seed=3), env.tasks("test", 20, seed=3)
    assert {t.seed % 2 for t in train} == {0} and {t.seed % 2 for t in test} == {1}
    for t in train[:5] + test[:5]:
        want = reasoning_gym.create_dataset("basic_arithmetic", seed=t.seed, size=1, **SMALL)[0]
        assert (t.data["question"], t.data["answer"]) == (want["question"], want["answer"])
        assert int(t.data["answer"]) == _true_value(t.data["question"])  # the reference is right
    assert [t.data for t in env.tasks("train", 20, seed=3)] == [t.data for t in train]  # deterministic


def test_answers_are_scored_by_the_package_from_the_last_answer_tags():
    env = ReasoningGymEnv(dataset="basic_arithmetic", config=SMALL)
    task = env.tasks("test", 1)[0]
    right = _true_value(task.data["question"])
    res = env.reset(task)
    assert [m.role for m in res.messages] == ["system", "user"] and res.tools == []
    assert "<answer>" in res.messages[0].text() and res.messages[1].text() == task.data["question"]

    cases = [
        (f"Thinking... <answer>{right}</answer>", 1.0, "correct", 1.0),
        (f"<answer>{right + 1}</answer> no wait <answer>{right}</answer>", 1.0, "correct", 1.0),  # the last counts
        (f"<answer>{right}</answer> no wait <answer>{right + 1}</answer>", 0.0, "wrong", 1.0),
        (f"The answer is {right}.", 0.0, "no_answer_tag", 0.0),
    ]
    for text, reward, check, fmt in cases:
        env.reset(task)
        out = env.step(say(text))
        assert out.done and out.reward == reward and out.info["answer_check"] == check, text
        assert out.info["reward_terms"] == {"answer_format": fmt, "answer_score": reward}
        assert env.success() is (reward == 1.0)
    env.reset(task)
    out = env.step(Message(role="assistant", tool_calls=[ToolCall(id="c0", name="calc", arguments={})]))
    assert (out.reward, out.info["answer_check"], env.success()) == (0.0, "tool_call", False)


def test_partial_credit_is_the_packages_score_and_not_a_success():
    env = ReasoningGymEnv(dataset="basic_arithmetic", config=SMALL)
    task = env.tasks("train", 1)[0]
    env.reset(task)
    ds = reasoning_gym.create_dataset("basic_arithmetic", seed=task.seed, size=1, **SMALL)
    text = f"{task.data['answer']}.0"  # scored by basic_arithmetic's own rule, whatever it is
    want = float(ds.score_answer(text, ds[0]))
    out = env.step(say(f"<answer>{text}</answer>"))
    assert out.reward == want and env.success() is (want >= 1.0)
    assert out.info["answer_check"] == ("correct" if want >= 1 else "partial" if want > 0 else "wrong")


def test_expert_writes_the_reference_answer_and_succeeds_on_other_generators():
    for dataset in ("basic_arithmetic", "letter_counting", "spell_backward"):
        env = make_env("reasoning_gym", dataset=dataset)
        for task in env.tasks("train", 3, seed=1):
            traj = env.expert(task)
            assert traj.outcome.success and traj.reward == 1.0, (dataset, task.id)
            assert traj.messages[-1].text() == f"<answer>{task.data['answer']}</answer>"


def test_without_system_prompt_the_question_is_the_whole_prompt():
    env = ReasoningGymEnv(dataset="letter_counting", system_prompt=False)
    task = env.tasks("test", 1)[0]
    res = env.reset(task)
    assert [(m.role, m.text()) for m in res.messages] == [("user", task.data["question"])]


@pytest.mark.parametrize(("options", "says"), [
    ({"dataset": "no_such_generator"}, "'no_such_generator'"),
    ({"config": {"bogus_setting": 1}}, "bogus_setting"),
    ({"config": {"min_terms": 5, "max_terms": 2}}, "max_terms must be >= min_terms"),
    ({"prompt": "chatty"}, "option prompt"),
    ({"datset": "chain_sum"}, "option datset"),
])
def test_bad_options_are_one_clear_error(options, says):
    with pytest.raises(EnvError, match="reasoning_gym") as e:
        make_env("reasoning_gym", **options)
    assert says in str(e.value)
    if options.get("dataset") == "no_such_generator":
        assert "basic_arithmetic" in str(e.value)  # the known generators are listed


def test_a_task_of_another_generator_is_refused():
    task = make_env("reasoning_gym", dataset="letter_counting").tasks("test", 1)[0]
    with pytest.raises(EnvError, match="letter_counting"):
        make_env("reasoning_gym", dataset="basic_arithmetic").reset(task)


def test_missing_package_names_the_install_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import reasoning_gym now raises ImportError
    with pytest.raises(ReasoningGymNotInstalledError, match=r"pip install 'trajtune\[reasoning-gym\]'"):
        ReasoningGymEnv()


def test_split_overlap_counts_test_questions_seen_in_training():
    env = ReasoningGymEnv(dataset="basic_arithmetic", config=SMALL)  # a small task space: repeats happen
    train = {t.data["question"] for t in env.tasks("train", 150)}
    test = [t.data["question"] for t in env.tasks("test", 60)]
    want = sum(q in train for q in test)
    assert 0 < want < 60
    assert split_overlap(env, 150, 60) == want


def test_an_evaluation_scores_each_episode_by_the_package(tmp_path):
    """Through the eval harness (as `trajtune eval --env reasoning_gym` runs it): a policy that is right
    on every other task gets exactly those tasks, and every reward is the package's score."""
    calls = {"n": 0}

    def gen(messages, tools):
        calls["n"] += 1
        q = messages[-1].text()
        value = _true_value(q) + (0 if calls["n"] % 2 else 1)
        return f"<answer>{value}</answer>"

    s = EvalSettings(model="scripted", env="reasoning_gym", env_kwargs={"dataset": "basic_arithmetic", "config": SMALL},
                     tasks=6, workers=1, batch_size=1, max_turns=1)
    with EvalStore(tmp_path / "ev", s.as_dict()) as store:
        r = run_evaluation(s, TextBackend(gen, workers=1), store=store)
    assert r["metrics"]["episodes"] == 6 and r["metrics"]["success"] == pytest.approx(0.5)
    episodes = [json.loads(line) for line in (tmp_path / "ev" / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 6
    for ep in episodes:
        q = ep["messages"][-2]["content"]
        ds = reasoning_gym.create_dataset("basic_arithmetic", seed=ep["metadata"]["seed"], size=1, **SMALL)
        assert ds[0]["question"] == q
        got = ep["messages"][-1]["content"].removeprefix("<answer>").removesuffix("</answer>")
        assert ep["reward"] == ds.score_answer(got, ds[0]) and ep["outcome"]["success"] is (ep["reward"] == 1.0)
