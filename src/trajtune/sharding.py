"""Sharded training with PyTorch's FSDP2 (``train.sharding: fsdp``): each of W ranks holds 1/W of
every parameter, gradient and optimizer state, so a model too large for one device trains on several.

Why FSDP2 (``torch.distributed.fsdp.fully_shard``) and not accelerate's FSDP or DeepSpeed plug-ins:
the learner's exactness rests on its own accumulation (each rank runs its share of the step's
units in micro-batches and divides by the step's global denominator, ``distributed.py``). A
``fully_shard`` model stays an ordinary module whose parameters are DTensors, so the same loop runs
on it; only where gradients meet changes (a reduce-scatter after each backward instead of one
all-reduce at the end).

The layout is the usual one: every decoder layer (the classes a Hugging Face model names in
``_no_split_modules``) is one unit, the root (embeddings, final norm, head) another. Parameters stay
in the dtype they are loaded in (float32 under fsdp: ``train.py`` loads ``model.dtype: auto`` so),
with no mixed-precision policy, and gradients are reduce-scattered as plain sums (divide factor 1,
``ReduceOp.SUM``: gloo has no ``PREMUL_SUM``), since the loss is already divided by the global
denominator.

A forward pass of a sharded model is a collective (each unit gathers its parameters from every
rank), so all ranks must run the same forward passes in the same order: the learner pads a rank's
micro-batches with zero-weighted ones, and rollouts, mining and evaluation run whole on every rank
(``distributed.sharded``).

Checkpoints gather the full state on rank 0 (``get_model_state_dict`` / ``get_optimizer_state_dict``
with ``full_state_dict`` and ``cpu_offload``) and are written in the unsharded format: a Hugging Face
directory (or PEFT adapter) and torch's optimizer state dict keyed by parameter index. So a run
resumes under either layout and any world size, and ``final/`` is a plain model directory.
"""

from __future__ import annotations

from typing import Any

import torch

from trajtune import distributed as dist
from trajtune.errors import ConfigError


def decoder_layers(model: Any) -> list[torch.nn.Module]:
    """The repeated blocks to shard one by one: modules whose class the model lists in
    ``_no_split_modules`` (what accelerate's transformer auto-wrap uses too)."""
    core = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(core, "_no_split_modules", None) or ())
    layers = [m for m in core.modules() if type(m).__name__ in names]
    if not layers:
        raise ConfigError(f"train.sharding: fsdp found no decoder layers to shard in {type(core).__name__} (it names "
                          "none in _no_split_modules); use train.sharding: none for this architecture")
    return layers


def shard(model: Any, device: torch.device | None = None) -> Any:
    """Shard ``model`` in place over all ranks (one FSDP unit per decoder layer, plus the root) and
    return it. Frozen parameters (a LoRA base, a reference model) are sharded too. ``device``: this
    rank's (default: the one the launcher's process group gave it)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    if device is None:
        from accelerate import PartialState

        device = PartialState().device
    mesh = init_device_mesh(device.type, (dist.world_size(),))
    # no model.to(device) first: fully_shard moves each unit's parameters to the device as it shards them,
    # so the device never holds more than the shards so far plus one full layer (the weights load on the CPU)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)  # sums: the loss is already divided by the global denominator
            m.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no PREMUL_SUM, which a factor uses)
    return model


def is_sharded(model: Any) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _options(**kw: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kw)


def gather_model_state(model: Any, trainable_only: bool = False) -> dict[str, torch.Tensor]:
    """The full (unsharded) state dict on rank 0's CPU, keyed as the unsharded model's; empty on the
    other ranks. A collective: every rank calls it. ``trainable_only``: leave out frozen parameters
    (a LoRA run's base, which its checkpoint does not hold)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state = get_model_state_dict(model, options=_options(cpu_offload=True, ignore_frozen_params=trainable_only))
    # tied parameters (embeddings and head) come back as two copies; make them one tensor again, so that
    # save_pretrained sees the tie (it finds ties by shared storage) and writes the weight once
    first: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first and name in state and first[id(p)] in state:
            state[name] = state[first[id(p)]]
        first.setdefault(id(p), name)
    return state


def _param_names(model: Any, optimizer: torch.optim.Optimizer) -> list[str]:
    """The optimizer's parameters' names, in the order torch's ``state_dict`` numbers them."""
    name = {id(p): n for n, p in model.named_parameters()}
    return [name[id(p)] for g in optimizer.param_groups for p in g["params"]]


def gather_optimizer_state(model: Any, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's full state on rank 0's CPU in torch's own format (``Optimizer.state_dict()``:
    states keyed by parameter index), the one an unsharded run saves; empty on the other ranks.
    A collective: every rank calls it."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    full = get_optimizer_state_dict(model, optimizer, options=_options(cpu_offload=True))
    if not dist.is_main():
        return {}
    index = {n: i for i, n in enumerate(_param_names(model, optimizer))}
    return {"state": {index[n]: s for n, s in full["state"].items()},
            "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in full["param_groups"]]}


def load_optimizer_state(model: Any, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load an optimizer state in torch's format (full tensors, as ``gather_optimizer_state`` or an
    unsharded run saved it) into the sharded optimizer; every rank passes the same state."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    names = _param_names(model, optimizer)
    full = {"state": {names[i]: s for i, s in state["state"].items()},
            "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]}
    set_optimizer_state_dict(model, optimizer, full, options=_options())


def load_model_state(model: Any, state: dict[str, torch.Tensor]) -> None:
    """Load full tensors (every rank passes the same ones) into the sharded model; keys it does not
    name keep their values (the caller checks the keys)."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    set_model_state_dict(model, dict(state), options=_options(strict=False))


def adapter_keys(model: Any, adapter: str = "default") -> dict[str, str]:
    """For a PEFT model: the key each trainable parameter of ``adapter`` has in a saved adapter file
    → the parameter's name. Read off PEFT's own saving (``get_peft_model_state_dict`` on the
    parameters' stand-ins, matched by identity), so it inverts exactly what ``save_pretrained`` wrote.
    The stand-ins are shape-only meta tensors: PEFT (0.22) gathers sharded parameters into new full
    tensors before renaming, which would lose their identity and cost a gather per parameter."""
    from peft import get_peft_model_state_dict

    params = {n: torch.empty(p.shape, dtype=p.dtype, device="meta")
              for n, p in model.named_parameters() if p.requires_grad}
    by_id = {id(p): n for n, p in params.items()}
    saved = get_peft_model_state_dict(model, state_dict=dict(params), adapter_name=adapter)
    out = {k: by_id[id(v)] for k, v in saved.items() if id(v) in by_id}
    if len(out) != len(saved):
        raise RuntimeError(f"cannot map PEFT adapter {adapter!r}'s saved keys to parameters (keys: {sorted(saved)[:3]} ...)")
    return out
