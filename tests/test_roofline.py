"""benchmarks/_roofline.py: FLOP counts by hand, and results as fractions of measured limits."""

from __future__ import annotations

import json

import pytest

from benchmark_module import load  # pytest puts tests/ on sys.path

rl = load("_roofline")


def test_smollm2_135m_matmul_params_by_hand():
    # per layer: q 576·576 + k,v 2·576·192 + o 576·576 = 884,736; MLP 3·576·1536 = 2,654,208
    # 30 layers: 106,168,320; LM head 576·49152 = 28,311,552 (tied, but still a matmul)
    assert rl.matmul_params(rl.SMOLLM2_135M) == 30 * (884_736 + 2_654_208) + 28_311_552 == 134_479_872
    # + 61 RMSNorm weights of 576 = the model's published 134,515,008 parameters
    assert rl.matmul_params(rl.SMOLLM2_135M) + 61 * 576 == 134_515_008


def test_flops_per_token_forward_backward_and_attention_by_hand():
    n = 134_479_872
    assert rl.model_flops_per_token(rl.SMOLLM2_135M, 0, training=False) == 2 * n
    # attention at 512 keys: 4 · 30 layers · 512 · (9 heads · 64) = 35,389,440
    assert rl.model_flops_per_token(rl.SMOLLM2_135M, 512, training=False) == 2 * n + 35_389_440
    assert rl.model_flops_per_token(rl.SMOLLM2_135M, 512, training=True) == 3 * (2 * n + 35_389_440)
    # causal: the mean context of a 511-token sequence is 256 keys
    assert rl.model_flops_per_token(rl.SMOLLM2_135M, 511, training=False, causal=True) == 2 * n + 35_389_440 / 2


def test_a_tiny_config_by_hand_and_against_a_built_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=8, intermediate_size=16, vocab_size=10, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False)
    # head_dim 4: q 8·8, k,v 2·8·4, o 8·8 = 192; MLP 3·8·16 = 384; 2 layers = 1152; head 8·10 = 80
    assert rl.matmul_params(cfg) == 1232
    assert rl.model_flops_per_token(cfg, 3, training=True) == 3 * (2 * 1232 + 4 * 2 * 3 * 8)
    import torch

    model = LlamaForCausalLM(cfg)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert rl.matmul_params(cfg) == linear
    assert [s[1:] for s in rl.layer_shapes(cfg)] == [(8, 8), (8, 4), (8, 8), (8, 16), (16, 8), (8, 10)]


def test_fractions_of_the_measured_limits(tmp_path):
    f = tmp_path / "roofline.json"
    f.write_text(json.dumps({"peaks": {
        "1": {"gflops": 50.0, "gflops_by_m": {"1": 5.0, "512": 50.0}, "read_gb_s": 10.0, "copy_gb_s": 8.0},
        "2": {"gflops": 100.0, "gflops_by_m": {"1": 8.0, "512": 100.0}, "read_gb_s": 16.0, "copy_gb_s": 12.0}}}))
    limits = rl.load_limits(f)
    assert rl.fraction(25e9, limits, threads=1) == pytest.approx(0.5)
    assert rl.fraction(25e9, limits, threads=2) == pytest.approx(0.25)
    assert rl.fraction(4e9, limits, threads=2, m=1) == pytest.approx(0.5)
    # 0.5 GB of weights read per step, 16 steps/s = 8 GB/s of 16
    assert rl.decode_bandwidth_fraction(0.5e9, 16, limits, threads=2) == pytest.approx(0.5)
    assert rl.decode_bandwidth_fraction(0.5e9, 64, limits, threads=2, batch=4) == pytest.approx(0.5)
    with pytest.raises(KeyError, match="measured: \\[1, 2\\]"):
        rl.fraction(1e9, limits, threads=4)


def test_sequence_and_continuation_flops_by_hand():
    from transformers import LlamaConfig

    cfg = LlamaConfig(hidden_size=8, intermediate_size=16, vocab_size=10, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False)
    # 3 tokens attend to 1, 2 and 3 keys: 3 · 2 · 1232 + 4 · 2 layers · 8 · (1 + 2 + 3)
    assert rl.sequence_flops(cfg, 3, training=False) == 3 * 2 * 1232 + 4 * 2 * 8 * 6
    assert rl.sequence_flops(cfg, 3, training=True) == 3 * (3 * 2 * 1232 + 4 * 2 * 8 * 6)
    assert rl.sequence_flops(cfg, 0, training=False) == 0
    # 2 tokens after 3 cached ones attend to 4 and 5 keys
    assert rl.continuation_flops(cfg, 3, 2) == pytest.approx(2 * 2 * 1232 + 4 * 2 * 8 * 9)
    # the LM head (8 · 10 = 80 weights) at 1 position of 3 instead of all: 2 · 80 · 2 fewer, ×3 training
    assert rl.head_params(cfg) == 80
    assert rl.sequence_flops(cfg, 3, training=False, head=1) == 3 * 2 * 1232 + 4 * 2 * 8 * 6 - 2 * 2 * 80
    assert rl.sequence_flops(cfg, 3, training=True, head=0) == 3 * (3 * 2 * 1152 + 4 * 2 * 8 * 6)
    assert rl.continuation_flops(cfg, 3, 2, head=1) == pytest.approx(2 * 2 * 1152 + 4 * 2 * 8 * 9 + 2 * 80)


def test_rate_columns_with_and_without_limits(tmp_path):
    f = tmp_path / "roofline.json"
    f.write_text(json.dumps({"peaks": {"1": {"gflops": 50.0, "gflops_by_m": {"32": 40.0}, "read_gb_s": 10.0}}}))
    limits = rl.limits_or_none(f)
    assert rl.rate(50e9, 2.0, limits, 1) == {"gflops": 25.0, "matmul_fraction": 0.5}
    assert rl.rate(50e9, 2.0, limits, 1, m=32)["matmul_fraction"] == pytest.approx(25 / 40)
    assert rl.rate(50e9, 2.0, limits, 2) == {"gflops": 25.0, "matmul_fraction": None}  # not measured at 2 threads
    assert rl.limits_or_none(tmp_path / "absent.json") is None
    assert rl.rate(50e9, 2.0, None, 1)["matmul_fraction"] is None
    assert (rl.pct(0.456), rl.pct(None)) == ("46%", "-")
    kept = rl.recorded_peaks(limits)  # the file's peaks, per thread count
    assert set(kept) == {"1"} and (kept["1"]["gflops"], kept["1"]["read_gb_s"]) == (50.0, 10.0)
    assert rl.recorded_peaks(None) is None
    import argparse

    ap = argparse.ArgumentParser()
    rl.add_roofline_arg(ap)
    assert ap.parse_args([]).roofline is None and ap.parse_args(["--roofline", str(f)]).roofline == str(f)


def test_trained_tokens_are_the_loss_masks_policy_tokens_of_weight_above_zero():
    from trajtune.tokens import SOURCE_POLICY, SOURCE_PROMPT, TokenTrajectory

    row = TokenTrajectory(ids=[1, 2, 3, 4, 5], source=[SOURCE_PROMPT, SOURCE_POLICY, SOURCE_POLICY, SOURCE_PROMPT,
                                                       SOURCE_POLICY],
                          turn=[0] * 5, weight=[1.0, 1.0, 0.0, 1.0, 0.5], logprobs=[0.0] * 5)
    assert rl.trained_tokens(row) == 2  # positions 1 and 4; 2 has weight 0, 0 and 3 are prompt
