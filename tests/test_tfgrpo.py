"""algorithm: tfgrpo (training-free GRPO): the library's operations merge as ALGORITHMS.md says,
all-equal groups teach nothing, garbage from the LLM is counted and never fatal, a run changes no
weight, saves and resumes its library, and `trajtune eval --experiences` puts it in the prompt the
run's rollouts had."""

from __future__ import annotations

import hashlib
import json

import pytest

from trajtune.algorithms.tfgrpo import (
    LessonSource,
    Op,
    TFGRPORunConfig,
    TFGRPOSpec,
    keep_group,
    lesson_ids,
    merge_ops,
    parse_ops,
)
from trajtune.envs.adapters.experiences import LESSONS_HEADER, inject_lessons, load_experiences
from trajtune.envs.base import Environment, ResetResult, StepResult, Task
from trajtune.errors import DataError
from trajtune.rollout import Episode
from trajtune.schema import Message, Trajectory

ENV = "test_tfgrpo:ParityEnv"


class ParityEnv(Environment):
    """One reply per episode; reward 1 for about half of all replies (by a hash of the text), so a sampled
    group usually has mixed rewards."""

    name = "parity"
    deterministic = True
    max_turns = 1

    def tasks(self, split, n, seed=0):
        return [Task(id=f"parity-{split}-{i}", seed=i, split=split, data={}) for i in range(n)]

    def reset(self, task):
        self.ok = False
        return ResetResult(messages=[Message(role="system", content="You are a test agent."),
                                     Message(role="user", content=f"Say something ({task.id}).")], tools=[])

    def step(self, action):
        self.ok = hashlib.sha256((action.text() or "").encode()).digest()[0] % 2 == 0
        return StepResult(observations=[], reward=float(self.ok), done=True)

    def success(self):
        return self.ok


# -- the ALGORITHMS.md vector ------------------------------------------------------------------


def test_delete_wins_over_update_and_an_unknown_update_is_an_add_then_ids_are_reindexed():
    ops = [Op("UPDATE", 0, "a2"), Op("DELETE", 0), Op("ADD", text="x"), Op("UPDATE", 99, "y")]
    assert lesson_ids(merge_ops(["a"], ops)) == {"G0": "x", "G1": "y"}
    # the same operations in another order merge the same way; the last UPDATE of an id wins
    assert lesson_ids(merge_ops(["a"], [Op("DELETE", 0), Op("UPDATE", 0, "a2"), Op("ADD", text="x"),
                                         Op("UPDATE", 99, "y")])) == {"G0": "x", "G1": "y"}
    assert merge_ops(["a", "b", "c"], [Op("UPDATE", 2, "c1"), Op("UPDATE", 2, "c2"), Op("DELETE", 0),
                                       Op("ADD", text="b")]) == ["b", "c2"]  # "b" is already there


def test_groups_whose_rewards_are_all_equal_are_skipped():
    assert not keep_group([1, 1, 1, 1, 1]) and not keep_group([0, 0, 0, 0, 0])
    assert keep_group([1, 0, 0, 0, 0]) and keep_group([0.5] * 5) and not keep_group([])


def _episode(reward: float, text: str = "hi") -> Episode:
    msgs = [Message(role="user", content="Say something."), Message(role="assistant", content=text)]
    return Episode(trajectory=Trajectory(id="e", messages=msgs, reward=reward), tokens=None)  # type: ignore[arg-type]


def test_skipped_groups_ask_the_llm_nothing_and_kept_ones_propose_operations():
    asked: list[list[Message]] = []

    def ask(messages):
        asked.append(messages)
        return "summary" if "review one attempt" in messages[0].content else \
            'Here you go:\n```json\n[{"op": "ADD", "text": "x"}, {"op": "ADD", "text": "y"}, {"op": "ADD", "text": "z"}]\n```'

    src = LessonSource(None, ParityEnv, [], None, TFGRPOSpec(group_size=5), ask)
    groups = [[_episode(1.0)] * 5, [_episode(0.0)] * 5, [_episode(1.0)] + [_episode(0.0)] * 4]
    ops, m = src.propose(groups)
    assert len(asked) == 6  # five summaries and one comparison, for the one kept group
    assert ops == [Op("ADD", text="x"), Op("ADD", text="y")]  # at most max_lessons_per_group (2)
    assert m == {"groups_kept": 1.0, "groups_skipped": 2.0, "ops": 2.0, "llm_failures": 0.0}
    assert "Attempt 1 (reward 1)" in asked[-1][1].content and "(none yet)" in asked[-1][1].content


def test_garbage_and_failed_llm_replies_are_counted_as_no_operations():
    replies = iter(["fine", "ok", "no json here {oops", "fine", "ok", '{"op": "FLY"}'])

    def ask(messages):
        r = next(replies)
        if r == "ok":
            raise ValueError("the judge failed: TimeoutError")
        return r

    src = LessonSource(None, ParityEnv, [], None, TFGRPOSpec(group_size=2, workers=1), ask)
    ops, m = src.propose([[_episode(1.0), _episode(0.0)], [_episode(0.0), _episode(1.0)]])
    assert ops == [] and m["llm_failures"] == 3.0  # a failed summary and comparison, an unknown operation
    # the tolerant reader: fenced, wrapped in an object, ids as "G1" or 1; non-operations are left out
    assert parse_ops('```\n{"operations": [{"op": "delete", "id": "G1"}, {"op": "NONE"}, 7]}\n```') == [Op("DELETE", 1)]
    assert parse_ops('I propose {"op": "UPDATE", "id": 0, "text": " t "}') == [Op("UPDATE", 0, "t")]
    assert parse_ops("[]") == []
    for bad in ("", "nothing to add", "[1, 2]", '[{"op": "ADD"}]'):
        with pytest.raises(ValueError):
            parse_ops(bad)


def test_lessons_go_at_the_end_of_the_system_prompt_or_in_a_new_one():
    msgs = [Message(role="system", content="Be helpful."), Message(role="user", content="Hi")]
    out = inject_lessons(msgs, ["one", "two"])
    assert out[0].content == f"Be helpful.\n\n{LESSONS_HEADER}\n1. one\n2. two" and msgs[0].content == "Be helpful."
    bare = inject_lessons(msgs[1:], ["one"])
    assert [m.role for m in bare] == ["system", "user"] and inject_lessons(msgs, []) == msgs


def test_config_refuses_settings_that_would_do_nothing():
    base = {"model": "m", "output_dir": "o", "env": "home"}
    assert TFGRPORunConfig.model_validate(base).tfgrpo.temperature == 0.7
    for extra, word in [({"train": {"lr": 1e-3}}, "train.lr"), ({"tfgrpo": {"llm_model": "x"}}, "llm_model"),
                        ({"rollout": {"temperature": 0.5}}, "tfgrpo.temperature"), ({"eval": {}}, "--experiences"),
                        ({"tfgrpo": {"colour": 1}}, "colour")]:
        with pytest.raises(ValueError, match=word):
            TFGRPORunConfig.model_validate({**base, **extra})


# -- runs with a stub LLM ------------------------------------------------------------------------


def stub_llm_reply(body: dict) -> str:
    """The lesson LLM: summaries are one sentence; a comparison on an empty library adds two lessons
    (and a third, over the cap), on a non-empty one updates G0 and deletes G1."""
    system, user = body["messages"][0]["content"], body["messages"][-1]["content"]
    if "review one attempt" in system:
        return "The agent replied once."
    if "(none yet)" in user:
        return json.dumps([{"op": "ADD", "text": "Keep the reply short."}, {"op": "ADD", "text": "Count the characters."},
                           {"op": "ADD", "text": "Over the cap."}])
    return json.dumps([{"op": "UPDATE", "id": "G0", "text": "Keep the reply short and even."},
                       {"op": "DELETE", "id": "G1"}])


@pytest.fixture()
def stub_llm():
    from test_judge import FakeJudgeServer

    srv = FakeJudgeServer(stub_llm_reply)
    yield srv
    srv.close()




def _cfg(tiny_dir, out, llm, steps=2, extra=()):
    from trajtune.config import load_config

    return load_config(None, TFGRPORunConfig, [
        f"model={tiny_dir}", f"output_dir={out}", f"env={ENV}", "rollout.max_turns=1", "rollout.max_new_tokens=6",
        "rollout.max_length=256", "tfgrpo.tasks_per_step=2", "tfgrpo.group_size=4", "tfgrpo.n_train_tasks=4",
        f"tfgrpo.llm={llm}", "tfgrpo.max_tokens=8", "tfgrpo.workers=2", f"train.steps={steps}", "report=false",
        *extra])


#: The library after steps 1 and 2 of the seeded run with the stub LLM: step 1's two kept groups add
#: the same two lessons (a third is over the cap; duplicates merge), step 2 updates G0 and deletes G1.
STEP1 = {"G0": "Keep the reply short.", "G1": "Count the characters."}
STEP2 = {"G0": "Keep the reply short and even."}


def _jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_run_learns_lessons_keeps_the_weights_and_eval_puts_the_lessons_in_the_prompt(tmp_path, tiny_dir,
                                                                                        stub_llm, turns_end):
    import torch
    from safetensors.torch import load_file
    from typer.testing import CliRunner

    from trajtune.chat.render import ChatRenderer
    from trajtune.cli.main import app
    from trajtune.models.loading import load_tokenizer
    from trajtune.train import run

    out = tmp_path / "tf"
    result = run(_cfg(tiny_dir, out, f"openai:{stub_llm.url}"), quiet=True)
    steps = _jsonl(out / "metrics.jsonl")
    rollouts = _jsonl(out / "rollouts.jsonl")
    for s in steps:  # a group is kept when its rewards differ; the seeded rollouts have such groups at both steps
        rewards = [r["reward"] for r in rollouts if r["step"] == s["step"]]
        mixed = sum(len(set(rewards[g:g + 4])) > 1 for g in range(0, len(rewards), 4))
        assert s["groups_kept"] == mixed >= 1
    assert all(s["skipped"] == 1.0 and s["llm_failures"] == 0.0 for s in steps)  # no update was made
    log = _jsonl(out / "experiences.jsonl")
    assert log[0]["experiences"] == STEP1 and log[1]["experiences"] == STEP2
    saved = json.loads((out / "experiences.json").read_text())
    assert saved == {"step": 2, "experiences": log[1]["experiences"]} and result["experiences"] == str(out / "experiences.json")
    before, after = load_file(tiny_dir / "model.safetensors"), load_file(out / "final" / "model.safetensors")
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)

    # step 2's rollouts had step 1's lessons in the prompt
    step2_system = next(r for r in rollouts if r["step"] == 2)["messages"][0]["content"]
    assert "1. Keep the reply short.\n2. Count the characters." in step2_system
    assert all(LESSONS_HEADER not in r["messages"][0]["content"] for r in rollouts if r["step"] == 1)

    ev = tmp_path / "eval"
    r = CliRunner().invoke(app, ["eval", "--model", str(out / "final"), "--env", ENV, "--tasks", "2",
                                 "--max-new-tokens", "4", "--experiences", str(out), "--out", str(ev), "-q",
                                 "--no-report"])
    assert r.exit_code == 0, r.output
    episodes = [Trajectory.model_validate(e) for e in _jsonl(ev / "episodes.jsonl")]
    assert json.loads((ev / "run.json").read_text())["experiences"] == ["Keep the reply short and even."]
    tok = load_tokenizer(str(out / "final"))
    renderer = ChatRenderer(tok)
    for e in episodes:
        prompt = tok.decode(renderer.encode(renderer.prompt_text(e.messages[:2], e.tools)))
        assert f"{LESSONS_HEADER}\n1. Keep the reply short and even." in prompt
    # the eval prompt is the one the rollouts would have with the final library
    assert episodes[0].messages[0].content == inject_lessons([Message(role="system", content="You are a test agent.")],
                                                             ["Keep the reply short and even."])[0].content


def test_an_interrupted_run_resumes_from_the_library_of_its_checkpoint(tmp_path, tiny_dir, stub_llm, turns_end):
    from trajtune.train import run

    cut = tmp_path / "cut"
    assert run(_cfg(tiny_dir, cut, f"openai:{stub_llm.url}"), quiet=True, stop_after=1)["stopped"]
    assert json.loads((cut / "experiences.json").read_text()) == {"step": 1, "experiences": STEP1}
    with (cut / "experiences.jsonl").open("a") as f:  # a step the kill interrupted after the checkpoint
        f.write(json.dumps({"step": 2, "experiences": {"G0": "lost"}}) + "\n")
    run(_cfg(tiny_dir, cut, f"openai:{stub_llm.url}"), quiet=True, resume=True)
    # the library an uninterrupted run ends with (the test above), each step logged once
    assert [(r["step"], r["experiences"]) for r in _jsonl(cut / "experiences.jsonl")] == [(1, STEP1), (2, STEP2)]
    assert json.loads((cut / "experiences.json").read_text()) == {"step": 2, "experiences": STEP2}
    assert [r["step"] for r in _jsonl(cut / "rollouts.jsonl")] == [1] * 8 + [2] * 8


def test_the_policy_as_its_own_llm_answers_garbage_and_the_run_still_finishes(tmp_path, tiny_dir, turns_end):
    from trajtune.train import run

    out = tmp_path / "policy"
    run(_cfg(tiny_dir, out, "policy", steps=1), quiet=True)
    (m,) = _jsonl(out / "metrics.jsonl")
    assert m["groups_kept"] >= 1 and m["llm_failures"] >= m["groups_kept"]  # the tiny model writes no JSON
    assert m["lessons"] == 0.0 and json.loads((out / "experiences.json").read_text())["experiences"] == {}


def test_experiences_files_are_read_or_refused_with_the_fix(tmp_path):
    (tmp_path / "a.json").write_text('["one", "two"]')
    assert load_experiences(tmp_path / "a.json") == ["one", "two"]
    (tmp_path / "b.json").write_text('{"experiences": 3}')
    with pytest.raises(DataError, match="experiences"):
        load_experiences(tmp_path / "b.json")
    from trajtune.errors import InputNotFoundError

    with pytest.raises(InputNotFoundError):
        load_experiences(tmp_path)  # a directory without experiences.json
    from trajtune.envs.registry import make_env
    from trajtune.errors import EnvError

    env = make_env("with_experiences", env=ENV, path=str(tmp_path / "a.json"))  # the config form of the wrapper
    (task,) = env.tasks("test", 1)
    assert env.reset(task).messages[0].content.endswith("1. one\n2. two")
    with pytest.raises(EnvError, match="one of path"):
        make_env("with_experiences", env=ENV)


def test_eval_refuses_experiences_without_an_environment():
    from trajtune.errors import UsageError
    from trajtune.eval.harness import EvalSettings

    with pytest.raises(UsageError, match="--env"):
        EvalSettings(model="m", benchmark="bfcl", experiences=["x"]).validate()
