"""Supervised objectives: one cross-entropy with per-token weights (docs/algorithms.md).

Assistant-only SFT is the renderer's weights as they are (policy tokens, end-of-turn included;
``train_on`` picks all turns, the last one or the per-message hints). EAFT multiplies each
token's cross-entropy by a gradient-free entropy gate.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch
from pydantic import Field, model_validator

from trajtune.algorithms.base import Metrics
from trajtune.algorithms.batch import Batch, by_adapter, fit_length, kept_head_input
from trajtune.algorithms.critical_steps import make_selector, select_critical
from trajtune.algorithms.error_mask import mask_error_turns
from trajtune.algorithms.faft import faft_records
from trajtune.algorithms.lm_head import head_logprobs
from trajtune.algorithms.registry import Algorithm, Recipe, RunContext, register_algorithm
from trajtune.algorithms.roles import add_role_adapters, mark_data_roles, split_by_role, write_roles
from trajtune.chat.render import RenderError
from trajtune.config import DataSpec, RunBase
from trajtune.errors import ConfigError, DataError, require_input
from trajtune.experience import DatasetSource
from trajtune.formats import LoadStats, load_any
from trajtune.formats.text import iter_documents
from trajtune.progress import bar
from trajtune.tokens import SOURCE_PAD, SOURCE_PROMPT, TokenTrajectory
from trajtune.validate import record_check


def eaft_weights(logits: torch.Tensor, top_k: int = 20, alpha: float = 1.0) -> torch.Tensor:
    """w_t = (H_t / ln K)^alpha with H_t the entropy of the softmax over the top-K logits; no gradient."""
    with torch.no_grad():
        k = min(top_k, logits.shape[-1])
        top = torch.topk(logits, k, dim=-1).values
        p = torch.softmax(top, dim=-1)
        h = -(p * torch.log(p.clamp_min(1e-30))).sum(-1)
        return (h / math.log(k)).clamp(0.0, 1.0) ** alpha


@dataclass
class SFTObjective:
    """Token-mean weighted cross-entropy over trained policy tokens; optional EAFT gate."""

    eaft: bool = False
    eaft_top_k: int = 20
    eaft_alpha: float = 1.0
    name: str = "sft"
    #: continual pre-training (``data.train_on: all_tokens``): every token with weight > 0 is trained,
    #: whatever its source; otherwise only policy tokens are
    all_tokens: bool = False

    def _mask(self, batch: Batch) -> torch.Tensor:
        if self.all_tokens:
            return ((batch.source != SOURCE_PAD) & (batch.weight > 0)).float()[:, 1:]
        return batch.loss_mask()

    def denominator(self, batch: Batch) -> float:
        return float((self._mask(batch) * batch.weight[:, 1:]).sum())

    def _stats(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Per position, without gradient: [the target is the argmax, the EAFT gate (1 without EAFT)]."""
        correct = (logits.argmax(-1) == targets[:, 0]).to(logits.dtype)
        gate = eaft_weights(logits, self.eaft_top_k, self.eaft_alpha) if self.eaft else torch.ones_like(correct)
        return torch.stack([correct, gate], dim=-1)

    def loss_sum(self, model: Any, batch: Batch) -> tuple[torch.Tensor, Metrics]:
        if batch.adapters is not None:  # rows of several LoRA adapters (one per role): each with its own
            return by_adapter(model, batch, self._loss_sum)
        return self._loss_sum(model, batch)

    def _loss_sum(self, model: Any, batch: Batch) -> tuple[torch.Tensor, Metrics]:
        mask = self._mask(batch)
        # Only positions that predict a trained token need logits: with a real vocabulary (49 k for
        # SmolLM2) the LM head and the cross-entropy over all positions are a quarter of the step.
        keep = mask.any(0).nonzero().squeeze(-1)
        if keep.numel() == 0:
            keep = torch.zeros(1, dtype=torch.long)
        m = mask[:, keep]
        inp = kept_head_input(model, batch, keep, positions=int(m.sum()))
        targets = batch.input_ids[:, 1:][:, keep]
        w = m * batch.weight[:, 1:][:, keep]
        if inp.head is not None:  # hidden states: only the trained (row, position) pairs go through the head
            sel = m > 0
            inp, targets, w, m = replace(inp, x=inp.x[sel]), targets[sel], w[sel], m[sel]
        logp, st = head_logprobs(inp, targets.unsqueeze(-1), stats=self._stats)
        assert st is not None
        ce = -logp.squeeze(-1)
        if self.eaft:
            w = w * st[..., 1]
        loss = (ce * w).sum()
        n = float(m.sum())
        correct = float((st[..., 0] * m).sum())
        return loss, {"ce": (float((ce.detach() * m).sum()), n), "token_accuracy": (correct, n), "tokens": n}


# -- the `sft` algorithm: config, data preparation, recipe ------------------------------------------

class SFTRunConfig(RunBase):
    """``algorithm: sft``: supervised fine-tuning on trajectories from a file (any supported format)."""

    algorithm: Literal["sft"] = Field("sft", description="supervised fine-tuning on trajectories")
    data: DataSpec = Field(description="the training trajectories")
    role_adapters: bool = Field(False, description=(
        "team episodes (the roles environment's records): one LoRA adapter per role, each trained only on its "
        "role's turns; the first role to act uses the default adapter, the others start as copies of it (or "
        "as the adapters of a multi-role model directory); saved with roles.json, as rl.role_adapters does, "
        "so eval and RL play each role with its own. Needs model.lora or an adapter directory"))

    @model_validator(mode="after")
    def _combinations(self) -> "SFTRunConfig":
        t = self.train
        if self.role_adapters and self.data.format == "text":
            raise ValueError("role_adapters needs conversations with roles, not data.format: text")
        if t.step_in_backward and t.batch_size > t.micro_batch_size:
            raise ValueError(f"train.step_in_backward updates the weights in the backward pass, so an update must "
                             f"be one micro-batch: train.batch_size ({t.batch_size}) > train.micro_batch_size "
                             f"({t.micro_batch_size}); raise micro_batch_size to {t.batch_size}")
        return self


def render_training_data(trajs: list[Any], renderer: Any, path: str, max_length: int,
                         truncation: str, quiet: bool = True) -> tuple[list[TokenTrajectory], dict[str, Any]]:
    """IR trajectories → trained samples, refusing (never silently dropping) what cannot train.

    Returns the samples and counts for result.json: records with no trained token (by reason) and
    samples cut or dropped by the truncation policy."""
    tts: list[TokenTrajectory] = []
    dropped: Counter = Counter()
    with bar("render", len(trajs), enabled=not quiet) as adv:
        for t in trajs:
            try:
                samples = [s for s in renderer.render_samples(t) if any(w > 0 for w in s.weight)]
            except RenderError as e:
                raise RenderError(f"{path}: trajectory {t.id!r}: {e}") from None
            if not samples:
                dropped["no_assistant_turn" if all(m.role != "assistant" for m in t.messages)
                        else "no_trained_token"] += 1
            tts.extend(samples)
            adv()
    if not tts:
        raise DataError(f"{path}: none of the {len(trajs)} records has a trained token ({dict(dropped)}); "
                        "records need an assistant turn to learn (check data.train_on and the records' train flags)")
    n_rendered = len(tts)
    tts, n_cut = fit_length(tts, max_length, truncation)  # type: ignore[arg-type]
    if n_rendered and not tts:
        raise DataError(f"all {n_rendered} samples are longer than data.max_length ({max_length}) and "
                        "were dropped; raise data.max_length or set data.truncation: truncate")
    tts = [t for t in tts if any(w > 0 for w in t.weight)]
    if not tts:
        raise DataError("no trajectory has a trained token (check data.train_on and the records' train flags)")
    return tts, {"train_records": len(tts), "truncated_or_dropped": n_cut, "dropped_records": dict(dropped)}


def iter_data(path: str, fmt: str | None, skip_invalid: bool = False, stats: Any = None) -> Any:
    """Read training data in any supported format (auto-detected when ``fmt`` is None, gzip read
    directly), refusing what `trajtune data validate` rejects (or, with ``skip_invalid``, skipping
    it and counting it in ``stats``)."""
    yield from load_any(path, format=fmt, skip_invalid=skip_invalid, stats=stats, check=record_check(path))


def load_records(spec: DataSpec) -> tuple[list[Any], Any]:
    trajs = []
    load = LoadStats()
    for i, t in enumerate(iter_data(spec.path, spec.format, spec.skip_invalid, load)):
        if spec.limit and i >= spec.limit:
            break
        trajs.append(t)
    if not trajs:
        raise DataError(f"{spec.path}: no training records" +
                        (f" ({load.skipped} invalid record(s) skipped: {dict(load.by_rule)})" if load.skipped else ""))
    return trajs, load


def filter_records(trajs: list[Any], spec: DataSpec) -> tuple[list[Any], dict[str, Any]]:
    """``data.filters``: the records the quality filters keep (trajtune.filters), and the counts by
    rule (for result.json). Removing every record is an error that says which rules did it."""
    if spec.filters is None:
        return trajs, {}
    from trajtune.filters import apply_filters, make_filter_judge

    kept, report = apply_filters(trajs, spec.filters, make_filter_judge(spec.filters))
    if not kept:
        raise DataError(f"{spec.path}: data.filters removed all {len(trajs)} records "
                        f"({report.as_dict()['removed_by_rule']}); loosen data.filters or check the data with "
                        "`trajtune data filter`")
    return kept, report.as_dict()


def mask_errors(trajs: list[Any], spec: DataSpec) -> tuple[list[Any], dict[str, int]]:
    """``data.mask_errors``: error turns keep their context and lose their weight (error_mask.py);
    returns the rewritten records and the masked turns by reason (for result.json)."""
    if not spec.mask_errors:
        return trajs, {}

    total: Counter = Counter()
    out = []
    for t in trajs:
        t2, masked = mask_error_turns(t, spec.train_on)
        total.update(masked)
        out.append(t2)
    return out, dict(sorted(total.items()))


def critical_steps(trajs: list[Any], spec: DataSpec) -> tuple[list[Any], dict[str, Any]]:
    """``data.critical_steps``: only the selected turns keep their weight (critical_steps.py); returns
    the rewritten records and the selection counts (for result.json)."""
    if spec.critical_steps is None:
        return trajs, {}

    # after mask_errors the flags are explicit already: keep them
    return select_critical(trajs, spec.critical_steps, "hint" if spec.mask_errors else spec.train_on,
                           make_selector(spec.critical_steps))


def pack_documents(path: str, tokenizer: Any, max_length: int) -> tuple[list[TokenTrajectory], dict[str, Any]]:
    """``data.format: text``: documents tokenized, each closed by the eos token, concatenated and cut
    into blocks of ``max_length`` tokens (packing, as continual pre-training does: attention spans
    document boundaries within a block). Every token is trained; its source is ``prompt``."""
    eos = tokenizer.eos_token_id
    stream: list[int] = []
    n_docs = 0
    for _, text in iter_documents(path):
        stream += tokenizer.encode(text, add_special_tokens=False) + ([eos] if eos is not None else [])
        n_docs += 1
    if n_docs == 0:
        raise DataError(f"{path}: no non-empty document")
    blocks = [stream[i:i + max_length] for i in range(0, len(stream), max_length)]
    blocks = [b for b in blocks if len(b) >= 2]  # one token predicts nothing
    tts = [TokenTrajectory(ids=b, source=[SOURCE_PROMPT] * len(b), turn=[0] * len(b), weight=[1.0] * len(b),
                           traj_id=f"text-{k}") for k, b in enumerate(blocks)]
    return tts, {"train_records": len(tts), "documents": n_docs, "tokens": len(stream)}


def conversation_data(data: Any, ctx: RunContext) -> tuple[list[Any], list[TokenTrajectory], dict[str, Any]]:
    """The records of ``data`` (a DataSpec of conversations) through the quality filters and the
    per-turn weight transforms (FAFT, error masks, critical steps), rendered: (trajectories, token trajectories, the counts
    result.json reports). Every algorithm that trains on conversations shares it."""
    trajs, load = load_records(data)
    trajs, filtered = filter_records(trajs, data)
    faft: dict[str, Any] = {}
    if data.faft:
        trajs, faft = faft_records(trajs)
    trajs, masked = mask_errors(trajs, data)
    trajs, critical = critical_steps(trajs, data)
    tts, counts = render_training_data(trajs, ctx.renderer, data.path, data.max_length, data.truncation, ctx.quiet)
    return trajs, tts, {"train_records": counts["train_records"], "truncated_or_dropped": counts["truncated_or_dropped"],
                        "invalid_skipped": load.skipped, "invalid_by_rule": dict(load.by_rule),
                        "dropped_records": counts["dropped_records"],
                        **({"filters": filtered} if filtered else {}),
                        **({"error_turns_masked": masked} if data.mask_errors else {}),
                        **({"critical_steps": critical} if critical else {}),
                        **({"faft": faft} if faft else {})}


def _prepare(cfg: SFTRunConfig, ctx: RunContext) -> tuple[list[TokenTrajectory], dict[str, Any]]:
    require_input(cfg.data.path, "data.path")
    if cfg.data.format == "text":
        tts, counts = pack_documents(cfg.data.path, ctx.tokenizer, cfg.data.max_length)
        return tts, counts
    trajs, tts, counts = conversation_data(cfg.data, ctx)
    if cfg.role_adapters:
        counts["roles"] = mark_data_roles(trajs, tts)
    return tts, counts


def _build(cfg: SFTRunConfig, ctx: RunContext, prepared: tuple[list[TokenTrajectory], dict[str, Any]]) -> Recipe:
    tts, counts = prepared
    t = cfg.train
    names: dict[str, str] | None = None
    if cfg.role_adapters:  # the adapters exist before the optimizer sees the parameters
        try:
            names = add_role_adapters(ctx.model, counts["roles"], cfg.model.name_or_path)
        except ValueError as e:
            raise ConfigError(str(e).replace("rl.role_adapters", "role_adapters")) from None
        tts, m = split_by_role(tts, names)
        counts["role_rows"] = int(m["role_rows"])
    return Recipe(source=DatasetSource(tts, t.batch_size, cfg.seed),
                  objective=SFTObjective(t.eaft, t.eaft_top_k, t.eaft_alpha,
                                         all_tokens=cfg.data.train_on == "all_tokens"),
                  micro_batch_size=min(t.micro_batch_size, t.batch_size), result=counts,
                  shown=("loss", "token_accuracy"), plot=("loss.png", ("loss", "token_accuracy"), "SFT"),
                  on_final=(lambda final: write_roles(final, names)) if names else None)


register_algorithm(Algorithm("sft", SFTRunConfig, "supervised fine-tuning on trajectories (assistant tokens only)",
                             _prepare, _build))
