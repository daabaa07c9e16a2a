"""Loading models and tokenizers by hub id or local path, with optional LoRA (PEFT).

One code path for everything: the tiny local model and ``Qwen/Qwen2.5-0.5B-Instruct`` both go
through ``from_pretrained``. A directory holding a PEFT adapter loads its base model and the
adapter on top.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from trajtune import errors


class LoraConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list[str] | str = "all-linear"


class ModelLoadError(errors.ModelLoadError):
    pass


def _quiet_transformers() -> None:
    """trajtune draws its own progress bars; transformers' per-load bars would interleave with them."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def _looks_local(name: str) -> bool:
    return name.startswith((".", "/", "~")) or Path(name).expanduser().exists() or name.count("/") > 1


def _check_source(name_or_path: str) -> None:
    p = Path(name_or_path).expanduser()
    if _looks_local(name_or_path) and not p.exists():
        raise ModelLoadError(f"model path {name_or_path!r} does not exist")
    if p.is_dir() and not ((p / "config.json").exists() or (p / "adapter_config.json").exists()):
        raise ModelLoadError(f"{name_or_path!r} is a directory without config.json or adapter_config.json: "
                             "not a saved Hugging Face model")


def load_tokenizer(name_or_path: str, chat_template: str | None = None) -> Any:
    from transformers import AutoTokenizer

    _check_source(name_or_path)
    try:
        tok = AutoTokenizer.from_pretrained(name_or_path)
    except OSError as e:
        raise ModelLoadError(f"could not load a tokenizer from {name_or_path!r}: {e}") from None
    if chat_template is not None:
        tok.chat_template = Path(chat_template).read_text() if Path(chat_template).exists() else chat_template
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def load_model(name_or_path: str, *, lora: LoraConfig | None = None, dtype: str = "auto",
               trainable: bool = True) -> Any:
    """Load a causal LM; wrap it with a fresh LoRA adapter when ``lora`` is given."""
    import torch
    from transformers import AutoModelForCausalLM

    _check_source(name_or_path)
    _quiet_transformers()
    torch_dtype: Any = {"auto": "auto", "float32": torch.float32, "bfloat16": torch.bfloat16,
                        "float16": torch.float16}[dtype]
    adapter_cfg = Path(name_or_path).expanduser() / "adapter_config.json"
    try:
        if adapter_cfg.exists():
            from peft import PeftModel

            base = json.loads(adapter_cfg.read_text())["base_model_name_or_path"]
            model = AutoModelForCausalLM.from_pretrained(base, dtype=torch_dtype)
            model = PeftModel.from_pretrained(model, name_or_path, is_trainable=trainable and lora is None)
            if lora is not None:
                model = model.merge_and_unload()
        else:
            model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=torch_dtype)
    except OSError as e:
        raise ModelLoadError(f"could not load a model from {name_or_path!r}: {e}") from None
    if lora is not None:
        from peft import LoraConfig as PeftLoraConfig
        from peft import get_peft_model

        model = get_peft_model(model, PeftLoraConfig(
            r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
            target_modules=lora.target_modules, task_type="CAUSAL_LM"))
    return model
