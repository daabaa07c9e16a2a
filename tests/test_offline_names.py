"""Offline first: aliases and local-looking paths never reach the model hub."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trajtune.models import resolve
from trajtune.models.errors import ModelLoadError
from trajtune.models.resolve import ResolvedModel, resolve_model


def test_a_missing_path_under_a_local_folder_is_no_such_directory(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    with pytest.raises(ModelLoadError, match=r"'runs/nope' does not exist \(no such directory here\)"):
        resolve_model("runs/nope")
    # with no such folder here, org/name is a hub id, as the user typed it
    assert resolve_model("someorg/nope") == ResolvedModel("someorg/nope", "hub")


def test_context_length_of_an_alias_reads_its_local_conversion(tiny_dir, tiny_tok, tmp_path, monkeypatch) -> None:
    """Before, the alias's name itself went to AutoConfig.from_pretrained: hub retries offline."""
    from transformers import AutoConfig

    from trajtune.eval.run import model_context_length

    monkeypatch.setattr(resolve, "ALIASES", {**resolve.ALIASES, "tiny-alias": object()})
    monkeypatch.setattr(resolve, "_from_alias", lambda alias, notify: ResolvedModel(str(tiny_dir), "alias"))
    asked: list[str] = []
    real = AutoConfig.from_pretrained

    def spy(name, *a, **kw):
        asked.append(str(name))
        return real(name, *a, **kw)

    monkeypatch.setattr(AutoConfig, "from_pretrained", spy)
    expected = min(n for n in (AutoConfig.from_pretrained(str(tiny_dir)).max_position_embeddings,
                               tiny_tok.model_max_length) if 0 < n < 10_000_000)
    asked.clear()
    assert model_context_length("tiny-alias", tiny_tok) == expected
    assert asked == [str(tiny_dir)]
    # an adapter directory whose base is named by the alias: the base's local conversion too
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "tiny-alias"}))
    asked.clear()
    assert model_context_length(str(adapter), tiny_tok) == expected
    assert asked == [str(tiny_dir)]
    assert Path(asked[0]).is_dir()


def _no_hub_retries(monkeypatch) -> list[str]:
    """Record what would reach transformers' loaders (each retries for a minute offline)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    reached: list[str] = []
    for cls in (AutoTokenizer, AutoModelForCausalLM):
        monkeypatch.setattr(cls, "from_pretrained", lambda name, *a, **kw: reached.append(str(name)))
    monkeypatch.setattr(resolve, "_HUB_CHECKED", set())
    return reached


def test_an_unreachable_hub_is_one_error_before_any_loader_retries(monkeypatch) -> None:
    import huggingface_hub

    from trajtune.models.loading import load_model, load_tokenizer

    reached = _no_hub_retries(monkeypatch)
    asked: list[str] = []

    def offline(name, timeout=None):
        asked.append(name)
        raise ConnectionError("[Errno -2] Name or service not known")

    monkeypatch.setattr(huggingface_hub, "model_info", offline)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    for load in (load_tokenizer, load_model):
        with pytest.raises(ModelLoadError, match=r"cannot reach the model hub to load 'someorg/nope' "
                                                 r"\(ConnectionError: .*Name or service not known\); offline\?"):
            load("someorg/nope")
    assert asked == ["someorg/nope", "someorg/nope"] and reached == []


def test_hub_ids_that_do_not_exist_or_with_the_hub_switched_off(monkeypatch) -> None:
    import huggingface_hub
    from huggingface_hub.errors import RepositoryNotFoundError

    from trajtune.models.loading import load_tokenizer

    reached = _no_hub_retries(monkeypatch)

    def missing(name, timeout=None):
        err = RepositoryNotFoundError.__new__(RepositoryNotFoundError)  # its __init__ wants an HTTP response
        Exception.__init__(err, "404 Repository Not Found")
        raise err

    monkeypatch.setattr(huggingface_hub, "model_info", missing)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(ModelLoadError, match="'someorg/typo' is not a model on the hub"):
        load_tokenizer("someorg/typo")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub, "model_info", lambda *a, **kw: pytest.fail("asked the hub while offline"))
    with pytest.raises(ModelLoadError, match="not in the local model cache and HF_HUB_OFFLINE is set"):
        load_tokenizer("someorg/other")
    assert reached == []


def test_a_hub_id_that_answers_is_loaded_and_checked_once(monkeypatch) -> None:
    import huggingface_hub

    from trajtune.models.loading import load_tokenizer

    reached = _no_hub_retries(monkeypatch)
    asked: list[str] = []
    monkeypatch.setattr(huggingface_hub, "model_info", lambda name, timeout=None: asked.append(name))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    for _ in range(2):
        with pytest.raises(AttributeError):  # the recorded stand-in returns None, not a tokenizer
            load_tokenizer("someorg/real")
    assert asked == ["someorg/real"] and reached == ["someorg/real", "someorg/real"]
