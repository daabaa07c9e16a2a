"""Data quality filters (trajtune.filters; `trajtune data filter`; data.filters in SFT and RFT;
rft.filters on mined successes): which rule removes which record, and a judge that fails never
removes data or stops the run."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from trajtune.cli.main import app
from trajtune.config import FilterSpec
from trajtune.errors import ConfigError
from trajtune.filters import apply_filters, consistency_issue, rule_issue
from trajtune.judge import Judge
from trajtune.schema import Trajectory

runner = CliRunner()
TOOLS = [{"name": "get", "parameters": {"type": "object", "properties": {"room": {"type": "string"}},
                                        "required": ["room"]}}]


def _traj(tid: str, steps: list[tuple[dict | None, str | None]], final: str | None = "done") -> Trajectory:
    """steps: (arguments of a `get` call, its result) per turn; a final text answer unless None."""
    msgs: list[dict] = [{"role": "user", "content": "look"}]
    for k, (args, result) in enumerate(steps):
        msgs.append({"role": "assistant", "tool_calls": [{"id": f"c{k}", "name": "get", "arguments": args}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{k}", "content": result})
    if final is not None:
        msgs.append({"role": "assistant", "content": final})
    return Trajectory.model_validate({"id": tid, "tools": TOOLS, "messages": msgs})


KITCHEN, TYPO = {"room": "kitchen"}, {"room": "kitchn"}
ERR = "Error: unknown room 'kitchn'"


def test_consistency_rules_on_hand_built_records():
    assert consistency_issue(_traj("clean", [(KITCHEN, "ok")])) is None
    assert consistency_issue(_traj("recovered", [(TYPO, ERR), (KITCHEN, "ok")])) is None
    rule, detail = consistency_issue(_traj("repeat", [(TYPO, ERR), (TYPO, ERR), (KITCHEN, "ok")]))
    assert rule == "repeat-failed-call" and "messages[3]" in detail and "messages[1]" in detail
    # a call that worked may be made again; a failed call retried with other arguments is a fix
    assert consistency_issue(_traj("again", [(KITCHEN, "ok"), (KITCHEN, "ok")])) is None
    assert consistency_issue(_traj("fixed", [(TYPO, ERR), ({"room": "hall"}, ERR), (KITCHEN, "ok")])) is None
    rule, detail = consistency_issue(_traj("ends", [(KITCHEN, "ok"), (TYPO, ERR)]))
    assert rule == "ends-on-error" and "messages[5]" in detail
    # an error that was recovered before the answer is fine; no final answer is not "ends on error"
    assert consistency_issue(_traj("no-answer", [(TYPO, ERR)], final=None)) is None


def test_each_filter_names_its_rule_and_the_first_broken_rule_wins():
    spec = FilterSpec(consistency=True, errors=True, format=True, max_turns=3, max_chars=60)
    cases = {
        "clean": (_traj("clean", [(KITCHEN, "ok")]), None),
        "schema": (_traj("schema", [({"room": 3}, "ok")]), "format"),  # W223: room must be a string
        "repeat": (_traj("repeat", [(TYPO, ERR), (TYPO, ERR), (KITCHEN, "ok")]), "repeat-failed-call"),
        "recovered": (_traj("recovered", [(TYPO, ERR), (KITCHEN, "ok")]), "mistake"),  # consistent, yet a mistake
        "long": (_traj("long", [(KITCHEN, "ok")] * 3), "too-many-turns"),  # 4 assistant turns
        "chars": (_traj("chars", [(KITCHEN, "x" * 80)]), "too-long"),
    }
    for name, (t, want) in cases.items():
        got = rule_issue(t, spec)
        assert (got[0] if got else None) == want, (name, got)
    assert rule_issue(_traj("short", [], final="hi"), FilterSpec(min_turns=2))[0] == "too-few-turns"
    kept, report = apply_filters([t for t, _ in cases.values()], spec)
    assert [t.id for t in kept] == ["clean"]
    assert report.as_dict() == {"kept": 1, "removed": 5, "removed_by_rule": {
        "format": 1, "repeat-failed-call": 1, "mistake": 1, "too-many-turns": 1, "too-long": 1}}


def test_filter_spec_refuses_settings_that_do_nothing():
    with pytest.raises(ValueError, match="names no filter"):
        FilterSpec()
    with pytest.raises(ValueError, match="names no filter"):
        FilterSpec(consistency=False)
    with pytest.raises(ValueError, match="only apply with data.filters.judge"):
        FilterSpec(errors=True, judge_min_score=7)
    with pytest.raises(ValueError, match="every record would be removed"):
        FilterSpec(min_turns=4, max_turns=2)


def _judge(replies: list) -> Judge:
    """A judge whose endpoint answers with ``replies`` in order (an exception: the request fails)."""
    it = iter(replies)

    def complete(body: dict) -> dict:
        r = next(it)
        if isinstance(r, Exception):
            raise r
        return {"choices": [{"message": {"role": "assistant", "content": r}}]}

    return Judge(complete, name="fake", workers=1)


def test_the_judge_removes_low_scores_and_a_failing_judge_keeps_the_record():
    trajs = [_traj(f"t{i}", [(KITCHEN, "ok")]) for i in range(4)]
    judge = _judge(['{"score": 8, "reason": "fine"}', '{"score": 2, "reason": "wasteful"}',
                    "no score here", RuntimeError("connection reset")])
    kept, report = apply_filters(trajs, FilterSpec(judge="openai:http://x", judge_min_score=5), judge)
    assert [t.id for t in kept] == ["t0", "t2", "t3"]  # t1 scored 2; t2 and t3 had no verdict
    assert report.removed == {"judge": 1} and report.judge_failures == 2


def test_data_filter_command_writes_kept_and_removed_records(tmp_path):
    src = tmp_path / "in.jsonl"
    trajs = [_traj("clean", [(KITCHEN, "ok")]), _traj("repeat", [(TYPO, ERR), (TYPO, ERR), (KITCHEN, "ok")]),
             _traj("ends", [(TYPO, ERR)])]
    src.write_text("".join(t.model_dump_json(exclude_none=True) + "\n" for t in trajs))
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    r = runner.invoke(app, ["data", "filter", str(src), "-o", str(out), "--consistency", "--rejected", str(rej)])
    assert r.exit_code == 0, r.output
    assert "kept 1, removed 2" in r.output and "repeat-failed-call: 1" in r.output and "ends-on-error: 1" in r.output
    assert [json.loads(x)["id"] for x in out.read_text().splitlines()] == ["clean"]
    removed = [json.loads(x) for x in rej.read_text().splitlines()]
    assert [(x["id"], x["metadata"]["filter"]["rule"]) for x in removed] == [("repeat", "repeat-failed-call"),
                                                                              ("ends", "ends-on-error")]
    again = runner.invoke(app, ["data", "filter", str(src), "-o", str(out), "--errors"])
    assert again.exit_code != 0 and "exists" in again.output  # never overwritten unless told
    assert [json.loads(x)["id"] for x in out.read_text().splitlines()] == ["clean"]
    for args, want in [([], "name at least one filter"), (["--min-turns", "3", "--max-turns", "2"], "every record"),
                       (["--errors", "--judge-min-score", "7"], "only apply with --judge"),
                       (["--max-chars", "0"], "--max-chars must be at least 1")]:
        r = runner.invoke(app, ["data", "filter", str(src), "-o", str(tmp_path / "x.jsonl"), *args])
        assert r.exit_code == 2 and want in r.output, (args, r.output)
        assert not (tmp_path / "x.jsonl").exists()


def test_sft_data_filters_remove_records_before_training_and_report_them(tmp_path, tiny_dir, home_experts):
    from trajtune.algorithms.sft import SFTRunConfig
    from trajtune.config import load_config
    from trajtune.errors import DataError
    from trajtune.train import run

    data = tmp_path / "train.jsonl"
    bad = _traj("bad", [(TYPO, ERR), (TYPO, ERR), (KITCHEN, "ok")])
    records = list(home_experts[:6]) + [bad]
    data.write_text("".join(t.model_dump_json(exclude_none=True) + "\n" for t in records))
    base = [f"model={tiny_dir}", f"data.path={data}", "data.format=ir", "train.steps=1", "train.batch_size=2",
            "report=false"]
    with pytest.raises(ConfigError, match="names no filter"):
        load_config(None, SFTRunConfig, base + ["output_dir=o", "data.filters.errors=false"])
    out = tmp_path / "sft"
    run(load_config(None, SFTRunConfig, base + [f"output_dir={out}", "data.filters.consistency=true"]), quiet=True)
    result = json.loads((out / "result.json").read_text())
    assert result["filters"] == {"kept": 6, "removed": 1, "removed_by_rule": {"repeat-failed-call": 1}}
    assert result["train_records"] == 6
    with pytest.raises(DataError, match="removed all 7 records"):
        run(load_config(None, SFTRunConfig, base + [f"output_dir={tmp_path / 'none'}", "data.filters.max_chars=5"]),
            quiet=True)


def test_rft_filters_apply_to_the_mined_successes(tmp_path, tiny_dir, monkeypatch):
    import trajtune.rollout as ro_mod
    from test_own_attempts import _fake_rollouts

    from trajtune.algorithms.registry import load_run_config
    from trajtune.train import run

    monkeypatch.setattr(ro_mod, "run_rollouts", _fake_rollouts(lambda tid, k: True))
    cfg = tmp_path / "rft.yaml"
    # the expert episodes of `home` have at least 2 assistant turns; max_turns 1 removes every success
    cfg.write_text(f"algorithm: rft\nmodel: {tiny_dir}\nenv: home\noutput_dir: {tmp_path / 'rft'}\n"
                   "rft: {n_tasks: 3, k: 2, filters: {max_turns: 1}}\ntrain: {steps: 2}\n")
    r = runner.invoke(app, ["train", "--config", str(cfg), "--quiet"])
    assert r.exit_code == 3 and "nothing to train on" in r.output, r.output
    cfg.write_text(f"algorithm: rft\nmodel: {tiny_dir}\nenv: home\noutput_dir: {tmp_path / 'rft2'}\n"
                   "rft: {iterations: 1, n_tasks: 3, k: 2, filters: {max_turns: 8}}\ntrain: {steps: 1, batch_size: 2}\n")
    run(load_run_config(cfg), quiet=True)
    row = json.loads((tmp_path / "rft2" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["mined/filtered_out"] == 0 and row["mined/kept"] == 3
