"""Two-stage decoding for DualTune models: the selector writes up to the tool name, the named
tool's adapter writes the arguments (docs/algorithms.md, DualTune); and the adapter plumbing that
decoding and training share (the selector's name, switching the active adapter, ``dualtune.json``).

A DualTune model carries its decoding: ``attach`` sets the spec (``trajtune_dualtune``) and the
sampler hook ``generation.sampler_for`` looks for (``generation.SAMPLER_HOOK``), so every caller
of ``sampler_for`` (``run_rollouts`` for RL, RFT and the in-run evaluation, ``trajtune eval``'s
completions) decodes in two stages without naming DualTune. ``attach`` runs when the ``dualtune``
algorithm builds its recipe and in ``load_dualtune_adapters``, the algorithm's load hook
(``Algorithm.load_hook``: ``registry.load_trained`` runs it on a saved directory).

``DualTuneSampler`` has ``CachedSampler.turn``'s signature. After every sampled token the turn's
text is scanned with ``trajtune.chat.call_spans.call_splits``, the scanner that also cut the
training targets:

- while the selector is active and a call's name string has just closed, the named tool's adapter
  takes over (the token that closed the name is the selector's);
- while an argument adapter is active and its call object has just closed, the selector takes
  over again (more calls, text, the end of the turn);
- a name with no adapter of its own (a tool unseen in training) falls back to the selector, which
  writes that call's arguments itself (with ``arguments: shared`` every name has the shared adapter).

Every token is the policy's, and its log-probability is the one of the adapter that sampled it
(``last_adapters`` records which). An adapter switch re-encodes the turn's prefix with the new
adapter (a cache computed under one adapter is not valid under another), so each row is decoded
on its own; returned caches are None and the rollout passes the full sequence each turn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from trajtune.chat.call_spans import call_splits
from trajtune.errors import DataError
from trajtune.generation import SAMPLER_HOOK, cache_kwarg
from trajtune.models.adapters import DEFAULT, activate, peft_model, read_sidecar  # noqa: F401 - re-exported for dualtune
from trajtune.models.errors import ModelLoadError

SELECTOR = DEFAULT  # peft's first adapter: what ``load_model`` loads from the final directory alone
SPEC_FILE = "dualtune.json"


def read_spec(path: str | Path) -> dict[str, Any] | None:
    """The ``dualtune.json`` of a saved DualTune model directory, or None for any other model."""
    spec = read_sidecar(path, SPEC_FILE, "tool names to DualTune argument adapters")
    if spec is not None and not (isinstance(spec, dict) and isinstance(spec.get("arguments"), dict)):
        raise DataError(f"{Path(path) / SPEC_FILE}: expected an object with an 'arguments' map (tool name → adapter)")
    return spec


def dualtune_spec(model: Any) -> dict[str, Any] | None:
    """The DualTune spec a model carries (tool → adapter), or None for an ordinary model."""
    pm = peft_model(model)
    if not hasattr(pm, "peft_config"):
        return None
    spec = pm.__dict__.get("trajtune_dualtune")
    return spec if isinstance(spec, dict) else None


def dualtune_sampler(model: Any, tokenizer: Any, temperature: float, top_p: float,
                     stop_ids: list[int]) -> "DualTuneSampler | None":
    """The sampler hook ``attach`` sets (``generation.SAMPLER_HOOK``): two-stage decoding while the
    model carries a spec, else None (``sampler_for`` then picks the ordinary sampler)."""
    spec = dualtune_spec(model)
    return DualTuneSampler(model, tokenizer, spec, temperature, top_p, stop_ids) if spec is not None else None


def attach(model: Any, arguments: dict[str, str], shared: str | None) -> None:
    """Make ``model`` (its PeftModel) a DualTune model: its spec (tool → argument adapter), and the
    sampler hook, so rollouts and evaluation decode it in two stages."""
    pm = peft_model(model)
    pm.trajtune_dualtune = {"selector": SELECTOR, "arguments": arguments, "shared": shared}
    setattr(pm, SAMPLER_HOOK, dualtune_sampler)


class DualTuneSampler:
    """Samples one assistant turn per row in two stages (see the module docstring)."""

    def __init__(self, model: Any, tokenizer: Any, spec: dict[str, Any], temperature: float, top_p: float,
                 stop_ids: list[int]):
        self.model, self.tok, self.spec = model, tokenizer, spec
        self.temperature, self.top_p = temperature, top_p
        self.stops = set(stop_ids)
        self.device = next(model.parameters()).device
        self.kw = cache_kwarg(model) or "past_key_values"
        self.last_adapters: list[list[str]] = []  # per row of the last turn: the adapter of each token

    def adapter_for(self, tool: str) -> str:
        """The adapter that writes ``tool``'s arguments: its own, the shared one, else the selector."""
        own = self.spec.get("arguments", {}).get(tool)
        if own is not None:
            return own
        return self.spec.get("shared") or SELECTOR

    def _logits(self, ids: list[int], past: Any) -> torch.Tensor:
        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        out = self.model(input_ids=x, use_cache=True, **{self.kw: past})
        return out.logits[0, -1].float()

    def _pick(self, logits: torch.Tensor, gen: torch.Generator) -> tuple[int, float]:
        """As ``CachedSampler._pick``: greedy at temperature 0, else top-p sampling; the log-prob at
        the sampling temperature, before top-p."""
        if self.temperature <= 0:
            t = int(logits.argmax())
            return t, float(torch.log_softmax(logits, -1)[t])
        logp = torch.log_softmax(logits / self.temperature, -1)
        probs = logp.exp()
        if self.top_p < 1.0:
            sp, idx = probs.sort(descending=True)
            sp = sp.masked_fill((sp.cumsum(-1) - sp) > self.top_p, 0.0)
            probs = torch.zeros_like(probs).scatter(-1, idx, sp)
        t = int(torch.multinomial(probs.cpu(), 1, generator=gen))
        return t, float(logp[t])

    def _want(self, text: str, done: int) -> tuple[str, int]:
        """(the adapter that writes the next token, calls finished so far) for the turn's ``text``."""
        splits = call_splits(text)
        while done < len(splits) and splits[done].args_end is not None:
            done += 1
        if done < len(splits):  # a call whose name is written and whose object is still open
            return self.adapter_for(splits[done].name), done
        return SELECTOR, done

    def _row(self, prefix: list[int], max_new: int, gen: torch.Generator) -> tuple[list[int], list[float], bool, list[str]]:
        from transformers import DynamicCache  # lazy: the algorithm registry imports this module, CLIs stay fast

        out: list[int] = []
        lps: list[float] = []
        used: list[str] = []
        stage, done = SELECTOR, 0
        past: Any = None
        ended = False
        while len(out) < max_new:
            if past is None:  # (re-)encode the prefix under the active adapter
                activate(self.model, stage)
                past = DynamicCache()
                logits = self._logits(prefix + out, past)
            t, lp = self._pick(logits, gen)
            out.append(t)
            lps.append(lp)
            used.append(stage)
            if t in self.stops:
                ended = True
                break
            want, done = self._want(self.tok.decode(out, skip_special_tokens=False), done)
            if want != stage:
                stage, past = want, None
            elif len(out) < max_new:
                logits = self._logits([t], past)
        return out, lps, ended, used

    @torch.no_grad()
    def turn(self, rows: list[tuple[Any, list[int]]], max_new: list[int],
             seed: int) -> list[tuple[list[int], list[float], bool, None]]:
        """``CachedSampler.turn``: rows are (cache, tokens); the cache is always None here, so the
        tokens are the whole sequence. Returns (new ids, log-probs, ended, None) per row."""
        gen = torch.Generator().manual_seed(seed % (2**63))
        results = []
        self.last_adapters = []
        try:
            for (cache, ids), room in zip(rows, max_new):
                if cache is not None:
                    raise ValueError("DualTuneSampler keeps no cache: pass the whole sequence")
                out, lps, ended, used = self._row(list(ids), room, gen)
                self.last_adapters.append(used)
                results.append((out, lps, ended, None))
        finally:
            activate(self.model, SELECTOR)
        return results


def load_dualtune_adapters(model: Any, path: str) -> Any:
    """The ``dualtune`` algorithm's load hook: for the saved directory ``path`` of a DualTune run,
    load its argument adapters into ``model`` (its selector, peft's ``default`` adapter, already
    loaded) and ``attach`` the spec; the selector stays active. Any other model is returned as it is."""
    spec = read_spec(path)
    if spec is None:
        return model
    for a in sorted(set(spec["arguments"].values()) | ({spec["shared"]} if spec.get("shared") else set())):
        sub = Path(path) / a
        if not (sub / "adapter_config.json").is_file():
            raise ModelLoadError(f"{path}: dualtune.json names adapter {a!r} but {sub} holds no adapter; the "
                                 "directory is incomplete (copy the whole final directory)")
        model.load_adapter(str(sub), adapter_name=a, is_trainable=False)
    model.set_adapter(SELECTOR)
    attach(model, spec["arguments"], spec.get("shared"))
    return model
