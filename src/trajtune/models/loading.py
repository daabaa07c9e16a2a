"""Loading models and tokenizers by alias, GGUF file, hub id or local path, with optional LoRA (PEFT).

One code path for everything: the tiny local model, ``smollm2-135m`` and
``Qwen/Qwen2.5-0.5B-Instruct`` all go through ``resolve_model`` and then ``from_pretrained``. A
directory holding a PEFT adapter loads its base model (itself resolved, so an alias or a GGUF works)
and the adapter on top.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from trajtune.errors import UsageError
from trajtune.models.errors import ModelLoadError
from trajtune.models.resolve import check_hub, resolve_model

__all__ = ["LoraConfig", "ModelLoadError", "load_model", "load_tokenizer", "resolve_model"]


class LoraConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    r: int = Field(8, gt=0, description="LoRA rank: the width of the low-rank update")
    alpha: int = Field(16, gt=0, description="LoRA scaling numerator: the update is scaled by alpha / r")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the LoRA input during training")
    target_modules: list[str] | str = Field(
        "all-linear", description="module names to adapt (e.g. [q_proj, v_proj]), or all-linear: every linear "
                                  "layer except the output head")


def _quiet_transformers() -> None:
    """trajtune draws its own progress bars; transformers' per-load bars would interleave with them.
    PEFT (<= 0.24) reads a transformers attribute deprecated in 5.x on every LoRA wrap; that warning
    is about PEFT's code, not the user's, so it is not shown."""
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)


def read_tokenizer(path: str, *, label: str | None = None,
                   user_errors: tuple[type[Exception], ...] = (OSError, ValueError)) -> Any:
    """The tokenizer saved at ``path`` (a directory or hub id), exactly as saved: no padding or
    template changes, so merge and export can save it again unchanged. Every tokenizer trajtune
    loads comes through here, except a GGUF file's, which its one-time conversion reads
    (``models.gguf`` sits below this module). ``user_errors`` are the failures that mean the user's tokenizer cannot
    be read: a ``ModelLoadError`` naming ``label`` (default ``path``); a caller that words its own
    error passes ``()``."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except user_errors as e:
        raise ModelLoadError(f"could not load a tokenizer from {label or path!r}: {e}") from None


def load_tokenizer(name_or_path: str, chat_template: str | None = None) -> Any:
    """The tokenizer for rendering and batching: ``read_tokenizer`` of the resolved model, with the
    chat template given (a file or the template text), a pad token, and left padding (generation
    continues every row from its right end)."""
    src = resolve_model(name_or_path)
    if src.kind == "hub":
        check_hub(src.path)
    tok = read_tokenizer(src.path, label=name_or_path, user_errors=(OSError,))
    if chat_template is not None:
        tok.chat_template = Path(chat_template).read_text() if Path(chat_template).exists() else chat_template
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def to_device(model: Any, device: str = "auto") -> Any:
    """``model`` moved to ``device`` (``auto``: CUDA when this machine has it, else the CPU). A device
    the machine lacks is the user's to fix, so it is a one-line error naming --device, not a traceback."""
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        return model.to(device)
    except (RuntimeError, AssertionError, ValueError) as e:  # no such device / no CUDA build
        raise UsageError(f"cannot run the model on --device {device!r}: {e}") from None


def adapter_base(base_name: str, adapter_cfg: Path) -> Any:
    """The base model an adapter names (``resolve_model``'s answer). A run records its base as it was
    given, often a path relative to the directory the run started in; loaded from elsewhere, that path
    is looked for under each directory above the adapter's (the run's tree moved, or read from another
    working directory)."""
    def above() -> Any:
        if not Path(base_name).is_absolute():
            for d in adapter_cfg.resolve().parents:
                if (d / base_name).is_dir():
                    return resolve_model(str(d / base_name))
        return None

    try:
        src = resolve_model(base_name)
    except ModelLoadError as e:
        found = above()
        if found is None:
            raise ModelLoadError(f"{e}; it is the base model that {adapter_cfg} names (base_model_name_or_path), "
                                 "looked for from here and from each directory above the adapter") from None
        return found
    # a relative path of two parts reads like a hub id: a directory above the adapter wins over the hub
    return (above() or src) if src.kind == "hub" else src


def load_model(name_or_path: str, *, lora: LoraConfig | None = None, dtype: str = "auto",
               trainable: bool = True, gradient_checkpointing: bool = False) -> Any:
    """Load a causal LM; wrap it with a fresh LoRA adapter when ``lora`` is given. A directory an
    algorithm saved with more than one adapter (DualTune) is completed by that algorithm's load hook:
    load it for inference with ``algorithms.registry.load_trained``.

    ``gradient_checkpointing`` recomputes each layer's activations in the backward pass instead of
    keeping them: less memory for about a third more compute. It acts in training mode only, so
    rollouts (run in eval mode) keep their KV cache."""
    import torch
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    src = resolve_model(name_or_path)
    if src.kind == "hub":
        check_hub(src.path)
    _quiet_transformers()
    torch_dtype: Any = {"auto": "auto", "float32": torch.float32, "bfloat16": torch.bfloat16,
                        "float16": torch.float16}[dtype]
    adapter_cfg = Path(src.path) / "adapter_config.json"
    try:
        if src.kind == "dir" and adapter_cfg.exists():
            from peft import PeftModel

            base_name = json.loads(adapter_cfg.read_text()).get("base_model_name_or_path")
            if not base_name:
                raise ModelLoadError(f"{adapter_cfg}: base_model_name_or_path is empty, so the adapter's base "
                                     "model is unknown; set it to the base model's alias, path or hub id")
            model = AutoModelForCausalLM.from_pretrained(adapter_base(base_name, adapter_cfg).path, dtype=torch_dtype)
            model = PeftModel.from_pretrained(model, src.path, is_trainable=trainable and lora is None)
            if lora is not None:
                model = model.merge_and_unload()
        else:
            model = AutoModelForCausalLM.from_pretrained(src.path, dtype=torch_dtype)
    except OSError as e:
        raise ModelLoadError(f"could not load a model from {name_or_path!r}: {e}") from None
    except SafetensorError as e:  # a truncated copy, a failed download, a file that only has the name
        raise ModelLoadError(f"could not load a model from {name_or_path!r}: a .safetensors weights file in "
                             f"{src.path} is corrupt or truncated ({e}); copy or save the model again") from None
    if lora is not None:
        from peft import LoraConfig as PeftLoraConfig
        from peft import get_peft_model

        model = get_peft_model(model, PeftLoraConfig(
            r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
            target_modules=lora.target_modules, task_type="CAUSAL_LM"))
    if gradient_checkpointing:
        if not getattr(model, "supports_gradient_checkpointing", True):
            raise ModelLoadError(f"{name_or_path!r}: this architecture does not support gradient checkpointing "
                                 "(train.gradient_checkpointing)")
        enable = getattr(model, "activation_checkpointing_enable", None)  # the name since transformers 5.x
        if enable is not None:
            # non-reentrant: gradients reach LoRA layers even though the frozen embeddings' output needs none
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model
