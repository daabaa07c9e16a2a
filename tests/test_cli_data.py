"""`trajtune data …` through typer's CliRunner: exit codes, atomic outputs, no tracebacks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trajtune.cli.main import app
from trajtune.errors import DataError, InputNotFoundError, ModelLoadError, OutputError, UsageError
from trajtune.formats import canonical_json

FIX = Path(__file__).parent / "fixtures" / "formats"
runner = CliRunner()


def run(*args: str):
    res = runner.invoke(app, ["data", *map(str, args)])
    # user errors end with typer.Exit / SystemExit, never an uncaught exception
    assert res.exception is None or isinstance(res.exception, SystemExit), res.output
    assert "Traceback" not in res.output
    return res


def rows(p: Path) -> list[dict]:
    return [json.loads(x) for x in p.read_text(encoding="utf-8").splitlines() if x.strip()]


def write_rows(p: Path, recs: list[dict]) -> Path:
    p.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs), encoding="utf-8")
    return p


def chat(i: int, user: str = "hello", answer: str = "hi", tool: str | None = None) -> dict:
    msgs = [{"role": "user", "content": user}]
    if tool:
        msgs += [{"role": "assistant", "content": None, "tool_calls": [
                     {"id": f"c{i}", "type": "function", "function": {"name": tool, "arguments": '{"q": 1}'}}]},
                 {"role": "tool", "tool_call_id": f"c{i}", "content": "r"}]
    msgs.append({"role": "assistant", "content": answer})
    return {"id": f"r{i}", "messages": msgs}


@pytest.mark.parametrize("cmd", ["validate", "convert", "stats", "mix", "split", "dedup"])
def test_every_command_has_help_with_example(cmd):
    res = run(cmd, "--help")
    assert res.exit_code == 0 and "Example:" in res.output


# ----------------------------------------------------------------------------- validate


def test_validate_exit_codes_and_table(tmp_path):
    good = write_rows(tmp_path / "good.jsonl", [chat(0), chat(1, tool="f")])
    assert run("validate", good).exit_code == 0
    res = run("validate", FIX / "openai_golden.jsonl")
    assert res.exit_code == 1 and "E220" in res.output and "oa-odd-args" in res.output
    warn_only = write_rows(tmp_path / "w.jsonl", [{"id": "w", "messages": [{"role": "user", "content": "x"}]}])
    assert run("validate", warn_only).exit_code == 0
    assert run("validate", warn_only, "--strict").exit_code == 1


def test_validate_json_multiple_files(tmp_path):
    good = write_rows(tmp_path / "good.jsonl", [chat(0)])
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"id": "x", "messages": []}\n{"id": "y", "messages": [')
    res = run("validate", good, bad, "--json")
    assert res.exit_code == 1
    out = json.loads(res.output)
    assert out["ok"] is False
    g, b = out["files"]
    assert (g["records"], g["valid"], g["errors"], g["ok"]) == (1, 1, 0, True)
    (f,) = [f for f in b["findings"] if f["severity"] == "E"]
    assert (f["rule"], f["line"], f["file"]) == ("E102", 2, str(bad)) and f["hint"]


def test_validate_missing_file_and_unknown_format(tmp_path):
    res = run("validate", tmp_path / "nope.jsonl")
    assert res.exit_code == InputNotFoundError.exit_code and "no such file" in res.output
    res = run("validate", FIX / "xlam.jsonl", "--from", "klingon")
    assert res.exit_code == UsageError.exit_code and "unknown format" in res.output


# ----------------------------------------------------------------------------- convert


def test_convert_round_trip_via_cli(tmp_path):
    src = FIX / "openai_golden.jsonl"  # its 5th record (oa-odd-args) has unparsable arguments: E220
    res = run("convert", src, "--to", "adp", "-o", tmp_path / "a.jsonl", "--skip-invalid")
    assert res.exit_code == 0 and "converted 4 record(s) openai -> adp" in res.output
    assert "declared losses" in res.output and "extra.openai" in res.output
    assert "skipped 1 invalid record(s) (E220×1)" in res.output and "oa-odd-args" in res.output
    res = run("convert", tmp_path / "a.jsonl", "--from", "adp", "--to", "ir", "-o", tmp_path / "ir.jsonl")
    assert res.exit_code == 0
    res = run("convert", src, "--to", "ir", "-o", tmp_path / "ir2.jsonl", "--skip-invalid")
    res = run("convert", tmp_path / "ir2.jsonl", "--to", "openai", "-o", tmp_path / "back.jsonl")
    assert res.exit_code == 0
    assert [canonical_json(r) for r in rows(tmp_path / "back.jsonl")] == [canonical_json(r) for r in rows(src)][:4]


def test_convert_refuses_overwrite_and_is_atomic(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text("precious\n")
    res = run("convert", FIX / "xlam.jsonl", "--to", "openai", "-o", out)
    assert res.exit_code == OutputError.exit_code and "--overwrite" in res.output
    assert out.read_text() == "precious\n"
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(chat(0)) + "\n{broken\n")
    res = run("convert", bad, "--to", "sharegpt", "-o", out, "--overwrite")
    assert res.exit_code == DataError.exit_code and ":2" in res.output and "E101" in res.output
    assert out.read_text() == "precious\n"  # failed run left the old output untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "out.jsonl"]  # no temp files left
    res = run("convert", FIX / "xlam.jsonl", "--to", "openai", "-o", out, "--overwrite")
    assert res.exit_code == 0 and rows(out)[0]["id"] == "x-1"


def test_convert_skip_invalid_reports_counts(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(json.dumps(chat(0)).encode() + b"\n{broken\n\xff\xfe\n" +
                    json.dumps({"messages": [{"role": "user", "content": 5}]}).encode() + b"\n" + json.dumps(chat(1)).encode() + b"\n")
    res = run("convert", bad, "--from", "openai", "--to", "hermes", "-o", tmp_path / "h.jsonl", "--skip-invalid")
    assert res.exit_code == 0
    assert "converted 2 record(s)" in res.output
    assert "skipped 3 invalid record(s) (E101×1, E103×1, E204×1)" in res.output
    assert len(rows(tmp_path / "h.jsonl")) == 2


def test_convert_autodetect_errors_are_clear(tmp_path):
    amb = write_rows(tmp_path / "amb.jsonl", [{"conversations": [
        {"from": "human", "value": "x", "loss": False}, {"from": "gpt", "value": "<tool_call>{}</tool_call>", "loss": True}]}])
    res = run("convert", amb, "--to", "openai", "-o", tmp_path / "o.jsonl")
    assert res.exit_code == DataError.exit_code and "ambiguous format" in res.output and "--from" in res.output
    assert not (tmp_path / "o.jsonl").exists()
    res = run("convert", amb, "--from", "react", "--to", "openai", "-o", tmp_path / "o.jsonl")
    assert res.exit_code == 0


# ----------------------------------------------------------------------------- stats


def test_stats_json(tmp_path):
    p = write_rows(tmp_path / "s.jsonl", [chat(0, tool="search"), chat(1, tool="search"), chat(2, tool="calc"), chat(3)])
    res = run("stats", p, "--json")
    assert res.exit_code == 0
    s = json.loads(res.output)
    assert s["records"] == 4 and s["format"] == "openai"
    assert s["tool_usage"] == {"search": 2, "calc": 1}
    assert s["messages"]["by_role"] == {"user": 4, "assistant": 7, "tool": 3}
    assert s["arguments"] == {"calls": 3, "invalid": 0, "double_encoded": 0, "schema_violations": 0}
    assert s["records_with_tool_calls"] == 3
    assert "tokens" not in s
    table = run("stats", p)
    assert table.exit_code == 0 and "search" in table.output


def test_stats_token_lengths_with_local_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "a", "b", "c", "d", "e"]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]").save_pretrained(tmp_path / "tok")
    p = write_rows(tmp_path / "t.jsonl", [chat(0, user="a b c", answer="d e"), chat(1, user="a", answer="b")])
    s = json.loads(run("stats", p, "--model", tmp_path / "tok", "--json").output)
    # no chat template: plain text of the messages, whitespace-split -> 5 and 2 tokens
    assert s["tokens"]["min"] == 2 and s["tokens"]["max"] == 5 and s["tokens"]["total"] == 7
    res = run("stats", p, "--model", tmp_path / "missing-tok")
    assert res.exit_code == ModelLoadError.exit_code and "could not load tokenizer" in res.output


def test_stats_token_lengths_through_the_chat_template(tmp_path, tiny_dir):
    """With a chat template the count is the rendered conversation, the length a trainer sees."""
    from transformers import AutoTokenizer

    recs = [chat(0, user="turn the lamp on", answer="done"), chat(1, user="hi", answer="hello there")]
    p = write_rows(tmp_path / "t.jsonl", recs)
    s = json.loads(run("stats", p, "--model", tiny_dir, "--json").output)
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    want = [len(tok(tok.apply_chat_template(r["messages"], tokenize=False), add_special_tokens=False)["input_ids"])
            for r in recs]
    assert (s["tokens"]["min"], s["tokens"]["max"], s["tokens"]["total"]) == (min(want), max(want), sum(want))


# ----------------------------------------------------------------------------- mix / split / dedup


def test_mix_weights_and_seed(tmp_path):
    a = write_rows(tmp_path / "a.jsonl", [chat(i, user=f"a{i}") for i in range(10)])
    b = write_rows(tmp_path / "b.jsonl", [chat(100 + i, user=f"b{i}") for i in range(10)])
    res = run("mix", f"{a}:0.7", f"{b}:0.3", "-o", tmp_path / "m1.jsonl", "--seed", "5")
    assert res.exit_code == 0
    out = rows(tmp_path / "m1.jsonl")
    # largest n the weights allow without repeats: min(10/0.7, 10/0.3) -> 14; 0.7*14 = 9.8 -> 10, 0.3*14 = 4.2 -> 4
    assert len(out) == 14
    srcs = [r["provenance"]["dataset"] for r in out]
    assert srcs.count("a") == 10 and srcs.count("b") == 4
    assert len({r["id"] for r in out}) == 14
    run("mix", f"{a}:0.7", f"{b}:0.3", "-o", tmp_path / "m2.jsonl", "--seed", "5")
    assert (tmp_path / "m1.jsonl").read_text() == (tmp_path / "m2.jsonl").read_text()
    run("mix", f"{a}:0.7", f"{b}:0.3", "-o", tmp_path / "m3.jsonl", "--seed", "6")
    assert (tmp_path / "m1.jsonl").read_text() != (tmp_path / "m3.jsonl").read_text()
    res = run("mix", f"{a}:0.5", f"{b}:0.5", "-o", tmp_path / "m4.jsonl", "--n", "30")
    assert res.exit_code == UsageError.exit_code and "--replace" in res.output
    assert run("mix", f"{a}:0.5", f"{b}:0.5", "-o", tmp_path / "m4.jsonl", "--n", "30", "--replace").exit_code == 0
    assert len(rows(tmp_path / "m4.jsonl")) == 30
    assert run("mix", f"{a}", "-o", tmp_path / "m5.jsonl").exit_code == UsageError.exit_code


def test_split_deterministic_and_stable(tmp_path):
    p = write_rows(tmp_path / "all.jsonl", [chat(i) for i in range(40)])
    res = run("split", p, "-o", tmp_path / "s1", "--ratios", "train=0.5,val=0.5", "--seed", "1")
    assert res.exit_code == 0
    tr, va = rows(tmp_path / "s1" / "train.jsonl"), rows(tmp_path / "s1" / "val.jsonl")
    assert len(tr) + len(va) == 40 and tr and va
    assert not ({r["id"] for r in tr} & {r["id"] for r in va})
    p2 = write_rows(tmp_path / "more.jsonl", [chat(i) for i in range(60)])
    run("split", p2, "-o", tmp_path / "s2", "--ratios", "train=0.5,val=0.5", "--seed", "1")
    tr2 = {r["id"] for r in rows(tmp_path / "s2" / "train.jsonl")}
    assert {r["id"] for r in tr} <= tr2  # adding data never moves an old record across splits
    assert run("split", p, "-o", tmp_path / "s1", "--ratios", "train=0.5,val=0.5").exit_code == OutputError.exit_code
    assert run("split", p, "-o", tmp_path / "s3", "--ratios", "train:0.5").exit_code == UsageError.exit_code


def test_dedup_exact_vs_normalized(tmp_path):
    recs = [chat(0, user="Hello  World"), chat(1, user="Hello  World"), chat(2, user="hello world"), chat(3, user="other")]
    p = write_rows(tmp_path / "d.jsonl", recs)
    res = run("dedup", p, "-o", tmp_path / "e.jsonl", "--mode", "exact")
    assert res.exit_code == 0 and "kept 3, dropped 1" in res.output  # ids differ but content equal
    res = run("dedup", p, "-o", tmp_path / "n.jsonl", "--mode", "normalized", "--to", "openai")
    assert res.exit_code == 0 and "kept 2, dropped 2" in res.output
    assert [r["id"] for r in rows(tmp_path / "n.jsonl")] == ["r0", "r3"]
    assert run("dedup", p, "-o", tmp_path / "x.jsonl", "--mode", "fuzzy").exit_code == UsageError.exit_code


def test_bad_input_corpus_never_tracebacks(tmp_path):
    cases = {
        "empty.jsonl": b"",
        "bom.jsonl": b"\xef\xbb\xbf" + json.dumps(chat(0)).encode() + b"\n",
        "utf8.jsonl": b"\xff\n",
        "trunc.jsonl": b'{"messages": [',
        "scalar.jsonl": b"42\n",
    }
    expect = {"empty.jsonl": "E104", "bom.jsonl": "W108", "utf8.jsonl": "E103", "trunc.jsonl": "E102", "scalar.jsonl": "E105"}
    for name, data in cases.items():
        p = tmp_path / name
        p.write_bytes(data)
        res = run("validate", p, "--json")
        rules = {f["rule"] for f in json.loads(res.output)["files"][0]["findings"]}
        assert expect[name] in rules, name
        assert res.exit_code == (0 if name == "bom.jsonl" else 1), name
        res = run("convert", p, "--from", "openai", "--to", "ir", "-o", tmp_path / f"{name}.out")
        assert res.exit_code in (0, DataError.exit_code)


def test_stats_counts_bad_arguments_per_call(tmp_path):
    rec = chat(0, tool="f")
    rec["messages"][1]["tool_calls"] = [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{bad"}},
        {"id": "b", "type": "function", "function": {"name": "f", "arguments": "[1]"}},
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": json.dumps(json.dumps({"x": 1}))}}]
    rec["messages"][2:3] = [{"role": "tool", "tool_call_id": x, "content": "r"} for x in "abc"]
    p = write_rows(tmp_path / "s.jsonl", [rec])
    s = json.loads(run("stats", p, "--json").output)
    assert s["arguments"] == {"calls": 3, "invalid": 2, "double_encoded": 1, "schema_violations": 0}
