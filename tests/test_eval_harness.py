"""The evaluation harness: metrics by hand, best-of-N, resumable output, BFCL end to end, the CLI.

Expected numbers are worked out by hand in the comments next to them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trajtune.errors import OutputError
from trajtune.eval.backends import TextBackend
from trajtune.eval.harness import EvalSettings, run_evaluation
from trajtune.eval.metrics import answer_key, pass_at_k, summarize, tool_call_counts
from trajtune.eval.store import EvalStore
from trajtune.eval.verifiers import best_of_report, get_verifier, register_verifier, select
from trajtune.schema import Message, Outcome, ToolCall, ToolSpec, Trajectory

# --------------------------------------------------------------------------------------------
# helpers


def _traj(task: str, sample: int, success: bool, *, reward: float | None = None, category: str | None = None,
          messages: list[Message] | None = None, tools: list[ToolSpec] | None = None,
          final: str | None = None) -> Trajectory:
    msgs = messages if messages is not None else [Message(role="user", content="q"),
                                                   Message(role="assistant", content=final or "a", origin="agent")]
    return Trajectory(id=f"{task}#{sample}", messages=msgs, tools=tools or [],
                      reward=reward if reward is not None else float(success),
                      outcome=Outcome(success=success, final_answer=final, termination="done"),
                      metadata={"eval": {"task_id": task, "sample": sample, "category": category}})


def _call(name: str, args, cid: str = "c") -> ToolCall:
    return ToolCall(id=cid, name=name, arguments=args)


def _hermes(m: Message) -> str:
    blocks = [f'<tool_call>{json.dumps({"name": c.name, "arguments": c.arguments})}</tool_call>'
              for c in m.tool_calls or []]
    return "\n".join(([m.text()] if m.content else []) + blocks)


def _home_expert_fn(wrong_every: int = 0):
    """A scripted 'model' that plays the home environment's expert (as Hermes text).

    With ``wrong_every=k`` every k-th episode (counted at its first turn) answers "Done." at once
    without acting, which fails the task.
    """
    from trajtune.envs import make_env

    env = make_env("home")
    script: dict[str, list[Message]] = {}
    for split in ("test",):
        for t in env.tasks(split, 16, seed=0):
            e = env.expert(t)
            script[e.messages[1].text()] = e.messages
    counter = {"calls": 0, "episodes": 0}

    def gen(messages, tools):
        counter["calls"] += 1
        if len(messages) == 2:  # system + user: an episode's first turn
            counter["episodes"] += 1
            if wrong_every and counter["episodes"] % wrong_every == 0:
                return "Done."
        return _hermes(script[messages[1].text()][len(messages)])

    gen.counter = counter  # type: ignore[attr-defined]
    return gen


# --------------------------------------------------------------------------------------------
# metrics


def test_pass_at_k_by_hand():
    # n=5 samples, c=2 correct: pass@k = 1 - C(3,k)/C(5,k)
    assert pass_at_k(5, 2, 1) == pytest.approx(1 - 3 / 5)  # 0.4
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 0.7
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)  # 0.9
    assert pass_at_k(5, 2, 4) == 1.0  # only 3 failures: any 4 contain a success
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)
    # Two tasks: (n=5, c=2) and (n=5, c=0) -> pass@2 = (0.7 + 0) / 2, success = 2/10.
    eps = [_traj("a", i, i < 2) for i in range(5)] + [_traj("b", i, False) for i in range(5)]
    m = summarize(eps, ks=[1, 2, 3, 6])
    assert m["pass@1"] == pytest.approx(0.2)
    assert m["pass@2"] == pytest.approx(0.35)
    assert m["pass@3"] == pytest.approx(0.45)
    assert "pass@6" not in m  # more than the samples per task: not reported
    assert m["success"] == pytest.approx(0.2) and m["tasks"] == 2 and m["episodes"] == 10


def test_tool_call_accuracy_and_format_errors_on_hand_built_episodes():
    f = ToolSpec(name="f", parameters={"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
    g = ToolSpec(name="g", parameters={"type": "object", "properties": {"x": {"type": "string"}},
                                       "additionalProperties": False})
    msgs = [
        Message(role="user", content="go"),
        # turn 1: valid f, f with a string (type error), unknown tool h
        Message(role="assistant", origin="agent", tool_calls=[_call("f", {"a": 1}, "1"), _call("f", {"a": "1"}, "2"),
                                                               _call("h", {}, "3")]),
        Message(role="tool", tool_call_id="1", content="ok"),
        # turn 2: f missing its required argument, g with an extra argument, g valid
        Message(role="assistant", origin="agent", tool_calls=[_call("f", {}, "4"), _call("g", {"x": "s", "y": 1}, "5"),
                                                               _call("g", {"x": "s"}, "6")]),
        # turn 3: two parse errors, no call
        Message(role="assistant", origin="agent", content="<tool_call>{", extra={"parse_errors": ["e1", "e2"]}),
        # turn 4: arguments that are not an object
        Message(role="assistant", origin="agent", tool_calls=[ToolCall(id="7", name="f", arguments=None,
                                                                       arguments_raw="[1]")]),
    ]
    t = _traj("x", 0, False, messages=msgs, tools=[f, g])
    # attempted: 3 + 3 + 2 (parse errors) + 1 = 9; valid: f{a:1}, g{x:s} = 2
    assert tool_call_counts(t) == (2, 9)
    # A prompt-side assistant message (origin None when others are "agent") is not the model's turn.
    prompt = Message(role="assistant", content="example", tool_calls=[_call("h", {}, "p")])
    t2 = _traj("y", 0, True, messages=[prompt, Message(role="assistant", origin="agent",
                                                      tool_calls=[_call("f", {"a": 2}, "8")])], tools=[f])
    assert tool_call_counts(t2) == (1, 1)
    m = summarize([t, t2])
    assert m["tool_call_accuracy"] == pytest.approx(3 / 10)
    assert m["tool_calls"] == {"valid": 3, "attempted": 10}
    # turns: 4 + 1 = 5, one with parse errors -> 1/5; two errors in all; one episode of two has some
    assert m["mean_turns"] == pytest.approx(2.5)
    assert m["format_error_rate"] == pytest.approx(1 / 5)
    assert m["format_errors"] == 2 and m["episodes_with_format_errors"] == 0.5
    # A recorded checker verdict (BFCL single-turn) replaces the schema check.
    t3 = _traj("z", 0, True)
    t3.metadata["eval"]["tool_calls"] = {"valid": 1, "total": 1}
    assert tool_call_counts(t3) == (1, 1)
    assert summarize([_traj("q", 0, True)])["tool_call_accuracy"] is None  # nothing attempted


def test_per_category_breakdown():
    eps = [_traj("a1", 0, True, category="set", reward=1.0), _traj("a2", 0, False, category="set", reward=0.0),
           _traj("a3", 0, True, category="set", reward=1.0), _traj("b1", 0, False, category="copy", reward=0.5)]
    m = summarize(eps)
    assert set(m["categories"]) == {"set", "copy"}
    assert m["categories"]["set"]["success"] == pytest.approx(2 / 3)
    assert m["categories"]["set"]["episodes"] == 3
    assert m["categories"]["copy"]["success"] == 0.0
    assert m["categories"]["copy"]["mean_reward"] == 0.5
    assert m["mean_reward"] == pytest.approx(2.5 / 4)
    assert "categories" not in summarize([_traj("c", 0, True)])  # no category: no breakdown


def test_env_breakdown_by_task_kind():
    gen = _home_expert_fn()
    s = EvalSettings(model="scripted", env="home", tasks=6, workers=2, batch_size=4)
    r = run_evaluation(s, TextBackend(gen, workers=2))
    from trajtune.envs import make_env

    kinds = [t.data["kind"] for t in make_env("home").tasks("test", 6, seed=0)]
    m = r["metrics"]
    assert m["success"] == 1.0 and m["tool_call_accuracy"] == 1.0 and m["format_error_rate"] == 0.0
    assert {k: v["episodes"] for k, v in m["categories"].items()} == {k: kinds.count(k) for k in set(kinds)}


# --------------------------------------------------------------------------------------------
# best-of-N


def test_verifiers_select_by_hand():
    c = [_traj("t", 0, False, reward=0.2, final="Paris"), _traj("t", 1, True, reward=0.9, final="Lyon"),
         _traj("t", 2, False, reward=0.1, final=" paris "), _traj("t", 3, True, reward=1.0, final="Lyon ")]
    assert select(get_verifier("env"), c) == 3  # successes 1 and 3; tie broken by reward
    assert select(get_verifier("reward"), c) == 3
    assert select(get_verifier("first"), c) == 0
    # majority: "paris" x2 vs "lyon" x2 -> tie -> the first sample's answer
    assert select(get_verifier("majority"), c) == 0
    c.append(_traj("t", 4, True, reward=0.0, final="LYON"))
    assert select(get_verifier("majority"), c) == 1
    assert answer_key(c[0]) == answer_key(c[2])
    assert get_verifier("env").privileged and not get_verifier("majority").privileged
    with pytest.raises(ValueError, match="unknown verifier"):
        get_verifier("nope")


def test_best_of_report_with_a_stub_verifier():
    class PickLast:
        name, privileged, description = "last", False, "stub: the last candidate"

        def scores(self, cands):
            return [float(i) for i in range(len(cands))]

    # task a: samples (F, T, F); task b: (T, T, F); task c: (F, F, T)
    eps = [_traj("a", i, s, category="x") for i, s in enumerate([False, True, False])]
    eps += [_traj("b", i, s, category="x") for i, s in enumerate([True, True, False])]
    eps += [_traj("c", i, s, category="y") for i, s in enumerate([False, False, True])]
    rep = best_of_report(eps, PickLast(), 3)
    assert rep["selected"] == {"a": 2, "b": 2, "c": 2}
    assert rep["selected_success"] == pytest.approx(1 / 3)  # only c's last sample succeeded
    assert rep["pass@3"] == 1.0  # every task has a success among its 3
    assert rep["categories"]["x"]["selected_success"] == 0.0 and rep["categories"]["y"]["selected_success"] == 1.0
    oracle = best_of_report(eps, get_verifier("env"), 3)
    assert oracle["selected_success"] == oracle["pass@3"] == 1.0 and oracle["privileged"]
    assert "privileged" in oracle["label"] and "deployable" in rep["label"]


def test_best_of_end_to_end_with_a_registered_verifier():
    # Every 2nd model call answers "Done." without acting: with 2 candidates per task, sample 1 of
    # each single-step task fails. A verifier preferring more tool calls must pick the good one.
    @register_verifier("most_calls_test")
    def most_calls():
        class V:
            name, privileged, description = "most_calls_test", False, "stub: most tool calls"

            def scores(self, cands):
                return [float(sum(len(m.tool_calls or []) for m in c.messages)) for c in cands]
        return V()

    gen = _home_expert_fn(wrong_every=2)
    s = EvalSettings(model="scripted", env="home", tasks=3, best_of=2, verifier="most_calls_test",
                     temperature=1.0, batch_size=1, workers=1)
    r = run_evaluation(s, TextBackend(gen, workers=1))
    bo = r["best_of"]
    assert bo["verifier"] == "most_calls_test" and bo["n"] == 2
    assert r["metrics"]["episodes"] == 6
    assert bo["selected_success"] == 1.0 and bo["pass@2"] == 1.0
    assert r["metrics"]["success"] < 1.0  # some candidates did fail
    with pytest.raises(ValueError, match="temperature"):
        run_evaluation(EvalSettings(model="m", env="home", tasks=1, best_of=2), TextBackend(gen))
    with pytest.raises(ValueError, match="best-of"):
        run_evaluation(EvalSettings(model="m", env="home", tasks=1, verifier="env"), TextBackend(gen))


# --------------------------------------------------------------------------------------------
# resumable output


class _Interrupt(Exception):
    pass


class _CountingBackend(TextBackend):
    """Counts rolled-out tasks; raises after ``fail_after`` rollout batches (a simulated crash)."""

    def __init__(self, gen, fail_after: int | None = None):
        super().__init__(gen, workers=1)
        self.tasks_run: list[str] = []
        self.batches = 0
        self.fail_after = fail_after

    def rollout(self, env_factory, tasks, *, max_turns, seed):
        if self.fail_after is not None and self.batches >= self.fail_after:
            raise _Interrupt()
        self.batches += 1
        self.tasks_run += [t.id for t in tasks]
        return super().rollout(env_factory, tasks, max_turns=max_turns, seed=seed)


def test_resume_skips_finished_episodes(tmp_path):
    out = tmp_path / "ev"
    s = EvalSettings(model="scripted", env="home", tasks=5, batch_size=2, workers=1)
    gen = _home_expert_fn()
    crashed = _CountingBackend(gen, fail_after=2)
    with pytest.raises(_Interrupt):
        with EvalStore(out, s.as_dict()) as store:
            run_evaluation(s, crashed, store=store)
    assert len(crashed.tasks_run) == 4 and not (out / "results.json").exists()
    lines = (out / "episodes.jsonl").read_text().splitlines()
    assert len(lines) == 4
    # A crash in the middle of a write leaves a torn line: resume drops it.
    with (out / "episodes.jsonl").open("a") as f:
        f.write('{"schema_version": "')
    # Without --resume the directory is refused; a resume with other settings too.
    with pytest.raises(FileExistsError, match="--resume"):
        EvalStore(out, s.as_dict())
    other = EvalSettings(model="scripted", env="home", tasks=6, batch_size=2, workers=1)
    with pytest.raises(OutputError, match="tasks: was 5, now 6"):
        EvalStore(out, other.as_dict(), resume=True)

    calls_before = gen.counter["calls"]
    again = _CountingBackend(gen)
    with EvalStore(out, s.as_dict(), resume=True) as store:
        assert len(store.done) == 4
        assert len(store.warnings) == 1 and "dropped a torn last line" in store.warnings[0]
        run_evaluation(s, again, store=store)
    from trajtune.envs import make_env

    ids = [t.id for t in make_env("home").tasks("test", 5, seed=0)]
    assert again.tasks_run == ids[4:]  # only the unfinished episode ran
    stored = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
    # One model call per assistant turn, and only the last episode's turns were generated.
    assert gen.counter["calls"] - calls_before == sum(m["role"] == "assistant" for m in stored[4]["messages"])
    assert [(d["metadata"]["eval"]["task_id"], d["metadata"]["eval"]["sample"]) for d in stored] == [(i, 0) for i in ids]
    saved = json.loads((out / "results.json").read_text())
    assert saved["metrics"]["episodes"] == 5 and saved["metrics"]["success"] == 1.0
    # The uninterrupted run reports the same metrics.
    fresh = run_evaluation(s, TextBackend(_home_expert_fn(), workers=1))
    assert fresh["metrics"] == saved["metrics"]
    # --overwrite starts again.
    with EvalStore(out, s.as_dict(), overwrite=True) as store:
        assert not store.done and not (out / "episodes.jsonl").read_text()


# --------------------------------------------------------------------------------------------
# BFCL end to end with scripted models


BFCL_CATS = ["simple", "multiple", "parallel", "irrelevance", "multi_turn_base"]


def _bfcl_oracle(limit: int):
    from trajtune.plugins.bfcl import BFCLMultiTurnEnv, ground_truth_calls, load_bfcl

    single: dict[str, list[dict]] = {}
    for cat in ("simple_python", "multiple", "parallel"):
        for t in load_bfcl(cat, limit=limit):
            d = t.reference.data
            single[t.messages[-1].text()] = ground_truth_calls(d["ground_truth"], d["functions"])
    env = BFCLMultiTurnEnv(["multi_turn_base"], limit=limit)
    multi = {}
    for task in env.tasks("test", limit):
        e = env.expert(task)
        multi[e.messages[0].text()] = e.messages

    def generate(messages, tools):
        if messages[0].text() in multi:
            return _hermes(multi[messages[0].text()][len(messages)])
        calls = single.get(messages[-1].text())
        if calls is None:
            return "I cannot help with that."
        return "\n".join(f"<tool_call>{json.dumps(c)}</tool_call>" for c in calls)

    return generate


def test_bfcl_oracle_scores_100_percent(tmp_path):
    s = EvalSettings(model="oracle", benchmark="bfcl", categories=BFCL_CATS, limit=2, batch_size=3, workers=2)
    with EvalStore(tmp_path / "b", s.as_dict()) as store:
        r = run_evaluation(s, TextBackend(_bfcl_oracle(2), workers=2), store=store)
    m = r["metrics"]
    cats = ["simple_python", "multiple", "parallel", "irrelevance", "multi_turn_base"]
    assert sorted(m["categories"]) == sorted(cats)
    assert all(m["categories"][c]["success"] == 1.0 and m["categories"][c]["episodes"] == 2 for c in cats)
    assert m["success"] == 1.0 and m["episodes"] == 10 and m["format_errors"] == 0
    assert m["tool_call_accuracy"] == 1.0
    assert {c: v["accuracy"] for c, v in r["bfcl"]["categories"].items()} == dict.fromkeys(cats, 1.0)
    lines = (tmp_path / "b" / "episodes.jsonl").read_text().splitlines()
    assert len(lines) == 10
    first = json.loads(lines[0])
    assert first["metadata"]["bfcl_reason"] == "ok" and first["metadata"]["eval"]["category"] == "simple_python"


def test_bfcl_garbage_scores_0_and_counts_format_errors():
    def garbage(messages, tools):
        return '<tool_call>{"name": "x", "arguments": {</tool_call>'

    s = EvalSettings(model="garbage", benchmark="bfcl", categories=["simple", "parallel", "irrelevance",
                                                                     "multi_turn_base"], limit=2, max_turns=3)
    r = run_evaluation(s, TextBackend(garbage, workers=1))
    c = r["metrics"]["categories"]
    for cat in ("simple_python", "parallel", "multi_turn_base"):
        assert c[cat]["success"] == 0.0, cat
        assert c[cat]["format_error_rate"] == 1.0 and c[cat]["format_errors"] >= 2, cat
    assert c["simple_python"]["tool_call_accuracy"] == 0.0
    assert c["irrelevance"]["success"] == 1.0  # a failed decode is "no call", as in BFCL
    assert r["bfcl"]["categories"]["simple_python"]["reasons"] == {"format_error": 2}


# --------------------------------------------------------------------------------------------
# CLI with the tiny model


def _cli(args: list[str]):
    from typer.testing import CliRunner

    from trajtune.cli.main import app

    return CliRunner().invoke(app, args)


def test_cli_env_home_with_tiny_model(tiny_dir, tmp_path):
    out = tmp_path / "ev"
    args = ["eval", "--model", str(tiny_dir), "--env", "home", "--tasks", "2", "--max-new-tokens", "8",
            "--max-turns", "2", "--out", str(out), "-q"]
    r = _cli(args)
    assert r.exit_code == 0, r.output
    res = json.loads((out / "results.json").read_text())
    m = res["metrics"]
    assert m["episodes"] == 2 and "pass@1" in m and "tool_call_accuracy" in m and "categories" in m
    assert len((out / "episodes.jsonl").read_text().splitlines()) == 2
    r2 = _cli(args)
    assert r2.exit_code == OutputError.exit_code and "--resume" in r2.output
    r3 = _cli(args + ["--resume"])
    assert r3.exit_code == 0, r3.output
    assert len((out / "episodes.jsonl").read_text().splitlines()) == 2  # nothing was run again
    assert json.loads((out / "results.json").read_text())["metrics"] == m
    bad = _cli(["eval", "--model", str(tiny_dir), "--env", "home", "--benchmark", "bfcl"])
    assert bad.exit_code == 2 and "exactly one" in bad.output


def test_cli_bfcl_with_tiny_model(tiny_dir, tmp_path):
    out = tmp_path / "bfcl"
    r = _cli(["eval", "--model", str(tiny_dir), "--benchmark", "bfcl", "--categories", "simple,irrelevance",
              "--limit", "2", "--max-new-tokens", "8", "--out", str(out), "-q"])
    assert r.exit_code == 0, r.output
    res = json.loads((out / "results.json").read_text())
    assert res["metrics"]["episodes"] == 4
    assert set(res["bfcl"]["categories"]) == {"simple_python", "irrelevance"}
    assert res["settings"]["parser"] == "hermes"  # detected from the tiny model's ChatML tool template
    assert len((out / "episodes.jsonl").read_text().splitlines()) == 4


def test_evaluate_on_rollout_episodes_with_the_tiny_model(tiny_dir, tmp_path):
    """The in-training eval path (``evaluate`` -> rollout ``Episode``s) gets the same metrics,
    categories from ``task.data["kind"]``, and ``write_eval`` still writes its two files."""
    from trajtune.envs import make_env
    from trajtune.eval.run import evaluate, write_eval
    from trajtune.models.loading import load_model, load_tokenizer
    from trajtune.rollout import RolloutConfig

    tok, model = load_tokenizer(str(tiny_dir)), load_model(str(tiny_dir))
    tasks = make_env("home").tasks("test", 3, seed=0)
    ro = RolloutConfig(max_turns=2, max_new_tokens=8, temperature=0.0)
    m, eps = evaluate(model, tok, lambda: make_env("home"), tasks, ro)
    assert m["episodes"] == 3 and "tool_call_accuracy" in m
    kinds = [t.data["kind"] for t in tasks]
    assert {k: v["episodes"] for k, v in m["categories"].items()} == {k: kinds.count(k) for k in set(kinds)}
    assert m["mean_turns"] == sum(e.turns for e in eps) / 3
    path = write_eval(tmp_path, "x", m, eps)
    assert json.loads(path.read_text())["metrics"]["episodes"] == 3
    assert len((tmp_path / "x.episodes.jsonl").read_text().splitlines()) == 3


def test_cli_best_of_with_tiny_model(tiny_dir, tmp_path):
    out = tmp_path / "bo"
    r = _cli(["eval", "--model", str(tiny_dir), "--env", "home", "--tasks", "2", "--best-of", "2", "--verifier", "env",
              "--temperature", "1.0", "--max-new-tokens", "8", "--max-turns", "1", "--k", "1", "--k", "2",
              "--out", str(out), "-q"])
    assert r.exit_code == 0, r.output
    res = json.loads((out / "results.json").read_text())
    bo = res["best_of"]
    assert bo["verifier"] == "env" and bo["privileged"] is True and bo["n"] == 2
    assert set(bo["selected"]) == {json.loads(x)["metadata"]["eval"]["task_id"]
                                   for x in (out / "episodes.jsonl").read_text().splitlines()}
    assert res["metrics"]["episodes"] == 4 and "pass@2" in res["metrics"]
    # with the oracle verifier the selected success is pass@2 by construction
    assert bo["selected_success"] == bo["pass@2"] == res["metrics"]["pass@2"]
    bad = _cli(["eval", "--model", str(tiny_dir), "--env", "home", "--best-of", "2", "--verifier", "nope",
                "--temperature", "1"])
    assert bad.exit_code == 2 and "unknown verifier" in bad.output


def test_hf_completion_context_overflow_is_a_failure(tiny_dir):
    """A BFCL prompt longer than --max-length gets no answer: a failed item, even for irrelevance
    (where answering nothing would otherwise count as correct)."""
    from trajtune.eval.backends import HFBackend
    from trajtune.models.loading import load_model, load_tokenizer

    backend = HFBackend(load_model(str(tiny_dir)), load_tokenizer(str(tiny_dir)), max_length=64, max_new_tokens=4)
    s = EvalSettings(model="tiny", benchmark="bfcl", categories=["simple", "irrelevance"], limit=1, max_length=64)
    r = run_evaluation(s, backend)
    m = r["metrics"]
    assert m["terminations"] == {"context_overflow": 2} and m["success"] == 0.0
    assert r["bfcl"]["categories"]["irrelevance"]["reasons"] == {"context_overflow": 1}


def test_majority_votes_on_call_sets_for_bfcl_and_no_call_is_an_answer():
    def cand(sample, calls, text=None, success=False):
        msg = Message(role="assistant", origin="agent", content=text,
                      tool_calls=[_call(n, a, f"c{i}") for i, (n, a) in enumerate(calls)] or None)
        t = _traj("t", sample, success, messages=[Message(role="user", content="q"), msg])
        t.outcome.final_answer = None
        t.metadata["eval"]["vote_on"] = "calls"
        return t

    # two refusals worded differently and one wrong call: "no call" wins 2 to 1
    c = [cand(0, [("f", {"a": 1})]), cand(1, [], "I can't.", True), cand(2, [], "No tool fits.", True)]
    assert select(get_verifier("majority"), c) == 1
    # the same calls in another order are the same answer
    c = [cand(0, [("f", {"a": 1})]), cand(1, [("g", {}), ("f", {"a": 2})]), cand(2, [("f", {"a": 2}), ("g", {})])]
    assert select(get_verifier("majority"), c) == 1


def test_cli_results_go_to_stdout_and_the_summary_to_stderr(tiny_dir, tmp_path):
    out = tmp_path / "ev"
    args = ["eval", "--model", str(tiny_dir), "--env", "home", "--tasks", "2", "--max-new-tokens", "8",
            "--max-turns", "2", "--out", str(out)]
    r = _cli(args)
    assert r.exit_code == 0, r.output
    printed = json.loads(r.stdout)  # `trajtune eval ... > r.json` gets exactly this document
    saved = json.loads((out / "results.json").read_text())
    assert printed["metrics"] == saved["metrics"] and printed["model"] == str(tiny_dir)
    assert "episodes" in r.stderr and "success" in r.stderr and "all" in r.stderr  # the summary table
    assert r.stdout.lstrip().startswith("{")
    q = _cli(["eval", "--model", str(tiny_dir), "--env", "home", "--tasks", "2", "--max-new-tokens", "8",
              "--max-turns", "2", "-q"])
    assert q.exit_code == 0, q.output
    assert json.loads(q.stdout)["metrics"]["episodes"] == 2
    assert q.stderr == ""  # -q: the JSON only


def test_resolve_max_length_never_exceeds_the_context():
    from trajtune.eval.run import FALLBACK_MAX_LENGTH, resolve_max_length

    assert resolve_max_length(None, 1024) == (1024, None)
    assert resolve_max_length(512, 1024) == (512, None)
    n, warning = resolve_max_length(4096, 1024)
    assert n == 1024 and "4096" in warning and "1024" in warning
    assert resolve_max_length(None, None) == (FALLBACK_MAX_LENGTH, None)
    assert resolve_max_length(9000, None) == (9000, None)


def test_cli_max_length_above_the_model_context_is_clamped_with_a_warning(tiny_dir, tmp_path):
    context = json.loads((Path(tiny_dir) / "config.json").read_text())["max_position_embeddings"]
    out = tmp_path / "ev"
    r = _cli(["eval", "--model", str(tiny_dir), "--env", "home", "--tasks", "1", "--max-new-tokens", "8",
              "--max-turns", "1", "--max-length", str(context * 4), "--out", str(out), "-q"])
    assert r.exit_code == 0, r.output
    assert "warning:" in r.stderr and f"above the model's context length ({context} tokens)" in r.stderr
    assert json.loads((out / "run.json").read_text())["max_length"] == context
    # the default is the model's context
    r = _cli(["eval", "--model", str(tiny_dir), "--env", "home", "--tasks", "1", "--max-new-tokens", "8",
              "--max-turns", "1", "--out", str(tmp_path / "ev2"), "-q"])
    assert r.exit_code == 0 and "warning" not in r.stderr
    assert json.loads((tmp_path / "ev2" / "run.json").read_text())["max_length"] == context


def _deep(n: int):
    """``n`` levels of nesting, alternating objects and lists."""
    v: object = "leaf"
    for i in range(n):
        v = {"a": v} if i % 2 else [v]
    return v


@pytest.mark.parametrize("depth", [300, 1000])
def test_store_cuts_over_deep_model_output_and_resumes(tmp_path, depth):
    """Arguments ~300 levels deep made EvalStore.append raise (pydantic: maximum serialization depth)."""
    from trajtune.schema import DEPTH_MARKER, MAX_VALUE_DEPTH

    deep = _traj("t0", 0, False)
    deep.messages[1].tool_calls = [ToolCall(id="c", name="f", arguments={"x": _deep(depth)}, arguments_raw="{...}")]
    ok = _traj("t1", 0, True)
    with EvalStore(tmp_path / "ev", {"a": 1}) as store:
        store.append([deep, ok])
        kept = store.done[("t0", 0)]
    assert kept.metadata["depth_capped"] == 1 and ok.metadata.get("depth_capped") is None
    lines = (tmp_path / "ev" / "episodes.jsonl").read_text().splitlines()
    assert len(lines) == 2 and DEPTH_MARKER in lines[0] and DEPTH_MARKER not in lines[1]
    with EvalStore(tmp_path / "ev", {"a": 1}, resume=True) as again:
        back = again.done[("t0", 0)]
    v, levels = back.messages[1].tool_calls[0].arguments, 0
    while isinstance(v, (dict, list)):
        v = next(iter(v.values())) if isinstance(v, dict) else v[0]
        levels += 1
    assert v == DEPTH_MARKER and levels == MAX_VALUE_DEPTH  # cut exactly at the documented depth
    assert again.done[("t1", 0)] == ok


def test_split_train_draws_validation_tasks_and_a_bad_split_is_refused():
    from trajtune.envs import make_env
    from trajtune.errors import UsageError
    from trajtune.eval.harness import build_suites

    (suite,) = build_suites(EvalSettings(model="m", env="home", tasks=5, split="train", seed=7))
    assert [t.id for t in suite.tasks] == [t.id for t in make_env("home").tasks("train", 5, seed=7)]
    (test,) = build_suites(EvalSettings(model="m", env="home", tasks=5, seed=7))
    assert not {t.id for t in test.tasks} & {t.id for t in suite.tasks}
    with pytest.raises(UsageError, match="--split must be train or test"):
        EvalSettings(model="m", env="home", split="dev").validate()
    with pytest.raises(UsageError, match="a benchmark has its own entries"):
        EvalSettings(model="m", benchmark="bfcl", split="train").validate()
