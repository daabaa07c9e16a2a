"""DualTune: decoupled tool calling, one LoRA adapter for *which* tool, others for *how* to call it.

Why: a small model asked to pick a tool among many and fill in its arguments in one breath does
both worse than two specialists. DualTune splits every tool-call target into two token masks:

- the **selector** adapter (peft's ``default`` adapter) learns the tokens that choose the tool:
  by default every policy token that is not an argument token (the call's opening syntax, the
  name, any text around the calls, answers, the end of the turn): exactly what it writes at
  inference; with ``selector_learns: names`` only the tokens of the tool names;
- an **argument** adapter per tool (``args_<tool>``; or one ``arguments`` adapter shared by all
  tools, ``arguments: shared``) learns the argument tokens of that tool's calls, the name given:
  from the token after the one that closes the name's string through the token that closes the
  call object.

The two masks over a call are disjoint and together cover all its policy tokens (``labels``); the
split points come from ``trajtune.chat.call_spans``, the same scanner the two-stage decoder
(``algorithms.dualtune_decode``) uses to switch adapters, so training and inference cut every call
at the same token.

Training: each rendered sample becomes one copy per adapter with a token in it, weighted only on
that adapter's tokens (``meta["adapter"]``); the objective runs each adapter's rows with that
adapter active, so a selector step leaves every argument adapter's gradient exactly zero (its
weights are not in the forward pass), and the other way round. The final directory holds the
adapters in peft's multi-adapter layout (``default`` at the top, each other adapter in a
sub-directory of its name) and ``dualtune.json`` (tool → adapter), which the algorithm's load hook
(``dualtune_decode.load_dualtune_adapters``, run by ``registry.load_trained``) reads to load them
all, so that rollouts and evaluation decode in two stages.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field, model_validator

from trajtune.algorithms.base import Metrics
from trajtune.algorithms.batch import Batch, by_adapter
from trajtune.algorithms.dualtune_decode import (
    SELECTOR,
    SPEC_FILE,
    activate,
    attach,
    load_dualtune_adapters,
    peft_model,
)
from trajtune.algorithms.registry import Algorithm, Recipe, RunContext, register_algorithm
from trajtune.algorithms.sft import SFTObjective, conversation_data
from trajtune.chat.call_spans import call_splits
from trajtune.config import DataSpec, RunBase, _C
from trajtune.errors import DataError, require_input
from trajtune.experience import DatasetSource
from trajtune.models.loading import LoraConfig
from trajtune.schema import atomic_write_text
from trajtune.tokens import SOURCE_POLICY, TokenTrajectory

SHARED = "arguments"


# -- masks ------------------------------------------------------------------------------------------

def token_ends(tok: Any, ids: list[int]) -> list[int]:
    """Per token, the length of the decoded text through it (what the decoder sees after each step)."""
    return [len(tok.decode(ids[:i + 1], skip_special_tokens=False)) for i in range(len(ids))]


def turn_labels(tok: Any, ids: list[int]) -> tuple[list[str | None], list[bool]]:
    """For the tokens of one assistant turn: the tool whose *arguments* each token belongs to (None:
    a selector token), and whether it holds part of a tool name. See the module docstring."""
    text = tok.decode(ids, skip_special_tokens=False)
    labels: list[str | None] = [None] * len(ids)
    is_name = [False] * len(ids)
    n = len(ids)
    splits = call_splits(text)
    ends = token_ends(tok, ids) if splits else []  # (quadratic in the turn's length: only for turns with calls)
    starts = [0] + ends[:-1]
    for s in splits:
        for i in range(n):
            if starts[i] <= s.name_end and ends[i] > s.name_start:
                is_name[i] = True
        a = next((i for i in range(n) if ends[i] > s.name_end), n - 1)  # the token that closes the name
        b = next((i for i in range(n) if ends[i] > s.args_end), n - 1) if s.args_end is not None else n - 1
        for i in range(a + 1, b + 1):
            labels[i] = s.name
    return labels, is_name


def labels(tt: TokenTrajectory, tok: Any) -> tuple[list[str | None], list[bool], list[bool]]:
    """Per token of a rendered sample: the argument label (tool name, or None), whether it is a
    tool-name token, and whether it is a policy token at all. Each assistant turn (a run of policy
    tokens sharing a ``turn``) is scanned on its own."""
    n = len(tt.ids)
    lab: list[str | None] = [None] * n
    name = [False] * n
    policy = [s == SOURCE_POLICY for s in tt.source]
    i = 0
    while i < n:
        if not policy[i]:
            i += 1
            continue
        j = i
        while j < n and policy[j] and tt.turn[j] == tt.turn[i]:
            j += 1
        l2, n2 = turn_labels(tok, tt.ids[i:j])
        lab[i:j], name[i:j] = l2, n2
        i = j
    return lab, name, policy


def adapter_names(tools: list[str], shared: bool) -> dict[str, str]:
    """Tool name → argument adapter name (peft adapter names are module keys: letters, digits, _)."""
    if shared:
        return {t: SHARED for t in tools}
    out: dict[str, str] = {}
    used: set[str] = {SELECTOR, SHARED}
    for t in sorted(tools):
        base = "args_" + (re.sub(r"[^A-Za-z0-9_]", "_", t)[:48] or "tool")
        name, k = base, 1
        while name in used:
            k += 1
            name = f"{base}_{k}"
        used.add(name)
        out[t] = name
    return out


def split_by_adapter(tts: list[TokenTrajectory], tok: Any, spec: "DualTuneSpec",
                     tool_adapters: dict[str, str] | None = None) -> tuple[list[TokenTrajectory], dict[str, str], Counter]:
    """One copy of each sample per adapter with a trained token in it, weighted on that adapter's
    tokens only (``meta["adapter"]``). Returns the copies, tool → adapter, and trained tokens per adapter."""
    labelled = [(tt, *labels(tt, tok)) for tt in tts]
    if tool_adapters is None:
        tools = sorted({x for _, lab, _, _ in labelled for x in lab if x is not None})
        tool_adapters = adapter_names(tools, spec.arguments == "shared")
    out: list[TokenTrajectory] = []
    counts: Counter = Counter()
    for tt, lab, name, policy in labelled:
        per: dict[str, list[float]] = {}
        for k, w in enumerate(tt.weight):
            if not policy[k] or w <= 0:
                continue
            if lab[k] is not None:
                a = tool_adapters.get(lab[k])
                if a is None or spec.adapters == "selector":
                    continue
            else:
                if spec.adapters == "arguments" or (spec.selector_learns == "names" and not name[k]):
                    continue
                a = SELECTOR
            per.setdefault(a, [0.0] * len(tt.ids))[k] = w
            counts[a] += 1
        for a, weight in per.items():
            out.append(TokenTrajectory(ids=tt.ids, source=tt.source, turn=tt.turn, weight=weight,
                                       logprobs=tt.logprobs, advantages=tt.advantages, traj_id=tt.traj_id,
                                       group=tt.group, reward=tt.reward, success=tt.success,
                                       termination=tt.termination, meta={**tt.meta, "adapter": a}))
    return out, tool_adapters, counts


# -- adapters ---------------------------------------------------------------------------------------

def add_adapters(model: Any, adapters: list[str]) -> None:
    """Add each argument adapter with the selector's LoRA settings (fresh: B = 0, so each starts as
    the base model), all trainable, the selector active."""
    import copy

    pm = peft_model(model)
    for a in adapters:
        if a not in pm.peft_config:
            pm.add_adapter(a, copy.deepcopy(pm.peft_config[SELECTOR]))
    pm.set_adapter(SELECTOR)
    for n, p in pm.named_parameters():
        if "lora_" in n:
            p.requires_grad_(True)


def write_spec(final: Path, tool_adapters: dict[str, str], shared: bool) -> None:
    atomic_write_text(final / SPEC_FILE, json.dumps(
        {"version": 1, "selector": SELECTOR, "arguments": tool_adapters, "shared": SHARED if shared else None},
        indent=1, sort_keys=True))


# -- the objective ----------------------------------------------------------------------------------

@dataclass
class DualTuneObjective(SFTObjective):
    """SFT's token-mean cross-entropy, each row computed with its own adapter active."""

    name: str = "dualtune"

    def loss_sum(self, model: Any, batch: Batch) -> tuple[torch.Tensor, Metrics]:
        def one(model: Any, rows: Batch) -> tuple[torch.Tensor, Metrics]:
            loss, m = SFTObjective.loss_sum(self, model, rows)
            key = "selector_ce" if (rows.adapters or [SELECTOR])[0] == SELECTOR else "arguments_ce"
            return loss, {**m, key: m["ce"]}

        return by_adapter(model, batch, one)


# -- the `dualtune` algorithm -----------------------------------------------------------------------

class DualTuneSpec(_C):
    """How the tool-call target is split between the selector and the argument adapters."""

    arguments: Literal["per_tool", "shared"] = Field(
        "per_tool", description="per_tool: one argument adapter per tool name seen in the data (args_<tool>); "
                                "shared: one 'arguments' adapter for every tool, told the tool by the name "
                                "already written (fewer adapters for many tools)")
    selector_learns: Literal["all", "names"] = Field(
        "all", description="all: the selector learns every policy token outside the arguments (call syntax, "
                           "names, text, answers, end of turn): what it writes at inference; names: only the "
                           "tokens of tool names")
    adapters: Literal["both", "selector", "arguments"] = Field(
        "both", description="which adapters train: both, only the selector, or only the argument adapters")


class DualTuneRunConfig(RunBase):
    """``algorithm: dualtune``: decoupled tool calling (a selector LoRA adapter + argument adapters)."""

    algorithm: Literal["dualtune"] = Field("dualtune", description="decoupled tool calling: selector + argument "
                                                                    "LoRA adapters")
    data: DataSpec = Field(description="the training trajectories (tool calls in a JSON-object format)")
    dualtune: DualTuneSpec = Field(default_factory=DualTuneSpec, description="how the call target is split")

    @model_validator(mode="after")
    def _needs_lora(self) -> "DualTuneRunConfig":
        if self.model.lora is None:  # DualTune is adapters by definition: model.lora's defaults unless set
            self.model.lora = LoraConfig()
        if self.data.format == "text":
            raise ValueError("algorithm: dualtune needs conversations with tool calls, not data.format: text")
        if self.train.sharding == "fsdp":
            raise ValueError("train.sharding: fsdp is not supported by algorithm: dualtune (its per-row adapter "
                             "switching and two-stage decoding are untested on sharded weights); use "
                             "train.sharding: none")
        if self.data.train_on == "all_tokens":
            raise ValueError("algorithm: dualtune trains policy tokens only; data.train_on: all_tokens is not "
                             "supported")
        d = self.dualtune
        if d.adapters == "arguments" and d.selector_learns != "all":
            raise ValueError("dualtune.selector_learns does nothing with dualtune.adapters: arguments (the selector "
                             "does not train); remove one")
        if d.adapters == "selector" and d.arguments != "per_tool":
            raise ValueError("dualtune.arguments does nothing with dualtune.adapters: selector (no argument adapter "
                             "trains); remove one")
        return self


def _prepare(cfg: DualTuneRunConfig, ctx: RunContext) -> tuple[list[TokenTrajectory], dict[str, str], dict[str, Any]]:
    require_input(cfg.data.path, "data.path")
    trajs, tts, counts = conversation_data(cfg.data, ctx)
    n_calls = sum(len(m.tool_calls or []) for t in trajs for m in t.messages if m.role == "assistant")
    copies, tool_adapters, per_adapter = split_by_adapter(tts, ctx.tokenizer, cfg.dualtune)
    if n_calls and not tool_adapters:
        raise DataError(f"{cfg.data.path}: {n_calls} tool call(s) but none renders as a JSON object with a "
                        "\"name\" key before its arguments, so no argument tokens could be found; use a JSON "
                        "tool-call format (render.tool_format: hermes or llama3_json)")
    if not copies:
        raise DataError(f"{cfg.data.path}: no token trains any adapter (dualtune.adapters: {cfg.dualtune.adapters}; "
                        "the data needs tool calls)")
    return copies, tool_adapters, {
        **counts, "dualtune": {"tools": tool_adapters, "trained_tokens": dict(sorted(per_adapter.items()))}}


def _build(cfg: DualTuneRunConfig, ctx: RunContext,
           prepared: tuple[list[TokenTrajectory], dict[str, str], dict[str, Any]]) -> Recipe:
    copies, tool_adapters, counts = prepared
    shared = cfg.dualtune.arguments == "shared"
    add_adapters(ctx.model, sorted(set(tool_adapters.values())))
    # rollouts and the in-run evaluation decode in two stages with these adapters (dualtune_decode)
    attach(ctx.model, tool_adapters, SHARED if shared else None)
    t = cfg.train
    return Recipe(source=DatasetSource(copies, t.batch_size, cfg.seed), objective=DualTuneObjective(),
                  micro_batch_size=min(t.micro_batch_size, t.batch_size), result=counts,
                  shown=("loss", "token_accuracy"),
                  plot=("loss.png", ("loss", "selector_ce", "arguments_ce"), "DualTune"),
                  on_final=lambda final: write_spec(final, tool_adapters, shared))


register_algorithm(Algorithm("dualtune", DualTuneRunConfig,
                             "decoupled tool calling: a selector adapter picks the tool, per-tool adapters write "
                             "the arguments", _prepare, _build, load_hook=load_dualtune_adapters))
