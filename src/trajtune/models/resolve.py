"""One function turns what a user types as a model into what ``from_pretrained`` takes.

Accepted: an alias (``smollm2-135m``, see ``trajtune models list``), a ``.gguf`` file (converted
once into a cached Hugging Face directory), a saved Hugging Face directory (a model or a PEFT
adapter) and a hub id of the form ``org/name``. Anything else is a one-line error; a bare word that
is not an alias is never passed on to the hub, where it would fail later with a long traceback.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from trajtune.models.errors import ModelLoadError
from trajtune.models.gguf import alias_gguf, convert_gguf
from trajtune.models.registry import ALIASES, get_alias, require_parts


@dataclass(frozen=True)
class ResolvedModel:
    """``path`` is what ``from_pretrained`` loads; ``reference`` is what to record so it resolves again.

    For an alias the reference is the alias and for a GGUF file its absolute path, never the cache
    directory: the cache is derived data (deletable, different per machine and per $TRAJTUNE_CACHE)
    and is rebuilt from the reference on demand.
    """

    path: str
    reference: str
    kind: Literal["alias", "gguf", "dir", "hub"]


def _notify(message: str) -> None:
    from trajtune.progress import console

    console.print(message, highlight=False, soft_wrap=True)


_HF_FILES = ("config.json", "adapter_config.json", "tokenizer_config.json")  # a tokenizer-only dir serves doctor


def _looks_local(name: str) -> bool:
    return name.startswith((".", "/", "~")) or name.count("/") > 1


def resolve_model(name: str, *, notify: Callable[[str], None] | None = _notify) -> ResolvedModel:
    """Resolve ``name``; converts a GGUF (or an alias's GGUF) on first use, which prints ``notify``."""
    if not name or not name.strip():
        raise ModelLoadError("empty model name; pass an alias, a .gguf file, a directory or a hub id")
    if name in ALIASES:
        alias = ALIASES[name]
        path = alias_gguf(alias, require_parts(alias))
        return ResolvedModel(str(convert_gguf(path, alias=name, notify=notify)), name, "alias")
    p = Path(name).expanduser()
    if name.lower().endswith(".gguf"):
        return ResolvedModel(str(convert_gguf(p, notify=notify)), str(p.resolve()), "gguf")
    if p.is_dir():
        if not any((p / f).exists() for f in _HF_FILES):
            raise ModelLoadError(f"{name!r} is a directory without config.json, adapter_config.json or "
                                 "tokenizer_config.json: not a saved Hugging Face model")
        return ResolvedModel(str(p), name, "dir")
    if p.exists():
        raise ModelLoadError(f"{name!r} is a file, not a model: pass a .gguf file or a saved Hugging Face directory")
    if _looks_local(name):
        raise ModelLoadError(f"model path {name!r} does not exist")
    if "/" not in name:
        get_alias(name)  # raises: an unknown alias
    return ResolvedModel(name, name, "hub")


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def list_models() -> list[dict[str, object]]:
    """Every alias (installed or not) and every other GGUF conversion in the cache, with paths and sizes.

    An alias's cache directory follows from its pinned SHA-256, so listing hashes nothing.
    """
    from trajtune.models.gguf import assembled_path, cache_root, cached_dir, is_complete, read_provenance
    from trajtune.models.registry import part_paths

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
