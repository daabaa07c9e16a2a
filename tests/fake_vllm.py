"""A stand-in for the part of vLLM 0.34's offline API that ``trajtune.vllm_backend`` calls, for the
tests that run without vLLM or a GPU. It behaves as the 0.34 source says (checked in the wheel):

- ``LLM(model=DIR, **kwargs)`` accepts only keyword names ``vllm.LLM`` / ``EngineArgs`` have, reads
  ``DIR/config.json`` and, with ``load_format="dummy"``, starts from random weights (a Hugging Face
  model built from the config: the weights it samples with are the ones pushed to it, nothing else);
- ``generate`` samples each ``TokensPrompt`` token by token with its ``SamplingParams``: a stop id
  ends the turn and stays in ``token_ids``, ``max_tokens`` cuts it, the config's ``eos_token_id``
  ends it unless ``ignore_eos``; per token a dict ``{token id: Logprob}`` with the sampled token
  (plus a decoy entry for another id, so a reader that takes the first entry is caught), in the
  engine's ``logprobs_mode`` (``processed_logprobs``: after temperature and top-p, renormalised;
  ``raw_logprobs``: log-softmax of the logits);
- ``collective_rpc("reload_weights", kwargs={"weights_iterator", "is_checkpoint_format"})`` loads
  Hugging Face names (an unknown name is an error); ``sleep(level=2)`` discards the weights
  (randomises them) and refuses ``generate`` until ``wake_up`` has restored ``weights`` and
  ``kv_cache``.

Every call is recorded in ``events``; ``logprob_offset`` shifts the returned log-probs (a vLLM that
computes another distribution than the learner)."""

from __future__ import annotations

import os
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import torch

# keyword names of vllm.LLM.__init__ / EngineArgs (vllm/entrypoints/llm.py, vllm/engine/arg_utils.py) used here
LLM_KWARGS = {"skip_tokenizer_init", "load_format", "dtype", "seed", "gpu_memory_utilization", "max_model_len",
              "enforce_eager", "enable_sleep_mode", "generation_config", "logprobs_mode", "enable_prefix_caching",
              "max_num_seqs", "tensor_parallel_size"}
# fields of vllm.SamplingParams (vllm/sampling_params.py)
SAMPLING_FIELDS = {"n", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "ignore_eos",
                   "max_tokens", "min_tokens", "logprobs", "detokenize", "skip_special_tokens",
                   "include_stop_str_in_output", "repetition_penalty"}
LOGPROBS_MODES = {"raw_logits", "raw_logprobs", "processed_logits", "processed_logprobs"}


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


class SamplingParams:
    def __init__(self, **kw: Any):
        unknown = set(kw) - SAMPLING_FIELDS
        if unknown:
            raise TypeError(f"SamplingParams has no field {sorted(unknown)}")
        self.n, self.temperature, self.top_p, self.top_k, self.seed = 1, 1.0, 1.0, 0, None
        self.stop_token_ids: list[int] = []
        self.ignore_eos, self.max_tokens, self.logprobs, self.detokenize = False, 16, None, True
        self.skip_special_tokens = True
        for k, v in kw.items():
            setattr(self, k, v)
        if not 0 <= self.temperature <= 2:
            raise ValueError(f"temperature must be in [0, 2], got {self.temperature}")


def TokensPrompt(**kw: Any) -> dict[str, Any]:  # noqa: N802 - a TypedDict in vLLM
    if set(kw) != {"prompt_token_ids"} or not all(isinstance(t, int) for t in kw["prompt_token_ids"]):
        raise TypeError(f"TokensPrompt takes prompt_token_ids (a list of ints), got {kw!r}"[:200])
    return dict(kw)


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = True


class LLM:
    """See the module docstring."""

    instances: list["LLM"] = []
    logprob_offset = 0.0  # class-wide, so a test can set it before trajtune builds the engine

    def __init__(self, model: str, **kwargs: Any):
        from transformers import AutoConfig, AutoModelForCausalLM

        unknown = set(kwargs) - LLM_KWARGS
        if unknown:
            raise TypeError(f"LLM() got unexpected keyword arguments {sorted(unknown)}")
        if kwargs.get("logprobs_mode", "raw_logprobs") not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode {kwargs['logprobs_mode']!r}")
        self.kwargs = kwargs
        self.multiprocessing_env = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
        self.config = AutoConfig.from_pretrained(model)  # config.json only: no weights, no tokenizer in DIR
        self.files = sorted(os.listdir(model))
        torch.manual_seed(12345)
        dtype = getattr(torch, kwargs.get("dtype", "float32"))
        self.model = AutoModelForCausalLM.from_config(self.config).to(dtype).eval()  # dummy weights
        self.mode = kwargs.get("logprobs_mode", "raw_logprobs")
        self.events: list[tuple[Any, ...]] = []
        self.asleep: set[str] = set()
        self.requests: list[tuple[list[int], SamplingParams]] = []
        self.pushes: list[dict[str, torch.Tensor]] = []
        LLM.instances.append(self)

    # -- weights ---------------------------------------------------------------------------------------
    def collective_rpc(self, method: str, timeout: float | None = None, args: tuple = (),
                       kwargs: dict[str, Any] | None = None) -> list[Any]:
        if method != "reload_weights" or args or set(kwargs or {}) != {"weights_iterator", "is_checkpoint_format"}:
            raise NotImplementedError(f"collective_rpc({method!r}, args={args}, kwargs={sorted(kwargs or {})})")
        if "weights" in self.asleep:
            raise RuntimeError("reload_weights while the weights are asleep")
        state = self.model.state_dict()
        got: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            for name, t in kwargs["weights_iterator"]:
                if name not in state:
                    raise KeyError(f"unexpected weight {name!r}")
                state[name].copy_(t)
                got[name] = t.detach().clone().cpu()
        self.pushes.append(got)
        self.events.append(("reload_weights", kwargs["is_checkpoint_format"], len(got)))
        return [None]

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        self.events.append(("reset_prefix_cache",))
        return True

    def sleep(self, level: int = 1, mode: str = "abort", reset_connector: bool = True) -> None:
        self.events.append(("sleep", level))
        self.asleep = {"weights", "kv_cache"}
        if level == 2:  # the weights are discarded
            with torch.no_grad():
                for p in self.model.parameters():
                    p.normal_()

    def wake_up(self, tags: list[str] | None = None) -> bool:
        self.events.append(("wake_up", tuple(tags) if tags is not None else None))
        self.asleep -= set(tags) if tags is not None else set(self.asleep)
        return not self.asleep

    # -- sampling --------------------------------------------------------------------------------------
    def generate(self, prompts: Any, sampling_params: Any = None, *, use_tqdm: Any = True,
                 **_: Any) -> list[RequestOutput]:
        if self.asleep:
            raise RuntimeError(f"generate while asleep ({sorted(self.asleep)})")
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError("one SamplingParams per prompt")
        self.events.append(("generate", len(prompts)))
        outs = []
        for i, (p, sp) in enumerate(zip(prompts, params)):
            ids = list(p["prompt_token_ids"])
            self.requests.append((ids, sp))
            outs.append(RequestOutput(str(i), ids, [self._sample(ids, sp)]))
        return outs

    @torch.no_grad()
    def _sample(self, prompt: list[int], sp: SamplingParams) -> CompletionOutput:
        gen = torch.Generator().manual_seed(int(sp.seed) if sp.seed is not None else 0)
        eos = getattr(self.config, "eos_token_id", None)
        out: list[int] = []
        lps: list[dict[int, Logprob]] = []
        finish = "length"
        while len(out) < sp.max_tokens:
            logits = self.model(input_ids=torch.tensor([prompt + out])).logits[0, -1].float()
            tok, lp = self._pick(logits, sp, gen)
            out.append(tok)
            decoy = (tok + 1) % logits.shape[0]
            lps.append({decoy: Logprob(-123.0), tok: Logprob(lp + self.logprob_offset)})
            if tok in sp.stop_token_ids or (not sp.ignore_eos and tok == eos):
                finish = "stop"
                break
        return CompletionOutput(0, "", out, None, lps, finish, out[-1] if finish == "stop" else None)

    def _pick(self, logits: torch.Tensor, sp: SamplingParams, gen: torch.Generator) -> tuple[int, float]:
        raw = torch.log_softmax(logits, -1)
        if sp.temperature == 0:
            tok = int(logits.argmax())
            return tok, float(raw[tok])
        logp = torch.log_softmax(logits / sp.temperature, -1)
        probs = logp.exp()
        if sp.top_p < 1:
            sp_sorted, idx = probs.sort(descending=True)
            drop = (sp_sorted.cumsum(-1) - sp_sorted) > sp.top_p
            probs = torch.zeros_like(probs).scatter(-1, idx, sp_sorted.masked_fill(drop, 0.0))
            probs = probs / probs.sum()
        tok = int(torch.multinomial(probs, 1, generator=gen))
        if self.mode == "raw_logprobs":
            return tok, float(raw[tok])
        lp = float(logp[tok]) if sp.top_p >= 1 else float(torch.log(probs[tok]))  # processed: after top-p
        return tok, lp


def install(monkeypatch: Any, cuda: bool = True) -> types.ModuleType:
    """Make ``import vllm`` give this stand-in (and torch report a GPU to trajtune's check)."""
    mod = types.ModuleType("vllm")
    mod.LLM, mod.SamplingParams, mod.TokensPrompt = LLM, SamplingParams, TokensPrompt
    mod.__version__ = "0.34.0-fake"
    monkeypatch.setitem(sys.modules, "vllm", mod)
    monkeypatch.setattr(LLM, "instances", [])
    monkeypatch.setattr(LLM, "logprob_offset", 0.0)
    import trajtune.vllm_backend as vb

    monkeypatch.setattr(vb, "cuda_available", lambda: cuda)
    return mod
