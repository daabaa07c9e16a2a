"""Run configurations: YAML validated by pydantic.

Unknown keys are errors (a typo must not silently fall back to a default), and so are settings
that would do nothing in combination with others (e.g. a KL estimator with ``kl_coef: 0``).

A key that is also a runtime option (``rollout.*``: RolloutConfig, ``render.*`` and ``data.train_on``:
RenderConfig, ``train.*``: LearnerConfig) is declared once, in that dataclass, with
``trajtune.settings.setting``; its section here is built from it (``runtime_section``) and only
adds the config-only keys and the validators.

This module holds the sections every run shares (``RunBase``, ``EnvRunBase``, ``DataSpec``, …) and
imports no algorithm: each run config lives with its algorithm (``trajtune.algorithms.sft``'s
``SFTRunConfig``, …), and loading one by its ``algorithm:`` tag is
``trajtune.algorithms.registry.load_run_config``.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator, model_validator
from pydantic.fields import FieldInfo

from trajtune.chat.parsers import available_parsers
from trajtune.chat.render import RenderConfig
from trajtune.config_docs import did_you_mean
from trajtune.envs.ray_workers import env_factory
from trajtune.errors import ConfigError, require_input  # ConfigError is re-exported as config.ConfigError
from trajtune.learner import LearnerConfig
from trajtune.models.loading import LoraConfig
from trajtune.rollout import RolloutConfig
from trajtune.settings import is_setting
from trajtune.step_in_backward import clipping_refused


class _C(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def non_default(self) -> set[str]:
        """Fields whose value differs from their default. The no-op checks use this rather than "was
        given", so a run's config.yaml (which spells out every default) loads back with --config."""
        return {n for n, f in type(self).model_fields.items()
                if not f.is_required() and getattr(self, n) != f.get_default(call_default_factory=True)}


class _Runtime(_C):
    """A section built by ``runtime_section`` from a runtime dataclass's settings."""

    runtime: typing.ClassVar[type]
    runtime_fields: typing.ClassVar[tuple[str, ...]]

    def runtime_kwargs(self) -> dict[str, Any]:
        """This section's values of its runtime dataclass's settings (copies, as ``model_dump`` makes)."""
        return self.model_dump(include=set(self.runtime_fields))


def runtime_field(runtime: type, name: str) -> tuple[Any, FieldInfo]:
    """The pydantic field of a runtime dataclass's setting (``trajtune.settings.setting``): its type,
    default, description and bounds, read from the one place they are declared."""
    f = next((f for f in dataclasses.fields(runtime) if f.name == name), None)
    if f is None or not is_setting(f):
        raise TypeError(f"{runtime.__name__}.{name} is not a setting (declare it with trajtune.settings.setting)")
    kw: dict[str, Any] = {"description": f.metadata["description"], **f.metadata["bounds"]}
    if f.default_factory is not dataclasses.MISSING:
        kw["default_factory"] = f.default_factory
    elif f.default is not dataclasses.MISSING:
        kw["default"] = f.default
    return typing.get_type_hints(runtime)[name], Field(**kw)


def runtime_section(name: str, runtime: type, layout: list[Any]) -> type[_Runtime]:
    """The fields of a config section, in ``layout`` order: a string names a setting of the runtime
    dataclass (taken whole, see ``runtime_field``); ``(name, type, Field(...))`` declares a
    config-only key, which must not be a field of the dataclass (that would be a second declaration).
    The section's class subclasses the result and adds its validators and methods. The base records
    ``runtime`` and ``runtime_fields`` (the names taken from it, whose values ``runtime_kwargs``
    returns)."""
    names = {f.name for f in dataclasses.fields(runtime)}
    defs: dict[str, Any] = {}
    taken: list[str] = []
    for item in layout:
        if isinstance(item, str):
            defs[item] = runtime_field(runtime, item)
            taken.append(item)
        else:
            key, annotation, info = item
            if key in names:
                raise TypeError(f"{name}.{key} is a field of {runtime.__name__}: name it in the layout (its "
                                f"declaration there is the only one), do not declare it again")
            defs[key] = (annotation, info)
    base = create_model(f"_{name}Fields", __base__=_Runtime, __module__=__name__, **defs)
    base.runtime = runtime
    base.runtime_fields = tuple(taken)
    return base


class ModelSpec(_C):
    name_or_path: str = Field(description="model alias (trajtune models list), .gguf file, saved Hugging Face "
                                          "directory or LoRA adapter, or hub id org/name")
    lora: LoraConfig | None = Field(None, description="train LoRA adapters instead of every weight (the final "
                                                     "directory is then an adapter on top of name_or_path)")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="weights' dtype; auto: as stored (float32 for the tiny models, bfloat16 where a GGUF or "
                            "checkpoint says so)")
    chat_template: str | None = Field(None, description="path to a Jinja chat template overriding the tokenizer's")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, v: Any) -> Any:
        return {"name_or_path": v} if isinstance(v, str) else v


class CriticalSteps(_C):
    """Critical-step SFT (ATLaS): only the selected assistant turns carry loss."""

    selector: Literal["heuristic", "judge"] = Field(
        "heuristic", description="heuristic: points for the four ATLaS criteria read off the record (errors before "
                                 "the turn, per-turn reward, plan text, new tools); judge: an LLM picks the turns")
    ratio: float = Field(0.3, gt=0, le=1, description="target share of assistant turns to train (at least one per "
                                                      "record)")
    judge: str | None = Field(None, description="with selector: judge: openai:URL (an OpenAI-compatible endpoint) "
                                                "or a local model (alias, path)")
    judge_model: str = Field("default", description="with an openai: judge: the model name sent to the endpoint")

    @model_validator(mode="after")
    def _judge(self) -> "CriticalSteps":
        if self.selector == "judge" and not self.judge:
            raise ValueError("data.critical_steps.selector: judge needs data.critical_steps.judge (openai:URL or a "
                             "model)")
        if self.selector != "judge" and ("judge" in self.non_default() or "judge_model" in self.non_default()):
            raise ValueError("data.critical_steps.judge / judge_model only apply to selector: judge")
        return self


class FilterSpec(_C):
    """Which records to remove before training (``data.filters``; the same as ``trajtune data filter``)."""

    consistency: bool = Field(False, description="remove records with a call repeated unchanged after it failed "
                                                 "(repeat-failed-call) or an answer given on an unrecovered error "
                                                 "(ends-on-error)")
    errors: bool = Field(False, description="remove records with any error turn (invalid call, error observation, "
                                            "verifier flag); data.mask_errors keeps them with weight 0 instead")
    format: bool = Field(False, description="remove records with a validation error or arguments that violate "
                                            "their tool's JSON Schema")
    min_turns: int | None = Field(None, gt=0, description="remove records with fewer assistant turns")
    max_turns: int | None = Field(None, gt=0, description="remove records with more assistant turns")
    max_chars: int | None = Field(None, gt=0, description="remove records whose message text (tool calls "
                                                          "included) is longer")
    judge: str | None = Field(None, description="an LLM judge: openai:URL (an OpenAI-compatible endpoint) or a local "
                                                "model (alias, path); records scored under judge_min_score go")
    judge_model: str = Field("default", description="with an openai: judge: the model name sent to the endpoint")
    judge_rubric: str | None = Field(None, description="a rubric file for the judge (default: the eval judge's "
                                                       "0-10 rubric)")
    judge_min_score: float = Field(5.0, description="with judge: the lowest score a kept record may have")

    @model_validator(mode="after")
    def _useful(self) -> "FilterSpec":
        s = self.non_default()
        if not (self.consistency or self.errors or self.format or self.judge or self.min_turns or self.max_turns
                or self.max_chars):
            raise ValueError("data.filters names no filter: set consistency, errors, format, min_turns, max_turns, "
                             "max_chars or judge (or drop data.filters)")
        if self.judge is None:
            extra = [k for k in ("judge_model", "judge_rubric", "judge_min_score") if k in s]
            if extra:
                raise ValueError(f"{', '.join('data.filters.' + k for k in extra)} only apply with data.filters.judge")
        if self.min_turns and self.max_turns and self.min_turns > self.max_turns:
            raise ValueError(f"data.filters.min_turns ({self.min_turns}) > max_turns ({self.max_turns}): every "
                             "record would be removed")
        return self


_DataSpecFields = runtime_section("DataSpec", RenderConfig, [
    ("path", str, Field(description="training data file (JSONL/JSON in any supported format; `trajtune data "
                                    "validate` checks it)")),
    ("format", str | None, Field(None, description="input format; auto-detected when omitted")),
    "train_on",
    ("mask_errors", bool, Field(False, description="error-masked SFT: an assistant turn that made an invalid call, "
                                                   "drew an error observation or carries a verifier flag stays in "
                                                   "context with weight 0; later turns (the recovery) are trained "
                                                   "(docs/algorithms.md)")),
    ("faft", bool, Field(False, description="feedback-aware fine-tuning: each record's verifier feedback "
                                            "(metadata.feedback) is appended to its request, so passing and failing "
                                            "plans both train; evaluate with env feedback_slot (docs/algorithms.md)")),
    ("filters", FilterSpec | None, Field(
        None, description="remove records before training: stepwise consistency, mistakes, format, length, an LLM "
                          "judge; the counts by rule go to result.json (docs/formats.md, Filtering data)")),
    ("critical_steps", CriticalSteps | None, Field(
        None, description="critical-step SFT (ATLaS): train only the selected turns, the others stay in context "
                          "(docs/algorithms.md)")),
    ("max_length", int, Field(2048, gt=8, description="tokens per sample at most; longer samples follow "
                                                      "truncation")),
    ("truncation", Literal["drop", "truncate", "error"], Field(
        "drop", description="a sample over max_length: drop it (counted in result.json), cut it, or stop with an "
                            "error naming it")),
    ("skip_invalid", bool, Field(False, description="skip records that fail validation (counted) instead of "
                                                    "stopping at the first one")),
    ("limit", int | None, Field(None, gt=0, description="use only the first N records")),
])


class DataSpec(_DataSpecFields):
    # data.train_on is RenderConfig.train_on (the renderer applies it); the rest is read by the algorithms.
    @model_validator(mode="before")
    @classmethod
    def _moved(cls, v: Any) -> Any:
        if isinstance(v, dict) and "non_prefix" in v:
            raise ValueError("data.non_prefix moved to render.non_prefix (with the other chat-template options)")
        return v

    @model_validator(mode="after")
    def _cpt(self) -> "DataSpec":
        if self.format == "text" and self.train_on != "all_tokens":
            raise ValueError("data.format: text (plain-text documents) has no assistant turns: set data.train_on: "
                             "all_tokens to continue pre-training on it")
        if self.format == "text" and self.faft:
            raise ValueError("data.faft needs conversations with metadata.feedback, not plain text (format: text)")
        if self.train_on == "all_tokens" and (self.mask_errors or self.critical_steps is not None):
            raise ValueError("data.mask_errors / data.critical_steps do not combine with train_on: all_tokens "
                             "(which trains every token)")
        return self


_RenderSpecFields = runtime_section("RenderSpec", RenderConfig, [
    "tool_format", "end_of_turn", "non_prefix", "call_ids", "reasoning", "thought", "system_role", "tool_role",
    "content_format", "arguments_format", "template_kwargs", "assistant_prefix"])


class RenderSpec(_RenderSpecFields):
    """How conversations become tokens through the model's chat template (``trajtune doctor`` shows
    what ``auto`` resolves to for a model)."""

    def to_render_config(self, train_on: str = "hint") -> RenderConfig:
        return RenderConfig(train_on=train_on, **self.runtime_kwargs())  # type: ignore[arg-type]


_TrainSpecFields = runtime_section("TrainSpec", LearnerConfig, [
    "steps", "lr", "weight_decay", "warmup_steps", "schedule", "min_lr_ratio", "max_grad_norm",
    ("batch_size", int, Field(16, gt=0, description="sequences per optimizer step (SFT)")),
    "micro_batch_size", "save_every", "keep_last", "eval_every",
    ("gradient_checkpointing", bool, Field(False, description="recompute activations in the backward pass: less "
                                                              "memory, about a third more compute")),
    ("sharding", Literal["none", "fsdp"], Field(
        "none", description="with several processes: none keeps a full copy of the model on every rank (data "
                            "parallel); fsdp shards parameters, gradients and optimizer state across the ranks "
                            "(PyTorch FSDP2, float32), so a model too large for one device trains; one process: "
                            "nothing to shard (docs/distributed.md)")),
    "group_by_length", "share_prefix", "loss_chunk_tokens", "step_in_backward",
    ("eaft", bool, Field(False, description="EAFT: weight each token's loss by the model's entropy over its top-k "
                                            "(docs/algorithms.md)")),
    ("eaft_top_k", int, Field(20, gt=1, description="EAFT: K, the candidates the entropy is taken over")),
    ("eaft_alpha", float, Field(1.0, ge=0, description="EAFT: α, the gate's strength")),
])


class TrainSpec(_TrainSpecFields):
    # Optimizer, schedule, batches, checkpoints: the LearnerConfig settings, plus what the algorithms
    # read themselves (batch_size, gradient_checkpointing, EAFT). No docstring: the schema has none.
    @field_validator("loss_chunk_tokens", mode="before")
    @classmethod
    def _chunk_range(cls, v: Any) -> Any:
        if isinstance(v, bool) or (isinstance(v, int) and v < 0):
            raise ValueError(f"train.loss_chunk_tokens must be auto, 0 (off) or a number of positions; got {v!r}")
        return v

    @model_validator(mode="after")
    def _no_ops(self) -> "TrainSpec":
        s = self.non_default()
        if not self.eaft and ({"eaft_top_k", "eaft_alpha"} & s):
            raise ValueError("train.eaft_top_k / train.eaft_alpha are set but train.eaft is false: they would do nothing")
        if self.save_every and self.save_every >= self.steps:
            raise ValueError(f"train.save_every ({self.save_every}) >= train.steps ({self.steps}): no intermediate "
                             "checkpoint would be written (the final model is always saved); lower it or remove it")
        if self.warmup_steps >= self.steps:
            raise ValueError(f"train.warmup_steps ({self.warmup_steps}) must be below train.steps ({self.steps})")
        if self.step_in_backward and self.max_grad_norm is not None:
            raise ValueError(clipping_refused(self.max_grad_norm))
        if self.step_in_backward and self.sharding != "none":
            raise ValueError("train.step_in_backward cannot run with train.sharding: fsdp (gradients are "
                             "reduce-scattered across ranks after the backward pass); turn one off")
        if self.schedule == "constant" and "min_lr_ratio" in s:
            raise ValueError("train.min_lr_ratio has no effect with schedule: constant")
        return self


class EnvSpec(_C):
    name: str = Field(description="a registered environment (trajtune envs list)")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="arguments for the environment "
                                                                     "(trajtune envs show NAME lists them)")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, v: Any) -> Any:
        """``env: NAME`` → {name}; ``{python_tools: REF}``, ``{gym: ID}``, ``{mcp: {...}}`` → the factory of that
        name with the value as its arguments (envs/adapters/from_config.py)."""
        if isinstance(v, str):
            return {"name": v}
        if isinstance(v, dict):
            forms = [k for k in ("python_tools", "gym", "mcp") if k in v]
            if len(forms) > 1:
                raise ValueError(f"env: give one of python_tools, gym, mcp, not {forms}")
            if forms:
                form = forms[0]
                if "name" in v:
                    raise ValueError(f"env: {form} and name exclude each other")
                rest = set(v) - {form, "kwargs"}
                if rest:
                    raise ValueError(f"env.{form}: unknown key(s) {sorted(rest)}; put arguments under "
                                     f"env.{form} (mcp) or env.kwargs")
                value = v[form]
                first = {"python_tools": "toolbox", "gym": "id", "mcp": "command"}[form]
                args = dict(value) if isinstance(value, dict) else {first: value}
                return {"name": form, "kwargs": {**args, **(v.get("kwargs") or {})}}
        return v


def env_from_cli(value: str, kwargs: dict[str, Any] | None = None) -> EnvSpec:
    """``--env``: a name or ``module:Class``, an inline YAML mapping (``'{gym: mymod:Game}'``), or a YAML
    file holding one (or a run config's ``env:`` section); ``--env-arg`` pairs are added to its kwargs."""
    spec: Any = value
    path = Path(value)
    if value.endswith((".yaml", ".yml")):
        require_input(path, "--env")
        try:
            spec = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"--env {path}: not valid YAML: {e}") from None
        if isinstance(spec, dict) and "env" in spec:
            spec = spec["env"]
    elif value.lstrip().startswith("{"):
        try:
            spec = yaml.safe_load(value)
        except yaml.YAMLError as e:
            raise ConfigError(f"--env {value!r}: not a valid YAML mapping: {e}") from None
    try:
        env = EnvSpec.model_validate(spec)
    except ValidationError as e:
        raise ConfigError(_format_errors(e, f"--env {value}", EnvSpec)) from None
    return EnvSpec(name=env.name, kwargs={**env.kwargs, **(kwargs or {})})


class RaySpec(_C):
    """Environments held by Ray actors instead of the learner process (the ``ray`` extra)."""

    num_workers: int = Field(2, gt=0, description="rollout worker actors; episodes are spread over them round-robin")
    address: str | None = Field(None, description="an existing Ray cluster to join ('auto', 'ray://HOST:PORT'); "
                                                  "default: start a local one")
    cpus_per_worker: float = Field(1.0, gt=0, description="CPUs Ray reserves for each worker actor")


class ServerSpec(_C):
    """RL rollouts sampled by a generation server (docs/algorithms.md, Sampling through a generation server)."""

    url: str = Field(description="the server, http(s)://HOST:PORT (with or without /v1): `trajtune serve`, or one "
                                 "that returns token ids and log-probs and loads weights the same way")
    model: str | None = Field(None, description="the model name the server must serve (checked against GET "
                                                "/trajtune/info); default: whatever it serves")
    timeout_s: float = Field(300.0, gt=0, description="seconds one request may take (a batch of turns, or loading "
                                                      "the weights) before the run stops with a ServerError")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, v: Any) -> Any:
        return {"url": v} if isinstance(v, str) else v

    @field_validator("url")
    @classmethod
    def _http(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"rollout.server.url must start with http:// or https://, got {v!r}")
        return v


class LogprobCheckSpec(_C):
    """Compare vLLM's log-probs with the learner's on the same tokens (``rollout.vllm.logprob_check``)."""

    every: int = Field(10, ge=0, description="check on the first sampling and again once at least this many "
                                             "optimizer steps have passed since the last check; 0: never")
    rows: int = Field(4, gt=0, description="turns checked each time (the first of the batch): one learner "
                                           "forward pass each")
    tolerance: float = Field(0.05, gt=0, description="the run stops (ServerError) when the mean |Δ log-prob| "
                                                     "over the checked tokens exceeds this")
    max_tolerance: float | None = Field(1.0, gt=0, description="the run stops when any token's |Δ log-prob| "
                                                               "exceeds this (null: only the mean is checked)")


class VLLMSpec(_C):
    """Rollouts sampled in the learner's process by vLLM (docs/algorithms.md, Sampling with vLLM)."""

    gpu_memory_utilization: float = Field(0.3, gt=0, le=1, description="the share of the GPU's memory vLLM "
                                                                       "takes (weights and KV cache); the learner "
                                                                       "needs the rest")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="vLLM's weights and activations; auto: the learner's weights' dtype")
    max_model_len: int | None = Field(None, gt=0, description="the longest sequence vLLM plans for; default: "
                                                              "rollout.max_length")
    enforce_eager: bool = Field(False, description="no CUDA graphs (faster start, slower decoding)")
    sleep: bool = Field(False, description="release vLLM's GPU memory (weights and KV cache) while the "
                                           "learner trains (vLLM sleep mode, level 2); woken and given the new "
                                           "weights before the next sampling")
    logprob_check: LogprobCheckSpec = Field(default_factory=LogprobCheckSpec,
                                            description="check vLLM's log-probs against the learner's")


_RolloutSpecFields = runtime_section("RolloutSpec", RolloutConfig, [
    "max_turns", "max_new_tokens", "max_length", "temperature", "top_p", "parser", "batch_size", "step_timeout_s",
    "reuse_kv_cache", "share_prompt_cache", "mask_observations_at",
    ("ray", RaySpec | None, Field(None, description="run the environments in Ray worker actors (docs/envs.md, "
                                                    "Rollout workers on Ray); generation stays in the learner")),
    ("server", ServerSpec | None, Field(
        None, description="sample through a generation server (rl only): it returns the token ids and log-probs "
                          "that are stored, and loads the policy's weights after every step (a string is short for "
                          "server.url)")),
    ("vllm", VLLMSpec | None, Field(
        None, description="sample in the learner's process with vLLM (the vllm extra and a CUDA GPU): token ids "
                          "in and out, the policy's weights loaded after every update (true is short for {})")),
])


class RolloutSpec(_RolloutSpecFields):
    # How episodes are sampled: the RolloutConfig settings, plus where the environments run (ray) or
    # where sampling happens (server, vllm). No docstring: the schema has none.

    def to_config(self) -> RolloutConfig:
        """The agent loop's settings (``rollout.RolloutConfig``); where the environments run is not one."""
        return RolloutConfig(**self.runtime_kwargs())

    def env_factory(self, env: "EnvSpec") -> Any:
        return env_factory(env.name, env.kwargs, self.ray, self.step_timeout_s)

    @field_validator("parser")
    @classmethod
    def _known_parser(cls, v: str) -> str:
        if v != "auto" and v not in available_parsers():
            raise ValueError(f"unknown tool-call parser {v!r}; available: auto, {', '.join(available_parsers())}")
        return v

    @field_validator("vllm", mode="before")
    @classmethod
    def _vllm_shorthand(cls, v: Any) -> Any:
        return {} if v is True else None if v is False else v

    @model_validator(mode="after")
    def _vllm_combinations(self) -> "RolloutSpec":
        v = self.vllm
        if v is None:
            return self
        if self.server is not None:
            raise ValueError("rollout.vllm with rollout.server: use one of them (vLLM in the learner's process, or "
                             "a generation server)")
        self._refuse_cache_settings("rollout.vllm (vLLM keeps its own prefix cache)")
        if self.temperature > 2:
            raise ValueError(f"rollout.temperature {self.temperature} with rollout.vllm: vLLM samples at "
                             "temperatures up to 2")
        if self.top_p < 1 and self.temperature not in (0, 1):
            raise ValueError("rollout.top_p < 1 with rollout.vllm needs rollout.temperature 0 or 1: vLLM returns "
                             "either the raw log-probs (temperature 1) or those after temperature and top-p; "
                             "the objective needs log-softmax(logits / temperature) before top-p, which is one of "
                             "them only at temperature 0 or 1 (or with top_p 1)")
        if v.max_model_len is not None and v.max_model_len < self.max_length:
            raise ValueError(f"rollout.vllm.max_model_len ({v.max_model_len}) < rollout.max_length "
                             f"({self.max_length}): an episode could outgrow what vLLM plans for")
        return self

    @model_validator(mode="after")
    def _server_combinations(self) -> "RolloutSpec":
        if self.server is None:
            return self
        if self.ray is not None:
            raise ValueError("rollout.server with rollout.ray is not supported: use one of them")
        self._refuse_cache_settings("rollout.server (the server samples)")
        return self

    def _refuse_cache_settings(self, sampler: str) -> None:
        """The cached sampler's settings, changed from their defaults where another sampler samples."""
        for key in ("reuse_kv_cache", "share_prompt_cache"):
            if key in self.non_default():
                raise ValueError(f"rollout.{key} does nothing with {sampler}; remove it")

    @model_validator(mode="after")
    def _cache_combinations(self) -> "RolloutSpec":
        if not self.reuse_kv_cache and "share_prompt_cache" in self.non_default():
            raise ValueError("rollout.share_prompt_cache: false does nothing with rollout.reuse_kv_cache: false "
                             "(generate() keeps no cache to share); remove it")
        return self


class EvalSpec(_C):
    env: EnvSpec | None = Field(None, description="environment to evaluate on; an RL run defaults to its own env")
    n_tasks: int = Field(64, gt=0, description="held-out (test split) tasks")
    n_samples: int = Field(1, gt=0, description="samples per task (for pass@k)")
    k: list[int] = Field(default_factory=lambda: [1], description="pass@k values to report")
    temperature: float = Field(0.0, ge=0, description="sampling temperature; 0: greedy")
    seed: int = Field(0, description="seed of the test tasks and of sampling")

    @model_validator(mode="after")
    def _k(self) -> "EvalSpec":
        bad = [k for k in self.k if k < 1 or k > self.n_samples]
        if bad:
            raise ValueError(f"eval.k {bad} must be between 1 and eval.n_samples ({self.n_samples})")
        if self.n_samples > 1 and self.temperature == 0:
            raise ValueError("eval.n_samples > 1 with temperature 0 repeats the same greedy episode; set a temperature")
        return self


class RunBase(_C):
    """What every training run has. An algorithm's config subclasses it and adds
    ``algorithm: Literal["<name>"] = "<name>"`` (the tag of the run-config union) and its sections."""

    algorithm: str = Field(description="what to train: sft, rl, rft, dpo, tfgrpo, dualtune (trajtune config show "
                                                "ALGORITHM)")
    model: ModelSpec = Field(description="the model to start from (a string is short for model.name_or_path)")
    output_dir: str = Field(description="the run directory; an existing one is refused unless --overwrite or "
                                        "--resume")
    seed: int = Field(0, description="seeds data order, tasks, sampling and initialisation: a run is a function "
                                     "of its config")
    render: RenderSpec = Field(default_factory=RenderSpec, description="how conversations become tokens (chat "
                                                                       "template options)")
    train: TrainSpec = Field(default_factory=TrainSpec, description="optimizer, schedule, batches, checkpoints")
    eval: EvalSpec | None = Field(None, description="evaluate in an environment at the end (and every "
                                                    "train.eval_every steps)")
    tracking: list[Literal["tensorboard", "trackio", "wandb"]] = Field(
        default_factory=list, description="mirror metrics, config and the final eval to these trackers (the "
                                          "tracking extra): tensorboard and wandb (offline) write under "
                                          "output_dir, trackio to its local database")
    report: bool = Field(True, description="write OUTPUT_DIR/report.html (config, curves, eval tables, trajectory "
                                           "viewer) when the run finishes; `trajtune report DIR` writes it any time")

    @model_validator(mode="before")
    @classmethod
    def _eval_on_the_training_env(cls, v: Any) -> Any:
        """An ``eval:`` section without ``env`` evaluates on the training environment (for runs that
        have one), so that ``--set env=workspace`` cannot silently keep evaluating on another one."""
        if isinstance(v, dict) and isinstance(v.get("eval"), dict) and v["eval"].get("env") is None \
                and v.get("env") is not None:
            v = {**v, "eval": {**v["eval"], "env": v["env"]}}
        return v

    @field_validator("tracking")
    @classmethod
    def _once(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"tracking lists a backend twice: {v}")
        return v

    @model_validator(mode="after")
    def _eval_every(self) -> "RunBase":
        if self.train.eval_every and (self.eval is None or self.eval.env is None):
            raise ValueError("train.eval_every is set but there is no eval.env to evaluate on")
        return self

    @model_validator(mode="after")
    def _sharding(self) -> "RunBase":
        if self.train.sharding == "fsdp" and self.model.dtype in ("bfloat16", "float16"):
            raise ValueError(f"train.sharding: fsdp trains float32 parameters; model.dtype: {self.model.dtype} is not "
                             "supported with it (use auto or float32)")
        return self


# Sections that accept a bare string as shorthand for one key.
_SHORTHAND_KEYS = {"model": "name_or_path", "env": "name"}


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``a.b=c`` sets data['a']['b'] to YAML-parsed ``c``."""
    for ov in overrides:
        if "=" not in ov:
            raise ConfigError(f"--set {ov!r}: expected KEY=VALUE, e.g. --set train.lr=3e-4")
        key, raw = ov.split("=", 1)
        parts = [p for p in key.strip().split(".") if p]
        if not parts:
            raise ConfigError(f"--set {ov!r}: empty key")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as e:
            raise ConfigError(f"--set {ov!r}: value is not valid YAML: {e}") from None
        cur = data
        for p in parts[:-1]:
            nxt = cur.get(p)
            if nxt is None:
                nxt = cur[p] = {}
            if isinstance(nxt, str) and p in _SHORTHAND_KEYS:  # "model: x" is short for {name_or_path: x}
                nxt = cur[p] = {_SHORTHAND_KEYS[p]: nxt}
            if not isinstance(nxt, dict):
                raise ConfigError(f"--set {ov!r}: {p!r} is not a section")
            cur = nxt
        cur[parts[-1]] = value
    return data


def _format_errors(e: ValidationError, source: str, cls: type[BaseModel] | None = None) -> str:
    lines = [f"{source}: invalid configuration ({e.error_count()} problem{'s' if e.error_count() > 1 else ''}):"]
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            guess = did_you_mean(cls, tuple(err["loc"])) if cls is not None else None
            msg = (f"unknown key; did you mean {'.'.join(map(str, err['loc'][:-1] + (guess,)))}?" if guess else
                   "unknown key (check the spelling; `trajtune config show ALGORITHM` lists every key)")
        lines.append(f"  - {loc}: {msg}")
    return "\n".join(lines)


def read_config(path: str | Path | None, overrides: list[str] | None = None,
                base: dict[str, Any] | None = None) -> tuple[dict[str, Any], str]:
    """The config as a dict (YAML file, then ``--set`` overrides) and its source name for messages."""
    data: dict[str, Any] = dict(base or {})
    source = "<overrides>"
    if path is not None:
        p = Path(path)
        source = str(p)
        require_input(p, "--config")
        try:
            loaded = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f":{mark.line + 1}" if mark is not None else ""
            raise ConfigError(f"{p}{where}: not valid YAML: {getattr(e, 'problem', e)}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{p}: the top level must be a mapping of keys to values")
        data.update(loaded)
    return apply_overrides(data, overrides or []), source


def with_overrides(source: str, overrides: list[str] | None) -> str:
    """The source named in a validation error: the file, and the ``--set`` values that changed it,
    so a problem an override caused is not blamed on the YAML alone."""
    return f"{source} with --set {' '.join(overrides)}" if overrides else source


def validate_config(data: dict[str, Any], cls: type[BaseModel], source: str) -> Any:
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_errors(e, source, cls)) from None


def load_config(path: str | Path | None, cls: type[BaseModel], overrides: list[str] | None = None,
                base: dict[str, Any] | None = None) -> Any:
    data, source = read_config(path, overrides, base)
    tag = cls.model_fields.get("algorithm")
    if tag is not None and tag.default and data.get("algorithm", tag.default) != tag.default:
        raise ConfigError(f"{source}: algorithm: {data['algorithm']} is not a {tag.default} config; run it with "
                          f"`trajtune train --config {source}`")
    return validate_config(data, cls, with_overrides(source, overrides))


class EnvRunBase(RunBase):
    """A run that acts in an environment (rl, rft, dpo mined from rollouts)."""

    env: EnvSpec = Field(description="the environment to act in (a string is short for env.name)")
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, description="how episodes are sampled")

    @model_validator(mode="after")
    def _server_for_rl(self) -> "EnvRunBase":
        if self.rollout.server is None:
            return self
        if self.algorithm != "rl":
            raise ValueError(f"rollout.server is supported for algorithm rl only, not {self.algorithm}: remove it")
        if self.model.lora is not None:
            raise ValueError("rollout.server with model.lora is not supported: only full weights are synced to the "
                             "server after each step")
        return self


class _RenderOnly(_C):
    render: RenderSpec = Field(default_factory=RenderSpec)


def load_render(options: dict[str, Any], source: str = "--set render.*") -> RenderSpec:
    """Render options given outside a run config (``trajtune eval`` / ``doctor`` ``--set render.KEY=VALUE``)."""
    try:
        return _RenderOnly.model_validate({"render": options}).render
    except ValidationError as e:
        raise ConfigError(_format_errors(e, source, _RenderOnly)) from None


def dump_config(cfg: BaseModel) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
