"""Config switches that must change a run, through ``trajtune.train.run`` on the tiny model: the RL
KL penalty against the frozen reference (its logged value recomputed by hand from the sampled
tokens), ``rl.ppo_epochs`` and ``train.eaft``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from trajtune.algorithms.registry import load_run_config
from trajtune.schema import write_trajectories
from trajtune.tokens import SOURCE_POLICY
from trajtune.train import run


def _run(algorithm: str, *overrides: str) -> list[dict]:
    cfg = load_run_config(None, ["report=false", *overrides], algorithm=algorithm)
    run(cfg, quiet=True)
    out = Path(cfg.output_dir)
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def _rl(tiny_dir, out, *extra: str) -> list[str]:
    # the length term makes rewards differ within groups, so the first step has advantages and moves the policy
    return [f"model={tiny_dir}", f"output_dir={out}", "env=home", "seed=0",
            "rollout={max_turns: 1, max_new_tokens: 6, max_length: 1024, temperature: 1.0}",
            "train.lr=1.0e-2", "train.schedule=constant", "train.micro_batch_size=8", *extra]


def test_kl_to_the_reference_is_zero_at_step_one_and_matches_a_hand_computed_k3_after(tiny_dir, tmp_path,
                                                                                       monkeypatch):
    import trajtune.experience as experience

    sampled: list[list] = []  # the episodes of each sampling call (one per step here), as the learner got them
    real = experience.run_rollouts
    monkeypatch.setattr(experience, "run_rollouts", lambda *a, **k: sampled.append(real(*a, **k)) or sampled[-1])
    rows = _run("rl", *_rl(tiny_dir, tmp_path / "kl", "train.steps=2",
                           "rl={tasks_per_step: 2, group_size: 2, kl_coef: 0.1, reward: {terms: {length: -0.1}}}"))
    assert len(sampled) == 2
    assert rows[0]["kl"] == pytest.approx(0.0, abs=1e-7)  # step 1: the policy is the reference, Δ = 0
    # step 2: the rollouts come from θ1 (their stored log-probs are log π_θ1, temperature 1); the reference
    # is the starting model, loaded here on its own: k3 = e^Δ − Δ − 1, Δ = log π_ref − log π_θ, token mean
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(str(tiny_dir), dtype=torch.float32).eval()
    terms = []
    for e in sampled[1]:
        t = e.tokens
        with torch.no_grad():
            logp = torch.log_softmax(ref(input_ids=torch.tensor([t.ids])).logits[0].double(), -1)
        for i in range(1, len(t.ids)):
            if t.source[i] == SOURCE_POLICY:
                delta = float(logp[i - 1, t.ids[i]]) - t.logprobs[i]
                terms.append(math.exp(delta) - delta - 1.0)
    assert len(terms) == rows[1]["tokens"]
    want = sum(terms) / len(terms)
    assert want > 1e-4  # the policy moved away from the reference
    assert rows[1]["kl"] == pytest.approx(want, rel=1e-3)


def test_ppo_epochs_reuse_the_batch_so_the_ratio_leaves_one_and_the_weights_differ(tiny_dir, tmp_path):
    # rewards by characters written, kept for turns cut at max_new_tokens (which the untrained model's
    # nearly all are): they differ within groups whatever the draws
    rl = ("rl={tasks_per_step: 4, group_size: 2, reward: {terms: {'envfixtures:reply_chars': -0.1}}, "
          "termination: {length: keep}")
    one = _run("rl", *_rl(tiny_dir, tmp_path / "one", "train.steps=1", rl + "}"))
    two = _run("rl", *_rl(tiny_dir, tmp_path / "two", "train.steps=1", rl + ", ppo_epochs: 2}"))
    assert one[0]["equal_reward_groups"] < one[0]["groups"]  # some advantage: the first update moves the policy
    # one pass on fresh samples: π_old is the sampling policy itself, ρ = 1
    assert one[0]["ratio"] == pytest.approx(1.0, abs=1e-5) and "updates" not in one[0]
    assert two[0]["updates"] == 2 and abs(two[0]["ratio"] - 1.0) > 1e-4  # the second pass sees the moved policy
    a = load_file(str(tmp_path / "one" / "final" / "model.safetensors"))
    b = load_file(str(tmp_path / "two" / "final" / "model.safetensors"))
    assert any(not torch.equal(a[k], b[k]) for k in a)


def test_eaft_weights_the_cross_entropy_down(tiny_dir, home_experts, tmp_path):
    data = tmp_path / "d.jsonl"
    write_trajectories(data, home_experts[:4])
    base = [f"model={tiny_dir}", "seed=0", f"data={{path: {data}, format: ir}}",
            "train={steps: 1, batch_size: 4, micro_batch_size: 4}"]
    plain = _run("sft", *base, f"output_dir={tmp_path / 'plain'}")[0]
    eaft = _run("sft", *base, f"output_dir={tmp_path / 'eaft'}", "train.eaft=true")[0]
    # the same model and batch: the same cross-entropy; EAFT's weights w = (H / ln K)^α lie in [0, 1]
    assert eaft["ce"] == pytest.approx(plain["ce"], rel=1e-6)
    assert plain["loss"] == pytest.approx(plain["ce"], rel=1e-6)
    assert 0 < eaft["loss"] < plain["loss"] - 1e-3
