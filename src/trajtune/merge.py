"""Model merging: combine models fine-tuned from one base into one model, without training.

Each fine-tuned model j is read as its task vector τ_j = θ_j − θ_0 (its difference from the base).
The methods differ only in how the τ_j are combined into one delta δ; the result is θ_0 + δ:

* ``ta`` (task arithmetic): δ = λ Σ_j τ_j.
* ``ties``: per task keep the ``density`` fraction of entries with the largest |τ_j| (per tensor),
  elect each entry's sign as the sign of the sum of the trimmed τ_j, and average the trimmed entries
  that agree with it (a disjoint mean: zeros and disagreeing entries do not dilute it); δ = λ · mean.
* ``dare``: drop each entry of each τ_j with probability ``drop`` and rescale the survivors by
  1 / (1 − drop), so each τ_j is unchanged in expectation; then ``ta`` or ``ties``.
* ``ram`` / ``ram_plus`` (for RL-trained agents, whose updates are sparse): an entry changed
  (|τ_j| > 1e-5) by two or more agents is averaged over those agents only; an entry changed by one
  agent is kept, scaled by λ_j = 1 + (r − 1) · min(1, shared_j / unique_j), where shared_j and
  unique_j count agent j's changed entries that are shared with another agent / its own (over the
  whole model); r = 1 for ``ram`` (kept as is) and 1.2 for ``ram_plus``. Averaging the sparse
  updates of RL agents as task arithmetic or TIES do would shrink each agent's unique update.

``weights`` multiply each τ_j before the method runs. The tensor functions below are pure (lists
of task vectors in, a delta out) and are what the tests check against known vectors;
``merge_models`` streams the models tensor by tensor from their safetensors files, so memory holds
the base model (the output) plus one tensor per input, never all the models.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from trajtune.errors import ConfigError, OutputError
from trajtune.models.errors import ModelLoadError
from trajtune.models.loading import _quiet_transformers, read_tokenizer
from trajtune.models.resolve import resolve_model
from trajtune.schema import normal_permissions

METHODS = ("ta", "ties", "dare", "ram", "ram_plus")
#: |τ| above this counts as "changed" (RAM's mask, and the stats in merge.json).
CHANGED_EPS = 1e-5
#: RAM+'s largest rescale of an agent's unique entries (r in λ_j = 1 + (r − 1)·min(1, shared/unique)).
RAM_PLUS_R = 1.2
DEFAULT_DENSITY = 0.2  # TIES paper: keeping the top 20% loses little
DEFAULT_DROP = 0.9  # DARE paper: most delta entries of a fine-tune can be dropped


# --------------------------------------------------------------------------------------------------
# Pure tensor functions: task vectors in, the merged delta out.


def task_arithmetic(taus: Sequence[torch.Tensor], lam: float = 1.0) -> torch.Tensor:
    """δ = λ Σ τ_j."""
    return lam * torch.stack(list(taus)).sum(0)


def trim_top(tau: torch.Tensor, density: float) -> torch.Tensor:
    """Keep the ceil(density · n) entries of largest |τ| (ties broken by position), zero the rest."""
    n = tau.numel()
    k = min(n, math.ceil(density * n))
    if k >= n:
        return tau.clone()
    flat = tau.reshape(-1)
    keep = torch.zeros(n, dtype=torch.bool, device=tau.device)
    keep[torch.topk(flat.abs(), k, sorted=False).indices] = True
    return torch.where(keep, flat, torch.zeros_like(flat)).reshape(tau.shape)


def ties(taus: Sequence[torch.Tensor], density: float, lam: float = 1.0) -> torch.Tensor:
    """TIES: trim each τ_j to its top ``density``, elect the sign of the summed trimmed τ, and take
    the mean of the entries that agree with it (entries with no agreeing task stay 0)."""
    trimmed = torch.stack([trim_top(t, density) for t in taus])
    elected = torch.sign(trimmed.sum(0))
    agree = (torch.sign(trimmed) == elected) & (trimmed != 0)
    count = agree.sum(0)
    total = torch.where(agree, trimmed, torch.zeros_like(trimmed)).sum(0)
    return lam * total / count.clamp(min=1)


def dare_drop(tau: torch.Tensor, drop: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """Drop each entry with probability ``drop`` and rescale the rest by 1 / (1 − drop): unbiased."""
    if drop == 0:
        return tau.clone()
    keep = torch.rand(tau.shape, generator=generator, dtype=torch.float32) >= drop
    return torch.where(keep, tau / (1 - drop), torch.zeros_like(tau))


def dare(taus: Sequence[torch.Tensor], drop: float, *, base: Literal["ta", "ties"] = "ta",
         density: float = 1.0, lam: float = 1.0,
         generators: Sequence[torch.Generator | None] | None = None) -> torch.Tensor:
    """DARE: ``dare_drop`` each τ_j (with ``generators[j]``), then task arithmetic or TIES."""
    gens = list(generators) if generators is not None else [None] * len(taus)
    dropped = [dare_drop(t, drop, g) for t, g in zip(taus, gens, strict=True)]
    return ties(dropped, density, lam) if base == "ties" else task_arithmetic(dropped, lam)


def changed_masks(taus: Sequence[torch.Tensor]) -> torch.Tensor:
    """m_j = |τ_j| > 1e-5, stacked: (n_tasks, *shape)."""
    return torch.stack([t.abs() > CHANGED_EPS for t in taus])


def ram_counts(taus: Sequence[torch.Tensor]) -> tuple[list[int], list[int]]:
    """Per agent j: (entries j changed that another agent also changed, entries only j changed)."""
    m = changed_masks(taus)
    c = m.sum(0)
    shared = [int((mj & (c >= 2)).sum()) for mj in m]
    unique = [int((mj & (c == 1)).sum()) for mj in m]
    return shared, unique


def ram_scales(shared: Sequence[int], unique: Sequence[int], r: float) -> list[float]:
    """λ_j = 1 + (r − 1) · min(1, shared_j / unique_j); an agent with no unique entry gets r (unused)."""
    return [1 + (r - 1) * (min(1.0, s / u) if u else 1.0) for s, u in zip(shared, unique, strict=True)]


def ram(taus: Sequence[torch.Tensor], scales: Sequence[float] | None = None, lam: float = 1.0) -> torch.Tensor:
    """RAM: entries changed by ≥ 2 agents are averaged over those agents; entries changed by one agent
    are kept, times that agent's scale (1 for RAM; ``ram_scales(..., RAM_PLUS_R)`` for RAM+)."""
    stacked = torch.stack(list(taus))
    m = changed_masks(taus)
    c = m.sum(0)
    changed = torch.where(m, stacked, torch.zeros_like(stacked))
    shared_mean = changed.sum(0) / c.clamp(min=1)
    s = torch.tensor(list(scales) if scales is not None else [1.0] * len(taus), dtype=stacked.dtype)
    unique = (changed * s.reshape(-1, *([1] * (stacked.dim() - 1)))).sum(0)
    return lam * torch.where(c >= 2, shared_mean, unique)


# --------------------------------------------------------------------------------------------------
# Options


class MergeOptions(BaseModel):
    """What `trajtune merge` takes besides the models; ``check`` refuses settings that would do nothing."""

    model_config = ConfigDict(extra="forbid")
    method: str = Field(description="ta, ties, dare, ram or ram_plus")
    weights: list[float] | None = Field(None, description="one factor per model multiplying its task vector "
                                                          "(default: all 1)")
    lam: float = Field(1.0, description="scale λ of the merged delta: θ_0 + λ·δ")
    density: float | None = Field(None, description="ties (and dare with dare_base ties): fraction of each task "
                                                    f"vector's entries kept, in (0, 1] (default {DEFAULT_DENSITY})")
    drop: float | None = Field(None, description=f"dare: drop probability p in [0, 1) (default {DEFAULT_DROP})")
    dare_base: str | None = Field(None, description="dare: combine the dropped task vectors with ta (default) "
                                                    "or ties")
    seed: int | None = Field(None, description="dare: seed of the drop masks (default 0); the same seed gives "
                                               "the same model")

    def check(self, n_models: int) -> None:
        """Raise ConfigError for an unknown method, an out-of-range value, or an option the method ignores."""
        if self.method not in METHODS:
            raise ConfigError(f"unknown merge method {self.method!r}; choose one of {', '.join(METHODS)}")
        if n_models < 1:
            raise ConfigError("merge needs at least one model besides the base (--models A [B ...])")
        if self.weights is not None and len(self.weights) != n_models:
            raise ConfigError(f"--weights has {len(self.weights)} value(s) but --models has {n_models}; "
                              "give one weight per model")
        if not all(math.isfinite(w) for w in self.weights or []):
            raise ConfigError(f"--weights must be finite numbers, got {self.weights}")
        if not math.isfinite(self.lam):
            raise ConfigError(f"--lambda must be a finite number, got {self.lam}")
        uses_density = self.method == "ties" or (self.method == "dare" and self.dare_base == "ties")
        if self.density is not None:
            if not uses_density:
                raise ConfigError("--density only applies to --method ties (or dare with --dare-base ties)")
            if not 0 < self.density <= 1:
                raise ConfigError(f"--density must be in (0, 1], got {self.density}")
        if self.method != "dare":
            for name, value in (("--drop", self.drop), ("--dare-base", self.dare_base), ("--seed", self.seed)):
                if value is not None:
                    raise ConfigError(f"{name} only applies to --method dare")
        else:
            if self.drop is not None and not 0 <= self.drop < 1:
                raise ConfigError(f"--drop must be in [0, 1), got {self.drop}")
            if self.dare_base not in (None, "ta", "ties"):
                raise ConfigError(f"--dare-base must be ta or ties, got {self.dare_base!r}")

    def resolved(self) -> dict[str, Any]:
        """The options as used, defaults filled in (what merge.json records)."""
        out: dict[str, Any] = {"method": self.method, "weights": self.weights, "lambda": self.lam}
        if self.method == "ties" or (self.method == "dare" and self.dare_base == "ties"):
            out["density"] = self.density if self.density is not None else DEFAULT_DENSITY
        if self.method == "dare":
            out.update(drop=self.drop if self.drop is not None else DEFAULT_DROP, dare_base=self.dare_base or "ta",
                       seed=self.seed if self.seed is not None else 0)
        if self.method == "ram_plus":
            out["r"] = RAM_PLUS_R
        return out


# --------------------------------------------------------------------------------------------------
# Reading models tensor by tensor


class _Tensors:
    """The tensors of one saved model, read one at a time from its safetensors files (or, for a
    model stored otherwise, from a loaded state dict)."""

    def __init__(self, path: str, stack: ExitStack, label: str):
        self.label = label
        self._state: dict[str, torch.Tensor] | None = None
        self._files: dict[str, Any] = {}
        self._where: dict[str, str] = {}
        p = Path(path)
        index = p / "model.safetensors.index.json"
        if index.exists():
            where = {k: str(p / f) for k, f in json.loads(index.read_text())["weight_map"].items()}
        elif (p / "model.safetensors").exists():
            single = str(p / "model.safetensors")
            self._open(single, stack)
            where = {k: single for k in self._files[single].keys()}  # noqa: SIM118 (a safetensors handle)
        else:  # pytorch_model.bin, a hub id, ...: the ordinary loader
            self._state = _load_model(path).state_dict()
            return
        for f in sorted(set(where.values())):
            self._open(f, stack)
        self._where = where

    def _open(self, f: str, stack: ExitStack) -> None:
        from safetensors import SafetensorError, safe_open

        if f not in self._files:
            try:
                self._files[f] = stack.enter_context(safe_open(f, framework="pt"))
            except SafetensorError as e:  # a cut-off copy or a failed download: the user's to replace
                raise ModelLoadError(f"{f}: the weights file is corrupt or truncated ({e}); copy or save the "
                                     "model again") from None

    def keys(self) -> list[str]:
        return list(self._state) if self._state is not None else list(self._where)

    def shape(self, key: str) -> tuple[int, ...]:
        if self._state is not None:
            return tuple(self._state[key].shape)
        return tuple(self._files[self._where[key]].get_slice(key).get_shape())

    def get(self, key: str) -> torch.Tensor:
        if self._state is not None:
            return self._state[key]
        return self._files[self._where[key]].get_tensor(key)


def _load_model(path: str, dtype: Any = "auto") -> Any:
    from transformers import AutoModelForCausalLM

    _quiet_transformers()
    try:
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"could not load a model from {path!r}: {e}") from None


def _is_adapter(path: str) -> bool:
    return (Path(path) / "adapter_config.json").exists()


def _sha256(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


@dataclass
class _Input:
    name: str  # as the user gave it
    path: str  # resolved directory (or hub id)
    adapter: bool
    tensors_path: str = ""  # where its full weights are read from (a temp dir for an adapter)
    config_sha256: str | None = None


def _materialize_adapter(adapter_dir: str, base_path: str, into: Path) -> str:
    """θ_j for a LoRA adapter: the base with the adapter merged in (PEFT ``merge_and_unload``), saved
    as safetensors under ``into`` so it streams like any other model."""
    from peft import PeftModel

    base = _load_model(base_path)
    try:
        merged = PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
    except (OSError, ValueError, RuntimeError) as e:
        raise ModelLoadError(f"could not apply the LoRA adapter {adapter_dir!r} to the base {base_path!r}: "
                             f"{e}") from None
    merged.save_pretrained(into)
    del merged, base
    return str(into)


def _tokenizer_dir(inp: _Input, base_path: str) -> str:
    p = Path(inp.path)
    has_tok = any((p / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"))
    return inp.path if has_tok or not inp.adapter else base_path


def _check_tokenizers(base_tok: Any, base_name: str, toks: Sequence[tuple[str, Any]]) -> None:
    """Merged weights only mean something if token i is the same token in every model."""
    base_vocab = base_tok.get_vocab()
    for name, tok in toks:
        if len(tok) != len(base_tok):
            raise ModelLoadError(f"tokenizer mismatch: {name} has {len(tok)} tokens, the base {base_name} has "
                                 f"{len(base_tok)}; models must share the base's tokenizer to be merged")
        vocab = tok.get_vocab()
        if vocab != base_vocab:
            diff = min(set(vocab.items()) ^ set(base_vocab.items()), key=lambda kv: kv[1])
            raise ModelLoadError(f"tokenizer mismatch: {name} and the base {base_name} map tokens to ids "
                                 f"differently (first difference: {diff[0]!r} -> id {diff[1]}); models must "
                                 "share the base's tokenizer to be merged")
        for prop in ("eos_token", "bos_token", "pad_token", "unk_token"):
            if getattr(tok, prop, None) != getattr(base_tok, prop, None):
                raise ModelLoadError(f"tokenizer mismatch: {prop} is {getattr(tok, prop, None)!r} in {name} but "
                                     f"{getattr(base_tok, prop, None)!r} in the base {base_name}")


def _check_configs(base_path: str, base_name: str, inputs: Sequence[_Input]) -> None:
    def arch(p: str) -> tuple[Any, Any]:
        f = Path(p) / "config.json"
        if not f.exists():
            return None, None
        cfg = json.loads(f.read_text())
        return cfg.get("model_type"), cfg.get("architectures")

    want = arch(base_path)
    for inp in inputs:
        got = arch(inp.tensors_path)
        if want[0] is not None and got[0] is not None and got != want:
            raise ModelLoadError(f"architecture mismatch: {inp.name} is {got[0]} {got[1]}, the base {base_name} "
                                 f"is {want[0]} {want[1]}; only models fine-tuned from the base can be merged")


def _check_tensors(base: _Tensors, others: Sequence[_Tensors]) -> list[str]:
    keys = base.keys()
    key_set = set(keys)
    for o in others:
        ok = set(o.keys())
        if ok != key_set:
            missing, extra = sorted(key_set - ok), sorted(ok - key_set)
            what = f"lacks tensor {missing[0]!r}" if missing else f"has tensor {extra[0]!r} the base lacks"
            n = len(missing) + len(extra)
            raise ModelLoadError(f"shape mismatch: {o.label} {what}" + (f" ({n} differing tensors)" if n > 1 else "")
                                 + "; only models with the base's architecture can be merged")
        for k in keys:
            if o.shape(k) != base.shape(k):
                raise ModelLoadError(f"shape mismatch: tensor {k!r} is {list(o.shape(k))} in {o.label} but "
                                     f"{list(base.shape(k))} in the base; only models with the base's "
                                     "architecture can be merged")
    return keys


def _tensor_seed(seed: int, key: str, j: int) -> int:
    """A seed per (tensor, model), so DARE's masks do not depend on the order tensors are read in."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{j}:{key}".encode()).digest()[:8], "little") & (2**63 - 1)


def merge_delta(opts: MergeOptions, key: str, taus: Sequence[torch.Tensor],
                ram_lambda: Sequence[float] | None = None) -> torch.Tensor:
    """The merged delta of one tensor under ``opts`` (weights already applied to ``taus``)."""
    r = opts.resolved()
    if opts.method == "ta":
        return task_arithmetic(taus, opts.lam)
    if opts.method == "ties":
        return ties(taus, r["density"], opts.lam)
    if opts.method == "dare":
        gens = [torch.Generator().manual_seed(_tensor_seed(r["seed"], key, j)) for j in range(len(taus))]
        return dare(taus, r["drop"], base=r["dare_base"], density=r.get("density", 1.0), lam=opts.lam,
                    generators=gens)
    return ram(taus, ram_lambda, opts.lam)


@dataclass
class MergeResult:
    out: Path
    summary: dict[str, Any] = field(default_factory=dict)


def merge_models(base: str, models: Sequence[str], opts: MergeOptions, out: str | Path, *,
                 overwrite: bool = False, notify: Callable[[str], None] | None = None) -> MergeResult:
    """Merge ``models`` (full models or LoRA adapter directories, fine-tuned from ``base``) into one
    Hugging Face directory ``out`` (model, tokenizer, config and merge.json), written atomically."""
    say = notify or (lambda _m: None)
    opts.check(len(models))
    out = Path(out)
    if out.exists() and not overwrite:
        raise OutputError(f"{out} exists; choose another --out or pass --overwrite to replace it")
    base_src, inputs = _resolve_inputs(base, models)
    base_tok = read_tokenizer(base_src.path)
    _check_tokenizers(base_tok, base, [(i.name, read_tokenizer(_tokenizer_dir(i, base_src.path))) for i in inputs])

    weights = opts.weights or [1.0] * len(models)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".tmp-{out.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        with tempfile.TemporaryDirectory(prefix=".merge-adapters-", dir=out.parent) as work, ExitStack() as stack:
            _materialize_inputs(inputs, base_src.path, Path(work), say)
            _check_configs(base_src.path, base, inputs)
            base_t = _Tensors(base_src.path, stack, f"the base {base}")
            srcs = [_Tensors(i.tensors_path, stack, i.name) for i in inputs]
            keys = _check_tensors(base_t, srcs)
            taus = functools.partial(_task_vectors, base_t, srcs, weights)
            ram_lambda = _ram_lambda(opts, keys, taus, len(inputs))

            say(f"merging {len(inputs)} model(s) into {base} with {opts.method}")
            model = _load_model(base_src.path)
            stats = _merge_tensors(model.state_dict(), keys, taus, opts, ram_lambda, len(inputs))
            model.save_pretrained(tmp)
            del model
        base_tok.save_pretrained(tmp)
        summary = _merge_summary(opts, base, base_src.path, inputs, stats, ram_lambda)
        (tmp / "merge.json").write_text(json.dumps(summary, indent=2) + "\n")
        normal_permissions(tmp)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return MergeResult(out=out, summary=summary)


def _resolve_inputs(base: str, models: Sequence[str]) -> tuple[Any, list[_Input]]:
    """Where the base and each input are; the base must be a full model, since adapters merge onto it."""
    base_src = resolve_model(base)
    if base_src.kind == "dir" and _is_adapter(base_src.path):
        raise ModelLoadError(f"--base {base!r} is a LoRA adapter; give the full model it was trained from")
    inputs = []
    for m in models:
        src = resolve_model(m)
        inputs.append(_Input(name=m, path=src.path, adapter=src.kind == "dir" and _is_adapter(src.path)))
    return base_src, inputs


def _materialize_inputs(inputs: list[_Input], base_path: str, work: Path, say: Callable[[str], None]) -> None:
    """Give every input full tensors to subtract the base from: an adapter is merged onto the base in
    ``work`` first. The hash of each input's config goes into merge.json."""
    for j, inp in enumerate(inputs):
        if inp.adapter:
            say(f"merging the LoRA adapter {inp.name} onto the base")
            inp.tensors_path = _materialize_adapter(inp.path, base_path, work / f"model-{j}")
            inp.config_sha256 = _sha256(Path(inp.path) / "adapter_config.json")
        else:
            inp.tensors_path = inp.path
            inp.config_sha256 = _sha256(Path(inp.path) / "config.json")


def _task_vectors(base_t: _Tensors, srcs: list[_Tensors], weights: Sequence[float],
                  key: str) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The base tensor ``key`` and each input's weighted task vector (input - base), in float32.
    Called per tensor, so only one tensor of each input is in memory at a time."""
    b = base_t.get(key).to(torch.float32)
    return b, [w * (s.get(key).to(torch.float32) - b) for s, w in zip(srcs, weights, strict=True)]


def _ram_lambda(opts: MergeOptions, keys: list[str], taus: Callable[[str], tuple[torch.Tensor, list[torch.Tensor]]],
                n_inputs: int) -> list[float] | None:
    """RAM's per-input scales λ_j count entries over the whole model, so they need a first pass
    before any tensor is merged; None for the other methods."""
    if opts.method not in ("ram", "ram_plus"):
        return None
    shared, unique = [0] * n_inputs, [0] * n_inputs
    for key in keys:
        s, u = ram_counts(taus(key)[1])
        shared = [a + b for a, b in zip(shared, s, strict=True)]
        unique = [a + b for a, b in zip(unique, u, strict=True)]
    return ram_scales(shared, unique, RAM_PLUS_R if opts.method == "ram_plus" else 1.0)


@dataclass
class _MergeStats:
    """How much of the model the merge changed, overall, per input and per tensor (for merge.json)."""

    per_tensor: dict[str, dict[str, Any]]
    n_total: int
    n_changed: int
    input_changed: list[int]


def _merge_tensors(state: dict[str, torch.Tensor], keys: list[str],
                   taus: Callable[[str], tuple[torch.Tensor, list[torch.Tensor]]], opts: MergeOptions,
                   ram_lambda: list[float] | None, n_inputs: int) -> _MergeStats:
    """Write base + merged delta into the loaded model's parameters in place, tensor by tensor."""
    stats = _MergeStats(per_tensor={}, n_total=0, n_changed=0, input_changed=[0] * n_inputs)
    with torch.no_grad():
        for key in keys:
            if key not in state:
                raise ModelLoadError(f"tensor {key!r} of the base's files is not a parameter of the loaded "
                                     "model; this model's layout cannot be merged")
            b, ts = taus(key)
            delta = merge_delta(opts, key, ts, ram_lambda)
            state[key].copy_((b + delta).to(state[key].dtype))
            n = delta.numel()
            changed = int((delta.abs() > CHANGED_EPS).sum())
            per_input = [int((t.abs() > CHANGED_EPS).sum()) for t in ts]
            stats.n_total += n
            stats.n_changed += changed
            stats.input_changed = [a + c for a, c in zip(stats.input_changed, per_input, strict=True)]
            stats.per_tensor[key] = {"shape": list(delta.shape), "changed": round(changed / max(n, 1), 6),
                                     "inputs_changed": [round(c / max(n, 1), 6) for c in per_input],
                                     "max_abs_delta": float(delta.abs().max()) if n else 0.0}
    return stats


def _merge_summary(opts: MergeOptions, base: str, base_path: str, inputs: list[_Input], stats: _MergeStats,
                   ram_lambda: list[float] | None) -> dict[str, Any]:
    """merge.json: what was merged, how, from which exact configs, and how much it changed."""
    n_total = stats.n_total
    return {
        "method": opts.method,
        "options": opts.resolved(),
        "base": {"name": base, "path": base_path, "config_sha256": _sha256(Path(base_path) / "config.json")},
        "inputs": [{"name": i.name, "path": i.path, "kind": "lora_adapter" if i.adapter else "model",
                    "config_sha256": i.config_sha256} for i in inputs],
        "stats": {"parameters": n_total, "changed": round(stats.n_changed / max(n_total, 1), 6),
                  "inputs_changed": [round(c / max(n_total, 1), 6) for c in stats.input_changed],
                  **({"ram_lambda": ram_lambda} if ram_lambda is not None else {})},
        "tensors": stats.per_tensor,
    }


def iter_summary_lines(summary: dict[str, Any]) -> Iterator[str]:
    """A few lines for the CLI to print."""
    st = summary["stats"]
    yield f"method: {summary['method']}  options: {json.dumps(summary['options'])}"
    for inp, frac in zip(summary["inputs"], st["inputs_changed"], strict=True):
        yield f"  {inp['name']} ({inp['kind']}): {frac:.2%} of {st['parameters']} entries changed"
    yield f"  merged: {st['changed']:.2%} of entries differ from the base"
    if "ram_lambda" in st:
        yield f"  ram lambda_j: {', '.join(f'{x:.3f}' for x in st['ram_lambda'])}"
