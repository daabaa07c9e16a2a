"""`trajtune export`: a LoRA adapter merged into a plain HF model that loads without PEFT."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from model_fixtures import randomize_lora_b

from trajtune import __version__
from trajtune.cli.main import app
from trajtune.errors import OutputError
from trajtune.models.errors import ModelLoadError
from trajtune.models.export import export_adapter

IDS = torch.tensor([[1, 5, 17, 42, 99, 200, 3, 7]])


@pytest.fixture(scope="module")
def adapter(tiny_dir, tmp_path_factory) -> Path:
    """A LoRA adapter on the tiny model with random non-zero B, so merging it changes the weights."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_dir),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
                                      task_type="CAUSAL_LM"))
    randomize_lora_b(model, seed=11)
    out = tmp_path_factory.mktemp("lora") / "adapter"
    model.save_pretrained(out)  # no tokenizer: export takes the base's
    return out


def _invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def _adapter_logits(tiny_dir: Path, adapter: Path) -> torch.Tensor:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_dir), adapter).eval()
    with torch.no_grad():
        return model(IDS).logits


def test_cli_export_loads_without_peft_and_matches_the_adapter_logits(tiny_dir, adapter, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "exported"
    r = _invoke("export", "--model", adapter, "--out", out)
    assert r.exit_code == 0, r.output
    assert "exported model:" in r.output
    assert not (out / "adapter_config.json").exists() and (out / "config.json").exists()
    plain = AutoModelForCausalLM.from_pretrained(out).eval()
    assert not any("lora" in k for k in plain.state_dict())
    with torch.no_grad():
        got = plain(IDS).logits
    want = _adapter_logits(tiny_dir, adapter)
    base = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    with torch.no_grad():
        assert (base(IDS).logits - want).abs().max() > 1e-3  # the adapter does change the model
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    meta = json.loads((out / "export.json").read_text())
    assert meta["source_adapter"] == str(adapter) and meta["base"]["path"] == str(tiny_dir)
    assert meta["dtype"] == "float32" and meta["trajtune_version"] == __version__
    assert meta["tokenizer_from"] == "base"
    assert AutoTokenizer.from_pretrained(out).get_vocab() == AutoTokenizer.from_pretrained(tiny_dir).get_vocab()
    assert not list(tmp_path.glob(".tmp-*"))


def test_export_dtype_bfloat16_is_saved_as_bfloat16(adapter, tmp_path):
    from transformers import AutoModelForCausalLM

    res = export_adapter(str(adapter), tmp_path / "bf16", dtype="bfloat16")
    assert res.summary["dtype"] == "bfloat16"
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "bf16", dtype="auto").dtype == torch.bfloat16


def test_an_existing_out_is_refused_unless_overwrite(adapter, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(OutputError, match="--overwrite"):
        export_adapter(str(adapter), out)
    r = _invoke("export", "--model", adapter, "--out", out)
    assert r.exit_code == 7 and "--overwrite" in r.output and "Traceback" not in r.output
    assert (out / "keep.txt").exists()
    r = _invoke("export", "--model", adapter, "--out", out, "--overwrite")
    assert r.exit_code == 0, r.output
    assert not (out / "keep.txt").exists() and (out / "export.json").exists()


def test_a_full_model_dir_is_refused_with_a_one_line_error(tiny_dir, tmp_path):
    with pytest.raises(ModelLoadError, match="not a LoRA adapter directory"):
        export_adapter(str(tiny_dir), tmp_path / "x")
    r = _invoke("export", "--model", tiny_dir, "--out", tmp_path / "x")
    assert r.exit_code == 4, r.output
    assert "error:" in r.output and "not a LoRA adapter directory" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "x").exists()


def test_a_dualtune_dir_is_refused_saying_export_takes_one_adapter(adapter, tmp_path):
    dual = tmp_path / "dual"
    shutil.copytree(adapter, dual)
    (dual / "dualtune.json").write_text(json.dumps({"version": 1, "arguments": {"search": "args_search"}}))
    r = _invoke("export", "--model", dual, "--out", tmp_path / "x")
    assert r.exit_code == 4, r.output
    assert "DualTune" in r.output and "one LoRA adapter" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "x").exists()


def test_a_bad_dtype_is_a_usage_error(adapter, tmp_path):
    r = _invoke("export", "--model", adapter, "--out", tmp_path / "x", "--dtype", "int8")
    assert r.exit_code == 2 and "--dtype must be one of" in r.output and not (tmp_path / "x").exists()


def test_an_adapter_whose_base_path_is_relative_to_the_run_loads_from_anywhere(tiny_dir, adapter, tmp_path,
                                                                               monkeypatch):
    """Runs record the base as given (`runs/base`, relative to where the run started); loading and
    exporting from another working directory finds it under a directory above the adapter."""
    from trajtune.models.loading import load_model

    root = tmp_path / "project"
    shutil.copytree(tiny_dir, root / "runs" / "base")
    moved = root / "runs" / "rl" / "final"
    shutil.copytree(adapter, moved)
    cfg = moved / "adapter_config.json"
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "base_model_name_or_path": "runs/base"}))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # "runs/base" means nothing here (and reads like a hub id)
    model = load_model(str(moved), trainable=False).eval()
    with torch.no_grad():
        assert torch.allclose(model(IDS).logits, _adapter_logits(tiny_dir, adapter), atol=1e-5)
    r = _invoke("export", "--model", moved, "--out", tmp_path / "exported")
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "exported" / "export.json").read_text())["base"]["path"] == str(root / "runs" / "base")
    # a base found nowhere is still a one-line error that names the adapter's config
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "base_model_name_or_path": "runs/gone/base"}))
    with pytest.raises(ModelLoadError, match=r"does not exist.*base model that .*adapter_config\.json names"):
        load_model(str(moved), trainable=False)
