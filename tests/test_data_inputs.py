"""Inputs people have: gzip files, xLAM-60k rows, single-turn function calling, single-quoted Hermes
calls, AgentInstruct records ending on an action, double-encoded arguments — each read, validated,
converted (round trip) and, where it matters, trained; plus the error messages for paths that are
not data files and outputs that cannot be written."""

from __future__ import annotations

import gzip
import json
import tempfile
from pathlib import Path

import pytest
from chat_fixtures import tokenizer_for
from typer.testing import CliRunner

from trajtune.chat.render import SOURCE_POLICY, ChatRenderer
from trajtune.cli.main import app
from trajtune.errors import DataError, OutputError
from trajtune.formats import canonical_json, detect_format, get_format, load_any
from trajtune.schema import Message
from trajtune.validate import validate_file, validate_trajectory

runner = CliRunner()


def cli(*args: object):
    res = runner.invoke(app, ["data", *map(str, args)])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.output
    assert "Traceback" not in res.output
    return res


def jsonl(recs: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs)


def write(p: Path, recs: list[dict]) -> Path:
    p.write_text(jsonl(recs), encoding="utf-8")
    return p


def single_turn(i: int, name: str = "get_weather", args: str = '{"city": "Paris"}') -> dict:
    """The shape of every single-turn function-calling dataset: the call is the target, no result follows."""
    return {"id": f"s{i}", "messages": [
        {"role": "user", "content": f"Weather in city {i}?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": args}}]}],
            "tools": [{"type": "function", "function": {"name": "get_weather", "description": "w",
                                                        "parameters": {"type": "object",
                                                                       "properties": {"city": {"type": "string"}}}}}]}


XLAM_ROW = {
    "id": 7,
    "query": "Where can I find live giveaways for beta access and games?",
    "answers": json.dumps([{"name": "live_giveaways_by_type", "arguments": {"type": "beta"}},
                           {"name": "live_giveaways_by_type", "arguments": {"type": "game"}}]),
    "tools": json.dumps([{"name": "live_giveaways_by_type",
                          "description": "Retrieve live giveaways from the GamerPower API.",
                          "parameters": {"type": {"description": "The type of giveaways (game, loot, beta).",
                                                  "type": "str", "default": "game"},
                                         "platform": {"description": "Platform name.", "type": "str, optional"},
                                         "limit": {"description": "How many.", "type": "int"}}}]),
}


# ----------------------------------------------------------------------------- single-turn function calling


def test_160_single_turn_function_calling_records_validate_and_convert(tmp_path):
    p = write(tmp_path / "fc.jsonl", [single_turn(i) for i in range(160)])
    found = validate_file(p)
    assert [f for f in found if f.severity == "E"] == []
    res = cli("validate", p)
    assert res.exit_code == 0 and "160 records, 160 valid, 0 errors" in res.output
    res = cli("convert", p, "--to", "ir", "-o", tmp_path / "fc.ir.jsonl")
    assert res.exit_code == 0 and "converted 160 record(s)" in res.output


def test_a_result_missing_in_the_middle_is_still_an_error():
    t, _ = get_format("openai").to_ir(single_turn(0))
    t.messages.append(Message(role="user", content="and tomorrow?"))
    t.messages.append(Message(role="assistant", content="Sunny."))
    assert ("E212", 1) in {(f.rule, f.message_index) for f in validate_trajectory(t)}


@pytest.mark.parametrize("family", ["chatml", "qwen3"])
def test_single_turn_call_is_the_trained_target_with_its_end_of_turn(family):
    tok = tokenizer_for(family)
    t, _ = get_format("openai").to_ir(single_turn(0))
    tt = ChatRenderer(tok).render(t)
    policy = tok.decode(tt.policy_ids())
    assert '"name": "get_weather"' in policy and '"city": "Paris"' in policy
    assert policy.endswith("<|im_end|>")
    assert all(w == 1.0 for w, s in zip(tt.weight, tt.source) if s == SOURCE_POLICY)


# ----------------------------------------------------------------------------- xLAM function-calling-60k rows


def test_xlam_60k_row_becomes_the_single_turn_shape():
    assert detect_format(XLAM_ROW) == "xlam-fc"
    F = get_format("xlam-function-calling-60k")  # the dataset's name works as an alias
    t, rep = F.to_ir(XLAM_ROW)
    assert [m.role for m in t.messages] == ["user", "assistant"]
    assert t.messages[0].content == XLAM_ROW["query"]
    assert [(c.name, c.arguments) for c in t.messages[1].tool_calls] == [
        ("live_giveaways_by_type", {"type": "beta"}), ("live_giveaways_by_type", {"type": "game"})]
    params = t.tools[0].parameters
    assert params["properties"]["type"]["type"] == "string" and params["properties"]["limit"]["type"] == "integer"
    assert params["required"] == ["limit"]  # a default or ", optional" makes a parameter optional
    assert [f for f in validate_trajectory(t) if f.severity == "E"] == []


def test_xlam_60k_round_trip_is_byte_exact(tmp_path):
    rows = [XLAM_ROW, {**XLAM_ROW, "id": 8, "answers": json.dumps([{"name": "f", "arguments": {"q": "é"}}],
                                                                   ensure_ascii=True)}]
    src = write(tmp_path / "x.jsonl", rows)
    assert cli("convert", src, "--to", "ir", "-o", tmp_path / "ir.jsonl").exit_code == 0
    assert cli("convert", tmp_path / "ir.jsonl", "--to", "xlam-60k", "-o", tmp_path / "back.jsonl").exit_code == 0
    back = [json.loads(x) for x in (tmp_path / "back.jsonl").read_text(encoding="utf-8").splitlines()]
    assert back == rows  # strings included: answers/tools come back as the very same JSON text


def test_xlam_60k_rows_holding_lists_and_export_of_other_data():
    F = get_format("xlam-fc")
    listed = {**XLAM_ROW, "answers": json.loads(XLAM_ROW["answers"]), "tools": json.loads(XLAM_ROW["tools"])}
    t, _ = F.to_ir(listed)
    assert canonical_json(F.from_ir(t)[0]) == canonical_json(listed)
    multi, _ = get_format("openai").to_ir(single_turn(1))
    multi.messages += [Message(role="tool", tool_call_id="c1", content="sunny"),
                       Message(role="assistant", content="It is sunny.")]
    rec, rep = F.from_ir(multi)
    assert json.loads(rec["answers"]) == [{"name": "get_weather", "arguments": {"city": "Paris"}}]
    assert "turns" in rep.losses
    with pytest.raises(Exception, match="answers"):
        F.to_ir({**XLAM_ROW, "answers": "[{not json"})


# ----------------------------------------------------------------------------- Hermes single quotes, AgentInstruct


def test_single_quoted_hermes_calls_convert_with_a_warning():
    rec = {"conversations": [{"from": "human", "value": "hi"},
                             {"from": "gpt", "value": "<tool_call>{'name': 'f', 'arguments': {'a': 1, 'b': True}}</tool_call>"},
                             {"from": "tool", "value": "<tool_response>ok</tool_response>"},
                             {"from": "gpt", "value": "done"}]}
    t, rep = get_format("hermes").to_ir(rec)
    (call,) = t.messages[1].tool_calls
    assert (call.name, call.arguments) == ("f", {"a": 1, "b": True})
    assert t.messages[2].tool_call_id == call.id
    assert any("not strict JSON" in w for w in rep.warnings)
    assert [f for f in validate_trajectory(t) if f.severity == "E"] == []
    # round trip through Hermes text writes strict JSON
    back, _ = get_format("hermes").from_ir(t)
    t2, rep2 = get_format("hermes").to_ir(back)
    assert t2.messages[1].tool_calls[0].arguments == {"a": 1, "b": True} and rep2.warnings == []
    # never evaluated: a call expression is not a literal
    evil = {"conversations": [{"from": "human", "value": "x"},
                              {"from": "gpt", "value": "<tool_call>{'name': __import__('os').getcwd()}</tool_call>"}]}
    t3, rep3 = get_format("hermes").to_ir(evil)
    assert t3.messages[1].tool_calls is None and any("invalid JSON" in w for w in rep3.warnings)


AGENTINSTRUCT = {"id": "ai-end", "conversations": [
    {"from": "human", "value": "Find the price of a red mug.", "loss": False},
    {"from": "gpt", "value": "Thought: I should search.\nAction: search[red mug]", "loss": True},
    {"from": "human", "value": "Observation: [B01] Red Mug $5", "loss": False},
    {"from": "gpt", "value": "Thought: Open it.\nAction: click[B01]", "loss": True}]}


def test_agentinstruct_record_ending_on_an_action_converts_and_trains_that_action(tmp_path):
    p = write(tmp_path / "ai.jsonl", [AGENTINSTRUCT])
    assert [f for f in validate_file(p) if f.severity == "E"] == []
    res = cli("convert", p, "--from", "agentinstruct", "--to", "ir", "-o", tmp_path / "ai.ir.jsonl")
    assert res.exit_code == 0 and "converted 1 record(s)" in res.output
    (t,) = load_any(tmp_path / "ai.ir.jsonl")
    last = t.messages[-1].tool_calls[0]
    assert (last.name, last.input) == ("click", "B01")
    tok = tokenizer_for("chatml")
    tt = ChatRenderer(tok).render(t)
    policy = tok.decode(tt.policy_ids())
    assert policy.rstrip().endswith('{"name": "click", "arguments": {"input": "B01"}}\n</tool_call><|im_end|>')
    assert '"input": "red mug"' in policy  # the free-text action input is trained, not dropped


# ----------------------------------------------------------------------------- double-encoded arguments


def test_double_encoded_arguments_keep_their_content_in_every_export(tmp_path):
    rec = {"id": "d1", "messages": [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": json.dumps(json.dumps({"a": 1}))}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "r"},
        {"role": "assistant", "content": "ok"}]}
    t, _ = get_format("openai").to_ir(rec)
    call = t.messages[1].tool_calls[0]
    assert call.arguments == {"a": 1} and call.arguments_raw == json.dumps(json.dumps({"a": 1}))
    found = validate_trajectory(t)
    assert [f.rule for f in found] == ["W222"] and "double-encoded" in found[0].message
    assert canonical_json(get_format("openai").from_ir(t)[0]) == canonical_json(rec)  # identity kept
    xlam, rep = get_format("xlam").from_ir(t)
    assert xlam["conversation"][1]["tool_calls"][0]["function"]["arguments"] == {"a": 1}
    assert "invalid_arguments" not in rep.losses
    sharegpt, _ = get_format("sharegpt").from_ir(t)
    assert {"name": "f", "arguments": {"a": 1}} in [json.loads(c["value"]) for c in sharegpt["conversations"]
                                                     if c["from"] == "function_call"]
    hermes, _ = get_format("hermes").from_ir(t)
    assert '"arguments": {"a": 1}' in hermes["conversations"][1]["value"]
    react, _ = get_format("react").from_ir(t)
    assert 'Action Input: {"a": 1}' in react["conversations"][1]["value"]
    adp, _ = get_format("adp").from_ir(t)
    assert {"a": 1} in [item.get("kwargs") for item in adp["content"]]


# ----------------------------------------------------------------------------- gzip


def test_gzip_input_reads_everywhere_and_round_trips(tmp_path):
    recs = [single_turn(i) for i in range(3)]
    plain = write(tmp_path / "d.jsonl", recs)
    gz = tmp_path / "d.jsonl.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    assert validate_file(gz) == validate_file(plain) == []
    assert cli("validate", gz).exit_code == 0
    res = cli("convert", gz, "--to", "openai", "-o", tmp_path / "out.jsonl")
    assert res.exit_code == 0 and "converted 3 record(s)" in res.output
    assert [canonical_json(json.loads(x)) for x in (tmp_path / "out.jsonl").read_text().splitlines()] == \
        [canonical_json(r) for r in recs]
    stats = json.loads(cli("stats", gz, "--json").output)
    assert stats["records"] == 3 and stats["tool_calls"] == 3
    assert [t.id for t in load_any(gz)] == ["s0", "s1", "s2"]
    from trajtune.schema import load_trajectories, write_trajectories

    write_trajectories(tmp_path / "ir.jsonl", list(load_any(gz)))
    (tmp_path / "ir.jsonl.gz").write_bytes(gzip.compress((tmp_path / "ir.jsonl").read_bytes()))
    assert [t.id for t in load_trajectories(tmp_path / "ir.jsonl.gz")] == ["s0", "s1", "s2"]


def test_a_cut_off_gzip_file_is_one_clear_finding(tmp_path):
    data = gzip.compress(jsonl([single_turn(i) for i in range(50)]).encode())
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(data[: len(data) // 2])
    errors = [f for f in validate_file(cut) if f.severity == "E"]
    assert [f.rule for f in errors] == ["E102"] and "gzip" in errors[0].message
    res = cli("convert", cut, "--to", "ir", "-o", tmp_path / "o.jsonl")
    assert res.exit_code == DataError.exit_code and "E102" in res.output and not (tmp_path / "o.jsonl").exists()


def test_other_compressions_are_named_not_read_as_utf8(tmp_path):
    xz = tmp_path / "d.jsonl.xz"
    xz.write_bytes(b"\xfd7zXZ\x00" + bytes(range(256)) * 4)
    res = cli("validate", xz)
    assert res.exit_code != 0 and "xz-compressed" in res.output and "UTF-8" not in res.output


# ----------------------------------------------------------------------------- paths that are not data files


@pytest.mark.parametrize("cmd", [["validate"], ["convert", "--to", "ir", "-o", "OUT"], ["stats"],
                                 ["dedup", "-o", "OUT"], ["split", "-o", "OUTDIR"]])
def test_a_directory_input_says_so_and_what_to_pass(tmp_path, cmd):
    d = tmp_path / "shards"
    d.mkdir()
    write(d / "part-0.jsonl", [single_turn(0)])
    args = [str(tmp_path / "x.jsonl") if a == "OUT" else str(tmp_path / "outdir") if a == "OUTDIR" else a
            for a in cmd]
    res = cli(args[0], d, *args[1:])
    assert res.exit_code == DataError.exit_code
    assert f"{d}: is a directory" in res.output and str(d / "part-0.jsonl") in res.output
    assert "no such file" not in res.output


def test_an_unwritable_output_names_the_output_not_a_temp_file(tmp_path, monkeypatch):
    src = write(tmp_path / "d.jsonl", [single_turn(0)])
    blocker = tmp_path / "file"
    blocker.write_text("x")
    res = cli("convert", src, "--to", "ir", "-o", blocker / "out.jsonl")
    assert res.exit_code == OutputError.exit_code and f"cannot write {blocker / 'out.jsonl'}" in res.output and ".tmp" not in res.output

    def denied(*a, **kw):  # what a read-only directory gives a non-root user
        raise PermissionError(13, "Permission denied", str(tmp_path / "ro" / ".out.jsonl.abc123.tmp"))

    monkeypatch.setattr(tempfile, "mkstemp", denied)
    out = tmp_path / "ro" / "out.jsonl"
    res = cli("convert", src, "--to", "ir", "-o", out)
    assert res.exit_code == OutputError.exit_code and f"cannot write {out}: Permission denied" in res.output
    assert ".tmp" not in res.output


# ----------------------------------------------------------------------------- convert / stats


def test_convert_refuses_what_validate_rejects_unless_skip_invalid(tmp_path):
    orphan = {"id": "orphan", "messages": [{"role": "user", "content": "x"},
                                           {"role": "tool", "tool_call_id": "zz", "content": "r"},
                                           {"role": "assistant", "content": "ok"}]}
    missing = {"id": "missing", "messages": [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "user", "content": "well?"}, {"role": "assistant", "content": "ok"}]}
    src = write(tmp_path / "mixed.jsonl", [single_turn(0), orphan, missing, single_turn(1)])
    assert cli("validate", src).exit_code == 1
    out = tmp_path / "out.jsonl"
    res = cli("convert", src, "--to", "sharegpt", "-o", out)
    assert res.exit_code == DataError.exit_code and not out.exists()
    assert f"{src}:2 [id=orphan]: E211" in res.output and "messages[1]" in res.output
    assert "hint:" in res.output and "--skip-invalid" in res.output
    res = cli("convert", src, "--to", "sharegpt", "-o", out, "--skip-invalid")
    assert res.exit_code == 0 and "converted 2 record(s)" in res.output
    assert "skipped 2 invalid record(s) (E211×1, E212×1)" in res.output and f"{src}:3 [id=missing]" in res.output
    assert len(out.read_text().splitlines()) == 2


def test_stats_counts_tokens_through_the_chat_template(tmp_path):
    tok = tokenizer_for("chatml")
    tok.save_pretrained(tmp_path / "tok")
    src = write(tmp_path / "d.jsonl", [single_turn(0)])
    s = json.loads(cli("stats", src, "--model", tmp_path / "tok", "--json").output)
    t, _ = get_format("openai").to_ir(single_turn(0))
    from trajtune.chat.render import message_to_template_dict, tools_to_template

    expected = tok.apply_chat_template([message_to_template_dict(m) for m in t.messages],
                                       tools=tools_to_template(t.tools), tokenize=True, return_dict=True)["input_ids"]
    assert len(expected) > 20
    assert s["tokens"]["min"] == s["tokens"]["max"] == len(expected)


# ----------------------------------------------------------------------------- sft


def _sft_cfg(tiny_dir: Path, data: Path, out: Path, **data_kw):
    from trajtune.algorithms.sft import SFTRunConfig

    return SFTRunConfig.model_validate({
        "model": str(tiny_dir), "output_dir": str(out),
        "data": {"path": str(data), "max_length": 512, **data_kw},
        "train": {"steps": 1, "lr": 1e-3, "batch_size": 2, "micro_batch_size": 2}})


def test_sft_validates_counts_skips_and_drops(tmp_path, tiny_dir):
    from trajtune.schema import RecordError
    from trajtune.train import run_sft

    orphan = {"id": "orphan", "messages": [{"role": "user", "content": "x"},
                                           {"role": "tool", "tool_call_id": "zz", "content": "r"},
                                           {"role": "assistant", "content": "ok"}]}
    no_assistant = {"id": "q-only", "messages": [{"role": "user", "content": "just a question"}]}
    data = tmp_path / "d.jsonl.gz"
    data.write_bytes(gzip.compress(jsonl([single_turn(0), orphan, single_turn(1), no_assistant,
                                          single_turn(2)]).encode()))
    with pytest.raises(RecordError, match=r"d\.jsonl\.gz:2 \[id=orphan\]: E211"):
        run_sft(_sft_cfg(tiny_dir, data, tmp_path / "r0"), quiet=True)
    assert not (tmp_path / "r0").exists()  # refused before anything was written
    result = run_sft(_sft_cfg(tiny_dir, data, tmp_path / "r1", skip_invalid=True), quiet=True)
    written = json.loads((tmp_path / "r1" / "result.json").read_text())
    for r in (result, written):
        assert r["train_records"] == 3  # the three single-turn calls are trained
        assert r["invalid_skipped"] == 1 and r["invalid_by_rule"] == {"E211": 1}
        assert r["dropped_records"] == {"no_assistant_turn": 1}
    only_questions = write(tmp_path / "q.jsonl", [no_assistant, {**no_assistant, "id": "q2"}])
    with pytest.raises(ValueError, match=r"none of the 2 records has a trained token .*no_assistant_turn': 2"):
        run_sft(_sft_cfg(tiny_dir, only_questions, tmp_path / "r2"), quiet=True)


# ----------------------------------------------------------------------------- nesting depth in data files


def test_records_nested_too_deep_are_one_located_error_everywhere(tmp_path):
    from trajtune.schema import MAX_RECORD_DEPTH, MAX_VALUE_DEPTH

    deep: object = 1
    for _ in range(MAX_RECORD_DEPTH + 50):
        deep = {"a": deep}
    in_record = {"id": "r", "messages": [{"role": "user", "content": "x"},
                                         {"role": "assistant", "content": "y", "extra": {"d": deep}}]}
    args = '{"a": ' * (MAX_VALUE_DEPTH + 20) + "1" + "}" * (MAX_VALUE_DEPTH + 20)
    in_string = {"id": "h", "conversations": [
        {"from": "human", "value": "x"},
        {"from": "gpt", "value": '<tool_call>{"name": "f", "arguments": ' + args + "}</tool_call>"}]}
    for name, rec, fmt in (("rec", in_record, "openai"), ("str", in_string, "hermes")):
        p = write(tmp_path / f"{name}.jsonl", [rec, single_turn(1)] if fmt == "openai" else [rec])
        errors = [f for f in validate_file(p, fmt) if f.severity == "E"]
        assert [(f.rule, f.line) for f in errors] == [("E112", 1)], name
        res = cli("convert", p, "--from", fmt, "--to", "ir", "-o", tmp_path / f"{name}.out.jsonl")
        assert res.exit_code == DataError.exit_code and f"{p}:1" in res.output and "E112" in res.output, res.output
        assert json.loads(cli("stats", p, "--from", fmt, "--json").output)["invalid_by_rule"] == {"E112": 1}
