"""The optimizer step taken inside the backward pass (``train.step_in_backward``).

In full fine-tuning with AdamW, peak memory is reached at the end of the backward pass: weights,
two moment buffers and a complete set of gradients all exist at once. A weight's gradient is
complete as soon as autograd has accumulated it (the engine sums every use of a weight, tied
embeddings and prefix-shared passes included, before it runs that weight's accumulation once per
backward), so the weight can be updated right then and its gradient freed. The gradients then never
all exist together: one copy of the trainable weights less at the peak (LOMO, Lv et al. 2023, and
PyTorch's "optimizer step in backward" recipe).

It is exact, not an approximation: each weight gets the update ``optimizer.step()`` would have
given it, through that same optimizer (its state, its checkpoint format, the LR schedule), because
the step runs on a parameter group narrowed to the one weight. What it cannot do follows from the
timing: clip by the global norm (unknown until the last gradient), accumulate over several backward
passes (the first would already update), or sum gradients across processes first. The config and
the learner refuse those combinations rather than change the update silently. The global norm is
still measured, from each gradient before its step, and logged as ``grad_norm``.

On CPU the freed gradients and the recomputed activations leave free but resident pages in the C
heap, which grew by 0.45 GB over one SmolLM2-135M backward pass; ``release`` (``heap.trim``) is
called before the backward pass and after every ``release_every`` bytes of freed gradients to
hand them back (docs/speed.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch


def clipping_refused(max_grad_norm: float) -> str:
    """Why a clipping norm and the step in backward cannot go together (the config and the learner
    both refuse the pair, the learner for configs built in code)."""
    return ("train.step_in_backward updates each weight before the gradient's global norm is known, so "
            f"train.max_grad_norm ({max_grad_norm}) cannot clip; set max_grad_norm: null, or turn step_in_backward off")


class StepInBackward:
    """Hooks on every trainable parameter that, while ``active()``, step the optimizer for that
    parameter alone as soon as its gradient is accumulated, then free the gradient. Outside
    ``active()`` the hooks do nothing, so any other backward pass behaves as usual."""

    def __init__(self, optimizer: Any, params: list[torch.nn.Parameter],
                 release: Callable[[], Any] | None = None, release_every: int = 128 << 20) -> None:
        self.optimizer = optimizer
        self.release, self.release_every, self._freed = release, release_every, 0
        groups = {id(p): g for g in optimizer.param_groups for p in g["params"]}
        missing = [i for i, p in enumerate(params) if id(p) not in groups]
        if missing:
            raise ValueError(f"step_in_backward: parameters {missing[:5]} are not in the optimizer")
        self._group = groups
        self._active = False
        self._norms: list[torch.Tensor] = []
        self.stepped = 0
        self._handles = [p.register_post_accumulate_grad_hook(self._hook) for p in params]

    @contextmanager
    def active(self) -> Iterator[None]:
        """The hooks step while inside; entering first hands back what the forward pass freed."""
        if self.release is not None:
            self.release()
        self._active, self._norms, self.stepped = True, [], 0
        try:
            yield
        finally:
            self._active = False

    def grad_norm(self) -> float:
        """The global 2-norm of the gradients stepped during the last ``active()`` (the norm clipping
        would have measured: per-tensor norms, then the norm of those)."""
        if not self._norms:
            return 0.0
        return float(torch.linalg.vector_norm(torch.stack(self._norms)))

    def remove(self) -> None:
        for h in self._handles:
            h.remove()

    def _hook(self, p: torch.Tensor) -> None:
        if not self._active or p.grad is None:
            return
        self._norms.append(torch.linalg.vector_norm(p.grad.detach()))
        group = self._group[id(p)]
        params = group["params"]
        group["params"] = [p]  # this step sees one weight; the others keep their (absent) gradients
        try:
            self.optimizer.step()
        finally:
            group["params"] = params
        self._freed += p.grad.numel() * p.grad.element_size()
        p.grad = None
        self.stepped += 1
        if self.release is not None and self._freed >= self.release_every:
            self.release()
            self._freed = 0
