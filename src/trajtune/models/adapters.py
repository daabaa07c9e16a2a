"""Several LoRA adapters on one base model: finding the PeftModel, switching the active adapter,
and the roles a model plays with its adapters.

Why here, below rollouts and algorithms: DualTune (an adapter per tool's arguments) and multi-role
episodes (an adapter per role, ``algorithms/roles.py``) both switch adapters in the middle of
sampling and training; the rollout loop switches them per role without importing any algorithm.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trajtune.errors import DataError

DEFAULT = "default"  # peft's first adapter: what loading the final directory alone gives
ROLES_ATTR = "trajtune_roles"  # on the PeftModel: {role: adapter} of a multi-role model


def peft_model(model: Any) -> Any:
    """The PeftModel inside whatever wraps it (accelerate, DDP)."""
    m = model
    while not hasattr(m, "peft_config") and hasattr(m, "module"):
        m = m.module
    return m


def read_sidecar(path: str | Path, name: str, holds: str) -> Any:
    """The parsed ``name`` (JSON) that a saved multi-adapter model directory keeps beside its adapters
    (``roles.json``, ``dualtune.json``), or None when ``path`` has none; ``holds`` says what it maps,
    for the error a broken one gets."""
    p = Path(path) / name
    if not p.is_file():
        return None
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise DataError(f"{p}: not valid JSON ({e}); it maps {holds}") from None


def activate(model: Any, adapter: str) -> None:
    """Make ``adapter`` the one in the forward pass, keeping every adapter's weights trainable (peft's
    ``set_adapter`` freezes the others; the optimizer holds them all, and an adapter absent from the
    forward pass gets no gradient anyway)."""
    pm = peft_model(model)
    if pm.active_adapter == adapter:
        return
    lora = [p for n, p in pm.named_parameters() if "lora_" in n]
    trainable = any(p.requires_grad for p in lora)
    pm.set_adapter(adapter)
    for p in lora:
        p.requires_grad_(trainable)


def role_adapters(model: Any) -> dict[str, str]:
    """{role: adapter} of a model that plays several roles with one adapter each; {} for any other."""
    pm = peft_model(model)
    roles = pm.__dict__.get(ROLES_ATTR) if hasattr(pm, "peft_config") else None
    return dict(roles) if isinstance(roles, dict) else {}
