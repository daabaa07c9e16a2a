"""Data-parallel training across processes (``accelerate launch -m trajtune.cli train ...``).

Every rank runs the same program on the same config: it builds the same step experience (sources
are functions of the step and the seed), keeps its share of the step's units (rank r takes units
r, r + W, ...), and the gradient sums and loss denominators are added across ranks before the
optimizer step, so one step equals the single-process step on the whole batch (up to float
rounding). Only rank 0 writes: the run directory, logs, checkpoints, the final model.

Ranks come from the launcher's environment (``RANK``, ``WORLD_SIZE``), so they are known before
any model is loaded; the process group is the one accelerate sets up (gloo on CPU, NCCL on GPUs).
"""

from __future__ import annotations

import os
from typing import Any


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def is_main() -> bool:
    return rank() == 0


def init() -> None:
    """Join the launcher's process group (a no-op in a single process)."""
    if world_size() > 1:
        from accelerate import PartialState

        PartialState()


def barrier() -> None:
    if world_size() > 1:
        import torch.distributed as dist

        dist.barrier()


def all_sum(values: list[float]) -> list[float]:
    """Element-wise sum over ranks (float64)."""
    if world_size() == 1:
        return values
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def all_gather(obj: Any) -> list[Any]:
    if world_size() == 1:
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def sum_gradients(params: list[Any]) -> None:
    """Add every parameter's gradient across ranks, in one flat buffer (a rank that had no rows this
    step contributes zeros)."""
    if world_size() == 1:
        return
    import torch
    import torch.distributed as dist

    grads = []
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grads.append(p.grad)
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    i = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[i:i + n].view_as(g))
        i += n


def check_in_sync(params: list[Any], step: int) -> None:
    """Every rank must hold the same weights (they apply the same summed gradients); a rank whose
    experience differed would drift silently, so compare a checksum and stop if it did."""
    if world_size() == 1:
        return
    import torch

    with torch.no_grad():
        local = float(sum(p.detach().double().abs().sum() for p in params))
    sums = all_gather(local)
    if max(sums) - min(sums) > 1e-9 * max(1.0, abs(sums[0])):
        raise RuntimeError(f"step {step}: the ranks' weights differ (checksums {sums}); their step experience "
                           "was not identical — a bug, please report it")
