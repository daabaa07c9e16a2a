"""Rollouts sampled in the learner's process by vLLM (``rollout.vllm``), with token-exact provenance.

Why: on a GPU, ``generate`` and even the KV-cache sampler leave most of the device idle; a paged,
continuously batched engine samples many times faster. TRL, verl and OpenRLHF put rollouts in
vLLM for that reason. What trajtune keeps while doing so:

- **Token ids in, token ids out.** Every turn, each live episode's whole token sequence goes in as
  ``TokensPrompt(prompt_token_ids=...)`` (never text; vLLM is started without a tokenizer), and the
  sampled ids come back as ``CompletionOutput.token_ids`` with, per token, the sampled token's
  log-probability (``SamplingParams(logprobs=0)``). So ``run_rollouts`` stores exactly what vLLM
  sampled, as it does for the cached sampler and a generation server (``remote.ServerSampler``,
  whose ``turn`` this sampler shares). vLLM's prefix cache makes re-sending the history cheap.
- **The objective's log-probs.** The stored value must be what the policy-gradient objective
  recomputes: log-softmax(logits / temperature), before top-p. vLLM's ``processed_logprobs`` are
  that when top-p is off; its ``raw_logprobs`` are that at temperature 0 or 1. The engine is
  started in the mode that fits the rollout settings, and the config refuses the combination that
  neither gives (top-p with another temperature).
- **Only the stop ids end a turn.** ``ignore_eos`` keeps vLLM from stopping at the model's own
  end-of-sequence token, so a turn ends exactly at one of the renderer's stop ids (kept in
  ``token_ids``) or at the length limit; anything else is refused as a ``ServerError``.
- **The current policy.** After every optimizer step the learner's ``on_weights`` hook marks the
  engine stale; before the next sampling its weights are replaced in place with the learner's
  (full weights; for LoRA the adapter merged into each layer, W + ΔW, computed without touching
  the trained model), and the prefix cache is reset so no cached keys of the old policy are reused.
  vLLM starts from dummy weights (``load_format="dummy"``): the learner's are pushed before the
  first sampling, after a resume too.
- **A check that it is the same policy.** On the first sampling and again every
  ``logprob_check.every`` steps, the learner recomputes the log-probs of a few sampled turns with
  the objective's own function (``algorithms.batch.token_logprobs``); the max and mean |Δ| are
  logged (``vllm/logprob_diff_max``, ``vllm/logprob_diff_mean``) and a difference above the
  tolerance stops the run, as TRL reports its vLLM importance-sampling gap: weights that did not
  sync, another dtype or an architecture vLLM implements differently would otherwise train the
  policy on ratios to another model.

Checked against the source of vLLM 0.34.0 (the wheel, not run: this project's CI has no GPU):

- ``vllm.LLM(model, skip_tokenizer_init, load_format, dtype, seed, gpu_memory_utilization,
  max_model_len, enforce_eager, enable_sleep_mode, logprobs_mode, generation_config)``:
  ``vllm/entrypoints/llm.py`` (``LLM.__init__``, extra keywords to ``EngineArgs``,
  ``vllm/engine/arg_utils.py``); ``logprobs_mode`` values: ``vllm/config/model.py``, applied in
  ``vllm/v1/worker/gpu/sample/sampler.py`` (processed = after temperature and top-k/top-p).
- ``LLM.generate(prompts, sampling_params: list, use_tqdm=False)`` returns the outputs in prompt
  order (``vllm/entrypoints/common/offline.py``, ``_run_engine`` sorts by request id);
  ``RequestOutput.outputs[0]`` is a ``CompletionOutput`` with ``token_ids``, ``logprobs`` (per
  token a dict id → ``Logprob``, or ``FlatLogprobs`` indexed alike) and ``finish_reason``
  (``vllm/outputs.py``, ``vllm/logprobs.py``). A stop token stays in ``token_ids``
  (``vllm/v1/core/sched/utils.py``, ``check_stop``); ``ignore_eos`` leaves the generation config's
  end-of-sequence ids out of the stop ids (``vllm/sampling_params.py``,
  ``update_from_generation_config``). ``vllm.TokensPrompt``: ``vllm/inputs/llm.py``.
- Weights: ``LLM.collective_rpc("reload_weights", kwargs={"weights_iterator": ...,
  "is_checkpoint_format": True})`` runs ``Worker.reload_weights`` (``vllm/v1/worker/gpu_worker.py``)
  → ``GPUModelRunner.reload_weights`` (``vllm/v1/worker/gpu/model_runner.py``) →
  ``model_executor/model_loader/reload/inplace.py``: ``model.load_weights`` on Hugging Face names,
  layer by layer, with the post-load processing. The engine is built in-process
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: ``vllm/v1/engine/llm_engine.py``,
  ``vllm/v1/executor/uniproc_executor.py``), so the iterator and the learner's tensors are handed
  over, not serialized. ``LLM.reset_prefix_cache()``, ``LLM.sleep(level=2)`` and
  ``LLM.wake_up(tags=["weights"])`` / ``(tags=["kv_cache"])``: ``vllm/entrypoints/llm.py``,
  ``vllm/v1/engine/core.py``.

The tests run this module against a stand-in ``vllm`` that records these calls
(``tests/test_vllm_backend.py``); the tests with real vLLM are skipped without it and a CUDA GPU.
"""

from __future__ import annotations

import copy
import hashlib
import math
import os
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trajtune.algorithms.batch import collate, token_logprobs
from trajtune.algorithms.registry import Recipe
from trajtune.errors import ConfigError, ServerError
from trajtune.generation import SAMPLER_HOOK, carried_sampler
from trajtune.progress import console
from trajtune.remote import Sent
from trajtune.tokens import SOURCE_POLICY, SOURCE_PROMPT, TokenTrajectory

if TYPE_CHECKING:
    from trajtune.config import RolloutSpec, VLLMSpec

#: The vLLM release whose source the calls here were checked against.
VLLM_VERSION_CHECKED = "0.34.0"
INSTALL_HINT = "pip install 'trajtune[vllm]'"


def import_vllm() -> Any:
    """The ``vllm`` module, or a ConfigError with the install hint (checked before a run writes anything)."""
    try:
        import vllm
    except ImportError as e:
        raise ConfigError(f"rollout.vllm needs vLLM, which cannot be imported here ({e}); install it with "
                          f"{INSTALL_HINT} (checked against vLLM {VLLM_VERSION_CHECKED}; it needs a CUDA GPU), "
                          "or remove rollout.vllm to sample in the learner") from None
    return vllm


def cuda_available() -> bool:
    return torch.cuda.is_available()


def check_available(cfg: Any) -> None:
    """Refuse ``rollout.vllm`` before anything is written when vLLM cannot run here."""
    if getattr(getattr(cfg, "rollout", None), "vllm", None) is None:
        return
    import_vllm()
    if not cuda_available():
        raise ConfigError("rollout.vllm needs a CUDA GPU, and torch sees none here; remove rollout.vllm to sample "
                          "in the learner (the KV-cache sampler)")


def _is_peft(model: Any) -> bool:
    return hasattr(model, "peft_config")


def _core(model: Any) -> Any:
    return model.get_base_model() if _is_peft(model) else model


@torch.no_grad()
def policy_weights(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """The policy's weights under their Hugging Face names, each shared tensor once (a tied output
    head is left to vLLM, which ties it again). For a LoRA model every adapted layer yields its
    merged weight W + ΔW (``get_delta_weight`` of the active adapters), computed here: merging into
    the trained model and back would change its weights by rounding."""
    if not _is_peft(model):
        yield from ((name, p.detach()) for name, p in model.named_parameters())  # repeats skipped
        return
    from peft.tuners.lora import LoraLayer

    seen: set[int] = set()
    inside: str | None = None  # the LoRA layer whose submodules (base_layer, lora_A, ...) are skipped
    for mname, module in _core(model).named_modules():  # pre-order: a layer's submodules follow it
        if inside is not None and mname.startswith(inside + "."):
            continue
        inside = None
        if isinstance(module, LoraLayer):
            inside = mname
            base = module.get_base_layer()
            w = base.weight
            if not module.merged and not module.disable_adapters:
                for a in module.active_adapters:
                    if a in module.lora_A or a in getattr(module, "lora_embedding_A", {}):
                        w = w + module.get_delta_weight(a).to(w.dtype)
            seen.add(id(base.weight))
            yield f"{mname}.weight", w.detach()
            if getattr(base, "bias", None) is not None:
                yield f"{mname}.bias", base.bias.detach()
            continue
        for pname, p in module.named_parameters(recurse=False):
            if id(p) not in seen:
                seen.add(id(p))
                yield (f"{mname}.{pname}" if mname else pname), p.detach()


def check_weight_names(model: Any) -> None:
    """Refuse, before training, weights whose names vLLM would not know: PEFT's ``modules_to_save``
    copies (an adapter trained with them is not a plain LoRA merge)."""
    odd = [n for n, _ in _core(model).named_parameters() if ".modules_to_save." in n or ".original_module." in n]
    if odd:
        raise ConfigError(f"rollout.vllm cannot push a LoRA adapter with modules_to_save ({odd[0]}, ...): only "
                          "LoRA layers are merged into the weights vLLM holds")


def _row_seed(seed: int, row: int) -> int:
    h = hashlib.sha256(repr(("vllm", seed, row)).encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


def _engine_dir(model: Any, path: Path) -> Path:
    """A model directory holding only ``config.json`` (the learner's, with its architecture): vLLM
    builds the model from it with dummy weights and needs no tokenizer (token ids only)."""
    core = _core(model)
    config = copy.deepcopy(core.config)
    config.architectures = [type(core).__name__]
    path.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(path)
    return path


def engine_kwargs(spec: VLLMSpec, rollout: RolloutSpec, model: Any, seed: int) -> dict[str, Any]:
    """The ``vllm.LLM`` keywords for ``spec`` (checked against vLLM 0.34's ``LLM.__init__`` / ``EngineArgs``)."""
    core = _core(model)
    dtype = spec.dtype
    if dtype == "auto":  # the learner's weights' dtype, so the check compares like with like
        dtype = str(core.get_input_embeddings().weight.dtype).removeprefix("torch.")
    max_len = spec.max_model_len or rollout.max_length
    text = core.config.get_text_config() if hasattr(core.config, "get_text_config") else core.config
    limit = getattr(text, "max_position_embeddings", None)
    if isinstance(limit, int) and limit < max_len:
        raise ConfigError(f"rollout.vllm: sequences of {max_len} tokens (rollout.max_length, or "
                          f"rollout.vllm.max_model_len) exceed the model's max_position_embeddings ({limit}), which "
                          "vLLM refuses; lower rollout.max_length")
    return dict(skip_tokenizer_init=True, load_format="dummy", dtype=dtype, seed=seed,
                gpu_memory_utilization=spec.gpu_memory_utilization, max_model_len=max_len,
                enforce_eager=spec.enforce_eager, enable_sleep_mode=spec.sleep, generation_config="vllm",
                # the objective's log-probs: top-p on needs the raw ones (temperature 0 or 1, the config checks)
                logprobs_mode="raw_logprobs" if rollout.top_p < 1 else "processed_logprobs")


class VLLMEngine:
    """One in-process ``vllm.LLM`` following the learner's policy: ``version`` is the number of
    optimizer steps behind the learner's weights, ``held`` the version vLLM holds (None: none yet,
    or discarded by sleep)."""

    def __init__(self, llm: Any, spec: VLLMSpec, quiet: bool = False):
        self.llm, self.spec, self.quiet = llm, spec, quiet
        self.version = 0
        self.held: int | None = None
        self.checked: int | None = None  # the version last checked against the learner
        self.asleep = False
        self.sampling_for_source = False  # the training source is sampling (the check runs only then)
        self.metrics: dict[str, float] = {}

    @classmethod
    def start(cls, spec: VLLMSpec, rollout: RolloutSpec, model: Any, workdir: Path, seed: int,
              quiet: bool = False) -> "VLLMEngine":
        vllm = import_vllm()
        kwargs = engine_kwargs(spec, rollout, model, seed)
        path = _engine_dir(model, Path(workdir) / "model")
        before = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process: weights are handed over, not serialized
        try:
            llm = vllm.LLM(model=str(path), **kwargs)
        finally:
            if before is None:
                os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
            else:
                os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = before
        return cls(llm, spec, quiet)

    def updated(self, step: int) -> None:
        """The learner's ``on_weights``: its weights are now those after ``step`` updates."""
        self.version = step

    def ensure(self, model: Any) -> None:
        """Before sampling: vLLM awake and holding the learner's current weights."""
        if self.held == self.version and not self.asleep:
            return
        t0 = time.perf_counter()
        if self.asleep:
            self.llm.wake_up(tags=["weights"])  # level 2 discarded them: room for the push, no copy back
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": policy_weights(model),
                                                          "is_checkpoint_format": True})
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        self.llm.reset_prefix_cache()  # cached keys and values are the old policy's
        self.held = self.version
        self.metrics["vllm/sync_s"] = round(time.perf_counter() - t0, 4)

    def rest(self) -> None:
        """After a step's sampling, with ``sleep``: free vLLM's GPU memory for the learner."""
        if self.spec.sleep and not self.asleep and self.held is not None:
            self.llm.sleep(level=2)
            self.asleep, self.held = True, None

    def check_due(self) -> bool:
        every = self.spec.logprob_check.every
        return self.sampling_for_source and every > 0 and (
            self.checked is None or self.version - self.checked >= every)

    def sampler(self, model: Any, tokenizer: Any, temperature: float, top_p: float,
                stop_ids: list[int]) -> "VLLMSampler":
        """The ``generation.SAMPLER_HOOK`` factory installed on the trained model: every rollout of the
        run (and its in-run evaluation) samples through vLLM, synced first."""
        self.ensure(model)
        return VLLMSampler(self, model, temperature, top_p, stop_ids, check=self.check_due())

    def generate(self, prompts: list[list[int]], max_new: list[int], temperature: float, top_p: float,
                 stop_ids: list[int], seed: int) -> list[Any]:
        vllm = import_vllm()
        params = [vllm.SamplingParams(n=1, temperature=temperature, top_p=top_p if temperature > 0 else 1.0,
                                      top_k=0, max_tokens=m, stop_token_ids=list(stop_ids), ignore_eos=True,
                                      logprobs=0, seed=_row_seed(seed, r), detokenize=False,
                                      skip_special_tokens=False)
                  for r, m in enumerate(max_new)]
        outs = self.llm.generate([vllm.TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params,
                                 use_tqdm=False)
        if len(outs) != len(prompts):
            raise ServerError(f"rollout.vllm: {len(outs)} outputs for {len(prompts)} prompts")
        return list(outs)

    def record_check(self, diffs: torch.Tensor) -> None:
        """Log the |Δ log-prob| of the checked tokens; stop the run when they exceed the tolerance."""
        c = self.spec.logprob_check
        n = int(diffs.numel())
        mx = float(diffs.max()) if n else 0.0
        mean = float(diffs.mean()) if n else 0.0
        self.checked = self.version
        self.metrics.update({"vllm/logprob_diff_max": mx, "vllm/logprob_diff_mean": mean,
                             "vllm/logprob_check_tokens": float(n)})
        if not self.quiet:
            console.print(f"vLLM log-prob check (policy after {self.version} updates): max |Δ| {mx:.3g}, mean "
                          f"{mean:.3g} over {n} tokens", highlight=False, soft_wrap=True)
        if not math.isfinite(mean) or mean > c.tolerance or (c.max_tolerance is not None and mx > c.max_tolerance):
            raise ServerError(
                f"rollout.vllm: vLLM's log-probs differ from the learner's on the same tokens (policy after "
                f"{self.version} updates): max |Δ| {mx:.4g}, mean {mean:.4g} over {n} tokens, above "
                f"rollout.vllm.logprob_check (tolerance {c.tolerance}, max_tolerance {c.max_tolerance}); vLLM "
                "samples another policy than the one trained (weights not synced, another dtype than the "
                "learner's, or an architecture vLLM computes differently): training on these ratios would be "
                "wrong. Set rollout.vllm.dtype to the learner's, or raise the tolerance if the gap is expected")

    def take_metrics(self) -> dict[str, float]:
        out, self.metrics = self.metrics, {}
        return out


def _turn_result(out: Any, room: int, stops: set[int]) -> tuple[list[int], list[float], bool]:
    """(ids, log-probs, ended at a stop id) of one output; a ServerError for anything trajtune did
    not ask for (a turn that stops elsewhere, a token without its log-prob)."""
    c = out.outputs[0]
    ids = [int(t) for t in c.token_ids]
    lps: list[float] = []
    for j, t in enumerate(ids):
        entry = c.logprobs[j].get(t) if c.logprobs is not None and j < len(c.logprobs) and c.logprobs[j] else None
        if entry is None or not math.isfinite(float(entry.logprob)):
            raise ServerError(f"rollout.vllm: no finite log-probability for sampled token {j} ({t}) of a turn; "
                              "RL needs the sampling log-prob of every token")
        lps.append(float(entry.logprob))
    ended = bool(ids) and ids[-1] in stops
    if not ids or len(ids) > room or (not ended and len(ids) < room) or (ended and stops & set(ids[:-1])):
        raise ServerError(f"rollout.vllm: {len(ids)} tokens (finish_reason {c.finish_reason!r}) for max_tokens "
                          f"{room} and stop ids {sorted(stops)}: vLLM did not stop at exactly a stop id or the "
                          "length, so the turn is not the one trajtune asked for")
    return ids, lps, ended


class VLLMSampler:
    """``turn`` like ``generation.CachedSampler.turn``, sampled by vLLM; a row's cache is what vLLM
    was sent of its episode (``remote.Sent``: vLLM's prefix cache holds the keys, not trajtune)."""

    def __init__(self, engine: VLLMEngine, model: Any, temperature: float, top_p: float, stop_ids: list[int],
                 check: bool = False):
        self.engine, self.model = engine, model
        self.temperature, self.top_p = temperature, top_p
        self.stop_ids = list(stop_ids)
        self.check = check  # compare the first turn's log-probs with the learner's

    def turn(self, rows: list[tuple[Sent | None, list[int]]], max_new: list[int],
             seed: int) -> list[tuple[list[int], list[float], bool, Sent]]:
        prompts = [(sent.ids if sent is not None else []) + list(new) for sent, new in rows]
        outs = self.engine.generate(prompts, max_new, self.temperature, self.top_p, self.stop_ids, seed)
        stops = set(self.stop_ids)
        got = [_turn_result(o, m, stops) for o, m in zip(outs, max_new)]
        if self.check:
            self.check = False
            self.engine.record_check(self._learner_gap(prompts, got))
        return [(ids, lps, ended, Sent(p + ids)) for p, (ids, lps, ended) in zip(prompts, got)]

    @torch.no_grad()
    def _learner_gap(self, prompts: list[list[int]], got: list[tuple[list[int], list[float], bool]]) -> torch.Tensor:
        """|vLLM − learner| log-prob of each sampled token of the first ``logprob_check.rows`` turns,
        the learner's from the objective's own function at the sampling temperature."""
        rows = []
        for p, (ids, lps, _) in list(zip(prompts, got))[:self.engine.spec.logprob_check.rows]:
            n = len(p)
            rows.append(TokenTrajectory(ids=p + ids, source=[SOURCE_PROMPT] * n + [SOURCE_POLICY] * len(ids),
                                        turn=[0] * (n + len(ids)), weight=[0.0] * n + [1.0] * len(ids),
                                        logprobs=[0.0] * n + lps))
        device = next(self.model.parameters()).device
        gaps = []
        for row in rows:  # one at a time: a long history with a real vocabulary is a large forward
            b = collate([row], 0).to(device)
            lp, _ = token_logprobs(self.model, b, self.temperature if self.temperature > 0 else 1.0)
            mask = b.source[:, 1:] == SOURCE_POLICY
            gaps.append((lp.float() - b.old_logprobs[:, 1:])[mask].abs().cpu())
        return torch.cat(gaps) if gaps else torch.zeros(0)


class VLLMSynced:
    """The run's experience source with vLLM sampling: metrics of the sync and the log-prob check
    join the step's, and with ``sleep`` vLLM releases its memory once the step has sampled."""

    def __init__(self, inner: Any, engine: VLLMEngine):
        self.inner, self.engine = inner, engine

    def __getattr__(self, name: str) -> Any:  # state_dict / close / ... of the wrapped source
        if name in ("inner", "engine"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    def batch(self, step: int, model: Any) -> Any:
        self.engine.version = step  # the learner's weights: after `step` updates (a resume starts here)
        self.engine.sampling_for_source = True
        try:
            tts, metrics = self.inner.batch(step, model)
        finally:
            self.engine.sampling_for_source = False
        self.engine.rest()
        return tts, {**metrics, **self.engine.take_metrics()}


def attach(recipe: Recipe, cfg: Any, model: Any, workdir: Path, quiet: bool = False) -> Recipe:
    """Start vLLM for ``cfg.rollout.vllm`` and route the recipe's rollouts through it: the sampler hook
    on ``model`` (``generation.SAMPLER_HOOK``: every ``run_rollouts`` of the run picks it up, so RL,
    RFT and DPO mining need no change), the source wrapped for the metrics, and ``on_weights``
    chained to mark the engine stale after every update."""
    if carried_sampler(model) is not None:
        raise ConfigError("rollout.vllm with a model that carries its own sampler (a DualTune model's two-stage "
                          "decoding) is not supported: vLLM would bypass it")
    check_weight_names(model)
    engine = VLLMEngine.start(cfg.rollout.vllm, cfg.rollout, model, workdir, cfg.seed, quiet)
    setattr(model, SAMPLER_HOOK, engine.sampler)
    previous = recipe.on_weights

    def on_weights(step: int, m: Any) -> None:
        if previous is not None:
            previous(step, m)
        engine.updated(step)

    return replace(recipe, source=VLLMSynced(recipe.source, engine), on_weights=on_weights)
