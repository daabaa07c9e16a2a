"""``trajtune export``: a LoRA adapter merged into a plain Hugging Face model directory.

The adapter's base (``base_model_name_or_path`` in its ``adapter_config.json``, resolved like any
``--model``: an alias, a GGUF conversion, a directory or a hub id) is loaded, the adapter applied
with PEFT and folded into the weights (``merge_and_unload``: W ← W + (α/r)·B·A), and the result
saved with ``save_pretrained`` next to the tokenizer (the adapter's own if it has one, else the
base's) and ``export.json``. The output loads with ``AutoModelForCausalLM.from_pretrained``
without PEFT, e.g. for vLLM, llama.cpp's converter or the hub.

The output directory is written into a temporary directory beside it and renamed when complete,
so a failed export leaves nothing behind; an existing output is refused unless ``overwrite``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trajtune import __version__
from trajtune.errors import OutputError, UsageError
from trajtune.models.errors import ModelLoadError
from trajtune.models.loading import _quiet_transformers, adapter_base, read_tokenizer
from trajtune.models.resolve import resolve_model
from trajtune.schema import normal_permissions

DTYPES = ("float32", "bfloat16", "float16")
EXPORT_FILE = "export.json"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


@dataclass
class ExportResult:
    out: Path
    summary: dict[str, Any] = field(default_factory=dict)


def _adapter_base(adapter_dir: Path, name: str) -> str:
    """The adapter's base model as recorded in its adapter_config.json; refuses anything but one LoRA adapter."""
    if (adapter_dir / "dualtune.json").is_file():
        raise ModelLoadError(f"{name!r} is a DualTune model (dualtune.json): it switches between adapters per token, "
                         "so it has no single merged model; export supports one LoRA adapter")
    cfg_file = adapter_dir / "adapter_config.json"
    if not cfg_file.is_file():
        raise ModelLoadError(f"{name!r} is not a LoRA adapter directory (no adapter_config.json); export merges an "
                             "adapter into its base, and a full model needs no export")
    try:
        cfg = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{cfg_file}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"{cfg_file}: expected a JSON object")
    peft_type = cfg.get("peft_type")
    if peft_type not in (None, "LORA"):
        raise ModelLoadError(f"{cfg_file}: peft_type is {peft_type!r}; export supports LoRA adapters only")
    base = cfg.get("base_model_name_or_path")
    if not base:
        raise ModelLoadError(f"{cfg_file}: base_model_name_or_path is empty, so the adapter's base model is unknown; "
                             "set it to the base model's alias, path or hub id")
    return str(base)


def _tokenizer_source(adapter_dir: Path, base_path: str) -> str:
    return str(adapter_dir) if any((adapter_dir / f).exists() for f in _TOKENIZER_FILES) else base_path


def export_adapter(model: str, out: str | Path, *, dtype: str | None = None, overwrite: bool = False,
                   notify: Callable[[str], None] | None = None) -> ExportResult:
    """Merge the LoRA adapter ``model`` (a directory, or a finished run directory) into its base and
    write the merged model to ``out``. ``dtype`` (float32, bfloat16, float16) is the dtype saved;
    None keeps the base's. Returns the output path and the ``export.json`` summary."""
    import torch

    say = notify or (lambda _m: None)
    if dtype is not None and dtype not in DTYPES:
        raise UsageError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    out = Path(out)
    if out.exists() and not overwrite:
        raise OutputError(f"{out} exists; choose another --out or pass --overwrite to replace it")
    src = resolve_model(model)
    if src.kind != "dir":
        raise ModelLoadError(f"{model!r} is not a LoRA adapter directory (it resolves to a {src.kind} model); export "
                             "merges an adapter directory into its base")
    adapter_dir = Path(src.path)
    base_name = _adapter_base(adapter_dir, model)
    base = adapter_base(base_name, adapter_dir / "adapter_config.json")
    for what, p in (("the adapter directory", adapter_dir), ("the adapter's base", Path(base.path))):
        if out.exists() and out.resolve() == p.resolve():
            raise OutputError(f"--out {out} is {what} itself; choose another --out")
    if base.kind == "dir" and (Path(base.path) / "adapter_config.json").exists():
        raise ModelLoadError(f"the adapter's base {base_name!r} is itself an adapter; export it first, then point "
                             "base_model_name_or_path at the exported model")

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    _quiet_transformers()
    torch_dtype: Any = "auto" if dtype is None else getattr(torch, dtype)
    say(f"loading the base {base_name} and the adapter {model}")
    try:
        base_model = AutoModelForCausalLM.from_pretrained(base.path, dtype=torch_dtype)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"could not load the adapter's base {base_name!r}: {e}") from None
    try:
        merged = PeftModel.from_pretrained(base_model, str(adapter_dir)).merge_and_unload()
    except (OSError, ValueError, RuntimeError, KeyError) as e:
        raise ModelLoadError(f"could not apply the LoRA adapter {model!r} to its base {base_name!r}: {e}") from None
    tok_src = _tokenizer_source(adapter_dir, base.path)
    tok = read_tokenizer(tok_src)
    saved_dtype = str(next(merged.parameters()).dtype).removeprefix("torch.")
    summary = {
        "source_adapter": str(adapter_dir),
        "adapter_name": model,
        "base": {"name": base_name, "path": base.path},
        "tokenizer_from": "adapter" if tok_src == str(adapter_dir) else "base",
        "dtype": saved_dtype,
        "trajtune_version": __version__,
    }

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".tmp-{out.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        say(f"writing the merged model to {out}")
        merged.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / EXPORT_FILE).write_text(json.dumps(summary, indent=2) + "\n")
        normal_permissions(tmp)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) and not isinstance(e, OutputError):
            raise OutputError(f"cannot write {out}: {e.strerror or e}") from None
        raise
    return ExportResult(out=out, summary=summary)
