"""The frozen reference policy of a LoRA run (KL penalty, DPO), without a second copy of the model.

Why: a reference loaded as its own model doubles the weights in memory, which on a small machine
is the difference between a run that fits and one that does not. With LoRA the reference is the
policy at step 0, and that is already inside the trained model:

- a **fresh adapter** (``model.lora``) starts with B = 0, so the reference is the model with its
  adapter switched off (PEFT's ``disable_adapter``);
- a **continued adapter** (``model`` names an adapter directory, e.g. the SFT run's ``final``)
  starts at the adapter's saved weights, so those few megabytes are kept aside and swapped in for
  the reference's forward passes (no gradient), then swapped back.

Either way the reference's log-probs equal those of a separately loaded copy of the step-0 model.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


def _peft(model: Any) -> Any:
    return getattr(model, "module", model)  # a DDP wrapper holds the PeftModel as .module


class AdapterReference:
    """Callable like the model (``ref(input_ids=..., ...)``), computing the step-0 policy."""

    def __init__(self, model: Any, *, fresh: bool):
        self.model = model
        self.fresh = fresh
        # the continued adapter's starting weights (only trainable LoRA tensors: a few MB)
        self.snapshot: dict[str, torch.Tensor] = {} if fresh else {
            n: p.detach().clone() for n, p in _peft(model).named_parameters() if p.requires_grad}

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return _peft(self.model).parameters()

    @contextmanager
    def _step0(self) -> Iterator[None]:
        pm = _peft(self.model)
        if self.fresh:
            with pm.disable_adapter():
                yield
            return
        params = dict(pm.named_parameters())
        current = {n: params[n].detach().clone() for n in self.snapshot}
        try:
            for n, v in self.snapshot.items():
                params[n].data.copy_(v)
            yield
        finally:
            for n, v in current.items():
                params[n].data.copy_(v)

    @torch.no_grad()
    def __call__(self, **kwargs: Any) -> Any:
        pm = _peft(self.model)
        training = pm.training
        pm.eval()  # no LoRA dropout in the reference
        try:
            with self._step0():
                return pm(**kwargs)
        finally:
            pm.train(training)
