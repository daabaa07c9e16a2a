"""`trajtune merge`: the merge formulas on known vectors, and whole models merged end to end."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from model_fixtures import randomize_lora_b

from trajtune.cli.main import app
from trajtune.errors import ConfigError, OutputError
from trajtune.merge import (
    RAM_PLUS_R,
    MergeOptions,
    dare,
    dare_drop,
    merge_models,
    ram,
    ram_counts,
    ram_scales,
    task_arithmetic,
    ties,
    trim_top,
)
from trajtune.models.errors import ModelLoadError

T1 = torch.tensor([1.0, 1.0, 0.0, 0.0])
T2 = torch.tensor([3.0, 0.0, 2.0, 0.0])


# --- the formulas ---------------------------------------------------------------------------------

def test_task_arithmetic_sums_task_vectors_times_lambda():
    assert task_arithmetic([T1, T2]).tolist() == [4, 1, 2, 0]
    assert task_arithmetic([T1, T2], lam=0.5).tolist() == [2, 0.5, 1, 0]


def test_ram_averages_shared_entries_and_keeps_unique_ones():
    assert ram([T1, T2]).tolist() == [2, 1, 2, 0]


def test_ram_plus_rescales_each_agents_unique_entries_by_its_shared_to_unique_ratio():
    shared, unique = ram_counts([T1, T2])
    assert (shared, unique) == ([1, 1], [1, 1])
    scales = ram_scales(shared, unique, RAM_PLUS_R)
    assert scales == pytest.approx([1.2, 1.2])
    assert ram([T1, T2], scales).tolist() == pytest.approx([2, 1.2, 2.4, 0])


def test_ram_plus_scale_is_capped_and_proportional():
    # agent 0: 1 shared, 4 unique -> 1 + 0.2 * 0.25; agent 1: 1 shared, 0 unique -> unused
    assert ram_scales([1, 3], [4, 1], 1.2) == pytest.approx([1.05, 1.2])


def test_ram_ignores_changes_below_the_threshold():
    # 1e-6 does not count as changed: entry 0 is agent 1's alone, kept whole (not halved)
    assert ram([torch.tensor([1e-6, 0.0]), torch.tensor([3.0, 0.0])]).tolist() == pytest.approx([3.0, 0.0])


def test_ties_trims_elects_sign_and_takes_the_disjoint_mean():
    a = torch.tensor([4.0, -2.0, 1.0, 0.5])
    b = torch.tensor([-1.0, 3.0, 2.0, -5.0])
    c = torch.tensor([-3.0, 1.0, -0.5, -1.5])
    # density 0.5 keeps the 2 largest |tau| of each: a [4,-2,0,0]; b [0,3,0,-5]; c [-3,0,0,-1.5]
    assert trim_top(a, 0.5).tolist() == [4, -2, 0, 0]
    # sums [1, 1, 0, -6.5] elect signs [+, +, 0, -]; entry 0: only a's +4 agrees -> 4 (c's -3 is dropped);
    # entry 1: b's +3 agrees, a's -2 does not -> 3; entry 2: nothing kept -> 0; entry 3: mean(-5, -1.5)
    assert ties([a, b, c], density=0.5).tolist() == [4, 3, 0, -3.25]
    # density 1 keeps all: sums [0, 2, 2.5, -6]; entry 0 has no elected sign -> 0; entry 1 mean(3, 1) = 2;
    # entry 2 mean(1, 2) = 1.5; entry 3 mean(-5, -1.5) = -3.25 (a's +0.5 disagrees); times lambda 2
    assert ties([a, b, c], density=1.0, lam=2.0).tolist() == [0, 4, 3, -6.5]


def test_dare_with_no_drop_equals_task_arithmetic():
    g = torch.Generator().manual_seed(0)
    assert dare([T1, T2], drop=0.0, generators=[g, g]).tolist() == task_arithmetic([T1, T2]).tolist()


def test_dare_rescales_the_survivors_of_its_mask():
    tau = torch.arange(1.0, 1001.0)
    out = dare_drop(tau, 0.75, torch.Generator().manual_seed(3))
    kept = out != 0
    assert 150 < int(kept.sum()) < 350  # about a quarter survive
    assert torch.allclose(out[kept], tau[kept] * 4)


def test_dare_is_task_arithmetic_in_expectation():
    taus = [torch.linspace(-1, 1, 50), torch.linspace(2, 0, 50)]
    runs = [dare(taus, 0.5, generators=[torch.Generator().manual_seed(2 * s), torch.Generator().manual_seed(2 * s + 1)])
            for s in range(2000)]
    assert torch.allclose(torch.stack(runs).mean(0), task_arithmetic(taus), atol=0.1)


def test_dare_with_ties_base_trims_after_dropping():
    taus = [torch.tensor([1.0, -4.0]), torch.tensor([2.0, 1.0])]
    assert dare(taus, 0.0, base="ties", density=1.0).tolist() == ties(taus, 1.0).tolist() == [1.5, -4.0]


@pytest.mark.parametrize("kwargs,n,message", [
    ({"method": "slerp"}, 2, "unknown merge method"),
    ({"method": "ties", "density": 0.0}, 2, "--density must be in (0, 1]"),
    ({"method": "ties", "density": 1.5}, 2, "--density must be in (0, 1]"),
    ({"method": "dare", "drop": 1.0}, 2, "--drop must be in [0, 1)"),
    ({"method": "dare", "drop": -0.1}, 2, "--drop must be in [0, 1)"),
    ({"method": "ta", "weights": [1.0]}, 2, "--weights has 1 value(s) but --models has 2"),
    ({"method": "ta", "density": 0.5}, 2, "--density only applies"),
    ({"method": "ram", "drop": 0.5}, 2, "--drop only applies to --method dare"),
    ({"method": "dare", "density": 0.5}, 2, "--density only applies"),
    ({"method": "dare", "dare_base": "ram"}, 2, "--dare-base must be ta or ties"),
])
def test_bad_options_are_config_errors(kwargs, n, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        MergeOptions(**kwargs).check(n)


# --- whole models ---------------------------------------------------------------------------------

def _perturbed(base_dir: Path, out: Path, seed: int, frac: float) -> Path:
    """A copy of the base with a random ``frac`` of every tensor's entries changed (an 'agent')."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(base_dir)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            mask = torch.rand(p.shape, generator=g) < frac
            p.add_(torch.where(mask, torch.randn(p.shape, generator=g) * 0.05, torch.zeros_like(p)))
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(base_dir).save_pretrained(out)
    return out


def _state(path: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return {k: v.float() for k, v in AutoModelForCausalLM.from_pretrained(path).state_dict().items()}


@pytest.fixture(scope="module")
def agents(tiny_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("agents")
    return _perturbed(tiny_dir, root / "a", 1, 0.3), _perturbed(tiny_dir, root / "b", 2, 0.3)


@pytest.fixture(scope="module")
def adapter(tiny_dir, tmp_path_factory) -> Path:
    """A LoRA adapter on the tiny model with non-zero B, so it changes the weights it targets."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_dir),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    randomize_lora_b(model, seed=5)
    out = tmp_path_factory.mktemp("lora") / "adapter"
    model.save_pretrained(out)
    return out


def _invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


def test_cli_merges_two_models_with_task_arithmetic_exactly(tiny_dir, agents, tmp_path):
    out = tmp_path / "ta"
    r = _invoke("merge", "--base", tiny_dir, "--models", *agents, "-o", out, "--method", "ta", "--weights", "1",
                "-0.5", "--lambda", "0.8")
    assert r.exit_code == 0, r.output
    assert "merged model:" in r.output
    base, a, b, merged = _state(tiny_dir), _state(agents[0]), _state(agents[1]), _state(out)
    for k in base:
        want = base[k] + 0.8 * ((a[k] - base[k]) - 0.5 * (b[k] - base[k]))
        assert torch.allclose(merged[k], want, atol=1e-6), k
    meta = json.loads((out / "merge.json").read_text())
    assert meta["method"] == "ta" and meta["options"]["weights"] == [1.0, -0.5] and meta["options"]["lambda"] == 0.8
    assert [i["kind"] for i in meta["inputs"]] == ["model", "model"] and len(meta["inputs"][0]["config_sha256"]) == 64
    # each agent changed ~30% of entries; their union (~51%) differs from the base after the merge
    assert meta["stats"]["inputs_changed"][0] == pytest.approx(0.3, abs=0.02)
    assert meta["stats"]["changed"] == pytest.approx(0.51, abs=0.03)
    assert "model.embed_tokens.weight" in meta["tensors"]
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(out).get_vocab() == AutoTokenizer.from_pretrained(tiny_dir).get_vocab()


def test_ram_plus_on_whole_models_matches_the_formula(tiny_dir, agents, tmp_path):
    res = merge_models(str(tiny_dir), [str(p) for p in agents], MergeOptions(method="ram_plus"), tmp_path / "ram")
    base, a, b, merged = _state(tiny_dir), _state(agents[0]), _state(agents[1]), _state(tmp_path / "ram")
    lam = res.summary["stats"]["ram_lambda"]
    # ~9% shared, ~21% unique per agent: lambda_j = 1 + 0.2 * (0.09 / 0.21)
    assert lam[0] == pytest.approx(1 + 0.2 * 0.09 / 0.21, abs=0.01)
    for k in base:
        want = base[k] + ram([a[k] - base[k], b[k] - base[k]], lam)
        assert torch.allclose(merged[k], want, atol=1e-6), k


def test_dare_is_deterministic_for_a_seed(tiny_dir, agents, tmp_path):
    args = ("merge", "--base", tiny_dir, "--models", *agents, "--method", "dare", "--drop", "0.5")
    assert _invoke(*args, "--seed", 7, "--out", tmp_path / "x").exit_code == 0
    assert _invoke(*args, "--seed", 7, "--out", tmp_path / "y").exit_code == 0
    assert _invoke(*args, "--seed", 8, "--out", tmp_path / "z").exit_code == 0
    x, y, z = _state(tmp_path / "x"), _state(tmp_path / "y"), _state(tmp_path / "z")
    k = "model.layers.0.mlp.up_proj.weight"
    assert torch.equal(x[k], y[k]) and not torch.equal(x[k], z[k])


def test_lora_adapter_is_merged_onto_the_base_first(tiny_dir, agents, adapter, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = tmp_path / "with-lora"
    r = _invoke("merge", "--base", tiny_dir, "--models", agents[0], adapter, "--method", "ta", "--out", out)
    assert r.exit_code == 0, r.output
    theta_lora = {k: v.float() for k, v in PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_dir), adapter).merge_and_unload().state_dict().items()}
    base, a, merged = _state(tiny_dir), _state(agents[0]), _state(out)
    k = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.allclose(theta_lora[k], base[k])  # the adapter does change q_proj
    for k in base:
        assert torch.allclose(merged[k], a[k] + theta_lora[k] - base[k], atol=1e-5), k
    assert json.loads((out / "merge.json").read_text())["inputs"][1]["kind"] == "lora_adapter"


def test_models_of_different_shapes_are_refused_naming_the_tensor(tiny_dir, agents, tmp_path):
    from transformers import AutoTokenizer

    from trajtune.models.tiny import build_model

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    other = tmp_path / "wider"
    build_model(tok, preset="nano", hidden_size=32, num_attention_heads=2, num_key_value_heads=1).save_pretrained(other)
    tok.save_pretrained(other)
    with pytest.raises(ModelLoadError, match=r"shape mismatch: tensor '.+' is \[\d+(, \d+)*\] in .*wider"):
        merge_models(str(tiny_dir), [str(agents[0]), str(other)], MergeOptions(method="ta"), tmp_path / "out")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".tmp-*"))


def test_models_with_another_tokenizer_are_refused(tiny_dir, agents, tmp_path):
    from transformers import AutoTokenizer

    other = tmp_path / "retok"
    shutil.copytree(agents[1], other)
    tok = AutoTokenizer.from_pretrained(other)
    tok.add_tokens(["<extra_token>"])
    tok.save_pretrained(other)
    r = CliRunner().invoke(app, ["merge", "--base", str(tiny_dir), "--models", str(agents[0]), str(other),
                                 "--method", "ties", "--out", str(tmp_path / "out")])
    assert r.exit_code == 4
    assert "tokenizer mismatch" in r.output and "tokens" in r.output and "Traceback" not in r.output


def test_an_existing_output_is_refused_unless_overwrite(tiny_dir, agents, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(OutputError, match="--overwrite"):
        merge_models(str(tiny_dir), [str(agents[0])], MergeOptions(method="ta"), out)
    assert (out / "keep.txt").exists()
    r = _invoke("merge", "--base", tiny_dir, "--models", agents[0], "--method", "ta", "--out", out, "--overwrite")
    assert r.exit_code == 0 and not (out / "keep.txt").exists() and (out / "merge.json").exists()


def test_cli_bad_option_is_a_one_line_error(tiny_dir, agents, tmp_path):
    r = CliRunner().invoke(app, ["merge", "--base", str(tiny_dir), "--models", str(agents[0]), str(agents[1]),
                                 "--method", "ta", "--weights", "1", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "--weights has 1 value(s) but --models has 2" in r.output
    assert "Traceback" not in r.output and not (tmp_path / "o").exists()
