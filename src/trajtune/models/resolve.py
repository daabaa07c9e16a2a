"""One function turns what a user types as a model into what ``from_pretrained`` takes.

Accepted: an alias (``smollm2-135m``, see ``trajtune models list``), a ``.gguf`` file (converted
once into a cached Hugging Face directory), a saved Hugging Face directory (a model or a PEFT
adapter) and a hub id of the form ``org/name``. Anything else is a one-line error; a bare word that
is not an alias is never passed on to the hub, where it would fail later with a long traceback.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from trajtune.models.errors import ModelLoadError
from trajtune.models.gguf import (
    alias_gguf,
    assembled_path,
    cache_root,
    cached_dir,
    convert_gguf,
    is_complete,
    read_provenance,
)
from trajtune.models.registry import ALIASES, ModelAlias, get_alias, part_paths, require_parts
from trajtune.progress import console

_HF_FILES = ("config.json", "adapter_config.json", "tokenizer_config.json")  # a tokenizer-only dir serves doctor
_CONVERTED = re.compile(r".+-[0-9a-f]{16}")  # cache dir name: <gguf stem>-<sha256 prefix>


@dataclass(frozen=True)
class ResolvedModel:
    """``path`` is what ``from_pretrained`` loads: for an alias or a GGUF file, its cached HF directory.

    A model loaded from there is named by that directory, so a LoRA adapter trained on it records the
    directory as its base: plain PEFT can load it, and PEFT's save-time check of the base vocabulary
    reads the local config.json instead of asking the hub about an alias. The directory still resolves
    when the cache was wiped or the adapter moved to another machine: see ``_converted_elsewhere``.
    """

    path: str
    kind: Literal["alias", "gguf", "dir", "hub"]


def _notify(message: str) -> None:
    console.print(message, highlight=False, soft_wrap=True)


def _looks_local(name: str) -> bool:
    """A path, not a hub id (``org/name``): it starts like one, has more than one slash, or its first
    part is a directory here (``runs/nope`` beside a ``runs/`` folder)."""
    if name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name:
        return True
    head = name.split("/", 1)[0]
    return "/" in name and Path(head).is_dir()


def _from_alias(alias: ModelAlias, notify: Callable[[str], None] | None) -> ResolvedModel:
    path = alias_gguf(alias, require_parts(alias))
    return ResolvedModel(str(convert_gguf(path, alias=alias.name, notify=notify)), "alias")


def resolve_model(name: str, *, notify: Callable[[str], None] | None = _notify) -> ResolvedModel:
    """Resolve ``name``; converts a GGUF (or an alias's GGUF) on first use, which prints ``notify``."""
    if not name or not name.strip():
        raise ModelLoadError("empty model name; pass an alias, a .gguf file, a directory or a hub id")
    if name in ALIASES:
        return _from_alias(ALIASES[name], notify)
    p = Path(name).expanduser()
    if name.lower().endswith(".gguf"):
        return ResolvedModel(str(convert_gguf(p, notify=notify)), "gguf")
    if p.is_dir():
        if not any((p / f).exists() for f in _HF_FILES) and (p / "result.json").is_file() \
                and any((p / "final" / f).exists() for f in _HF_FILES):
            p = p / "final"  # a finished training run stands for its final model (e.g. trajtune eval --model RUN)
        if not any((p / f).exists() for f in _HF_FILES):
            raise ModelLoadError(f"{name!r} is a directory without config.json, adapter_config.json or "
                                 "tokenizer_config.json: not a saved Hugging Face model")
        return ResolvedModel(str(p), "dir")
    if p.exists():
        raise ModelLoadError(f"{name!r} is a file, not a model: pass a .gguf file or a saved Hugging Face directory")
    if p.parent.name == "models" and _CONVERTED.fullmatch(p.name):
        return _converted_elsewhere(p, notify)
    if _looks_local(name):
        raise ModelLoadError(f"model path {name!r} does not exist (no such directory here); pass a saved model "
                             "directory, a .gguf file, an alias (`trajtune models list`) or a hub id")
    if "/" not in name:
        get_alias(name)  # raises: an unknown alias
    return ResolvedModel(name, "hub")


def _converted_elsewhere(p: Path, notify: Callable[[str], None] | None) -> ResolvedModel:
    """A missing GGUF conversion dir, recorded under another cache (wiped, another machine or $TRAJTUNE_CACHE).

    Its name is the GGUF's stem and content hash, so the same conversion in this cache has the same
    name, and an alias whose pinned file has that hash can be converted again.
    """
    local = cache_root() / "models" / p.name
    if is_complete(local):
        return ResolvedModel(str(local), "gguf")
    for alias in ALIASES.values():
        if cached_dir(alias.filename, alias.sha256).name == p.name:
            return _from_alias(alias, notify)
    raise ModelLoadError(f"model path {str(p)!r} does not exist; it looks like a trajtune conversion of a GGUF file "
                         f"that is not in this cache ({cache_root()}): run `trajtune models prepare FILE.gguf` with "
                         "the file it came from")


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def list_models() -> list[dict[str, object]]:
    """Every alias (installed or not) and every other GGUF conversion in the cache, with paths and sizes.

    An alias's cache directory follows from its pinned SHA-256, so listing hashes nothing.
    """
    rows: list[dict[str, object]] = []
    for alias in ALIASES.values():
        parts = part_paths(alias)
        hf = cached_dir(alias.filename, alias.sha256)
        gguf = parts[0] if parts and len(parts) == 1 else assembled_path(alias)
        rows.append({"name": alias.name, "installed": parts is not None,
                     "gguf": str(gguf) if parts and gguf.is_file() else None,
                     "gguf_bytes": sum(p.stat().st_size for p in parts) if parts else None,
                     "hf_dir": str(hf) if is_complete(hf) else None,
                     "hf_bytes": _dir_bytes(hf) if is_complete(hf) else None,
                     "licence": alias.licence, "description": alias.description, "install": alias.install})
    models = cache_root() / "models"
    for d in sorted(models.iterdir()) if models.is_dir() else []:
        if is_complete(d) and not read_provenance(d).get("alias"):
            src = Path(read_provenance(d)["source"])
            rows.append({"name": str(src), "installed": src.is_file(), "gguf": str(src),
                         "gguf_bytes": src.stat().st_size if src.is_file() else None, "hf_dir": str(d),
                         "hf_bytes": _dir_bytes(d), "licence": None, "description": "converted GGUF file",
                         "install": None})
    return rows


_HUB_CHECKED: set[str] = set()


def check_hub(name: str) -> None:
    """One quick request before a hub id is loaded, so offline is one line in a second, not a minute of
    retries per file; an id already in the local cache (or checked before) is not asked again."""
    import os

    if name in _HUB_CHECKED:
        return
    from huggingface_hub import model_info, try_to_load_from_cache
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        _HUB_CHECKED.add(name)
        return
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        raise ModelLoadError(f"{name!r} is not in the local model cache and HF_HUB_OFFLINE is set; pass a local "
                             "directory, a .gguf file or an alias (`trajtune models list`), or unset HF_HUB_OFFLINE")
    try:
        model_info(name, timeout=10)
    except GatedRepoError:
        raise ModelLoadError(f"{name!r} is gated on the model hub: accept its terms on the model page and log in "
                             "(`hf auth login`)") from None
    except RepositoryNotFoundError:
        raise ModelLoadError(f"{name!r} is not a model on the hub (or is private: log in with `hf auth login`); "
                             "check the id, or pass a local directory, a .gguf file or an alias") from None
    except Exception as e:  # noqa: BLE001 - any transport failure: the hub cannot be reached
        raise ModelLoadError(f"cannot reach the model hub to load {name!r} ({type(e).__name__}: {e}); offline? "
                             "pass a local directory, a .gguf file or an alias (`trajtune models list`)") from None
    _HUB_CHECKED.add(name)
