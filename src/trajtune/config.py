"""Run configurations: YAML validated by pydantic.

Unknown keys are errors (a typo must not silently fall back to a default), and so are settings
that would do nothing in combination with others (e.g. a KL estimator with ``kl_coef: 0``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from trajtune.errors import ConfigError, require_input  # ConfigError is re-exported as config.ConfigError
from trajtune.models.loading import LoraConfig


class _C(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def non_default(self) -> set[str]:
        """Fields whose value differs from their default. The no-op checks use this rather than "was
        given", so a run's config.yaml (which spells out every default) loads back with --config."""
        return {n for n, f in type(self).model_fields.items()
                if not f.is_required() and getattr(self, n) != f.get_default(call_default_factory=True)}


class ModelSpec(_C):
    name_or_path: str = Field(description="model alias (trajtune models list), .gguf file, saved Hugging Face "
                                          "directory or LoRA adapter, or hub id org/name")
    lora: LoraConfig | None = None
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    chat_template: str | None = Field(None, description="path to a Jinja chat template overriding the tokenizer's")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, v: Any) -> Any:
        return {"name_or_path": v} if isinstance(v, str) else v


class DataSpec(_C):
    path: str
    format: str | None = Field(None, description="input format; auto-detected when omitted")
    train_on: Literal["all", "last", "hint"] = "hint"
    max_length: int = Field(2048, gt=8)
    truncation: Literal["drop", "truncate", "error"] = "drop"
    skip_invalid: bool = False
    limit: int | None = Field(None, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, v: Any) -> Any:
        if isinstance(v, dict) and "non_prefix" in v:
            raise ValueError("data.non_prefix moved to render.non_prefix (with the other chat-template options)")
        return v


class RenderSpec(_C):
    """How conversations become tokens through the model's chat template (``trajtune doctor`` shows
    what ``auto`` resolves to for a model)."""

    tool_format: Literal["auto", "native", "hermes", "llama3_json", "pythonic"] = Field(
        "auto", description="native: the template's own tool support; hermes / llama3_json / pythonic: tools, calls "
        "and results written as text in that convention; auto: native where the template renders tools and calls, "
        "else hermes")
    end_of_turn: str | list[str] | None = Field(
        None, description="string(s) closing an assistant turn; default: detected per turn type from the template")
    non_prefix: Literal["error", "split"] = Field(
        "error", description="templates that rewrite earlier turns: refuse (error) or one sample per turn (split)")
    call_ids: Literal["auto", "keep", "mistral"] = Field(
        "auto", description="adapt tool-call ids to what the template accepts (mistral: 9 alphanumeric characters)")
    reasoning: Literal["auto", "field", "inline", "drop"] = Field(
        "auto", description="where reasoning_content goes: the template's reasoning field, an inline <think> block, "
        "or nowhere")
    thought: Literal["content", "drop"] = Field(
        "content", description="a visible thought (e.g. ADP's description): trained before the content, or dropped")
    system_role: Literal["auto", "native", "fold"] = Field(
        "auto", description="fold: the system prompt goes into the first user turn (auto: when the template refuses "
        "a system message)")
    tool_role: Literal["auto", "native", "user"] = Field(
        "auto", description="user: tool results are rendered as user turns (auto: when the template refuses tool "
        "messages)")
    content_format: Literal["auto", "string", "parts"] = Field(
        "auto", description="parts: message content passed as a list of text parts (auto: when the template ignores "
        "plain strings)")
    arguments_format: Literal["auto", "dict", "string"] = Field(
        "auto", description="string: tool-call arguments passed as JSON text (auto: when the template prints "
        "arguments as given)")
    template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="extra template variables, e.g. {enable_thinking: false}")

    def to_render_config(self, train_on: str = "hint") -> Any:
        from trajtune.chat.render import RenderConfig

        return RenderConfig(train_on=train_on, **self.model_dump())  # type: ignore[arg-type]


class TrainSpec(_C):
    steps: int = Field(100, gt=0)
    lr: float = Field(1e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    warmup_steps: int = Field(0, ge=0)
    schedule: Literal["constant", "linear", "cosine"] = "cosine"
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    max_grad_norm: float = Field(1.0, gt=0)
    batch_size: int = Field(16, gt=0, description="sequences per optimizer step (SFT)")
    micro_batch_size: int = Field(16, gt=0)
    save_every: int = Field(0, ge=0)
    keep_last: int = Field(2, gt=0)
    eval_every: int = Field(0, ge=0)
    gradient_checkpointing: bool = Field(False, description="recompute activations in the backward pass: less "
                                                            "memory, about a third more compute")
    group_by_length: bool = Field(False, description="fill micro-batches with rows (units) of similar length, "
                                                     "so less padding is computed; the step's gradient is the same")
    eaft: bool = False
    eaft_top_k: int = Field(20, gt=1)
    eaft_alpha: float = Field(1.0, ge=0)

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
        if self.schedule == "constant" and "min_lr_ratio" in s:
            raise ValueError("train.min_lr_ratio has no effect with schedule: constant")
        return self


class EnvSpec(_C):
    name: str
    kwargs: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, v: Any) -> Any:
        return {"name": v} if isinstance(v, str) else v


class RaySpec(_C):
    """Environments held by Ray actors instead of the learner process (the ``ray`` extra)."""

    num_workers: int = Field(2, gt=0, description="rollout worker actors; episodes are spread over them round-robin")
    address: str | None = Field(None, description="an existing Ray cluster to join ('auto', 'ray://HOST:PORT'); "
                                                  "default: start a local one")
    cpus_per_worker: float = Field(1.0, gt=0, description="CPUs Ray reserves for each worker actor")


class RolloutSpec(_C):
    max_turns: int = Field(8, gt=0)
    max_new_tokens: int = Field(128, gt=0)
    max_length: int = Field(2048, gt=8)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    parser: str = Field("auto", description="tool-call parser; auto: the one matching the render tool format")
    batch_size: int = Field(32, gt=0)
    step_timeout_s: float = Field(30.0, gt=0)
    reuse_kv_cache: bool = Field(True, description="keep each episode's KV cache across turns (encode only the new "
                                                   "tokens); false, or a model it cannot serve: generate() per turn")
    ray: RaySpec | None = Field(None, description="run the environments in Ray worker actors (docs/envs.md, Rollout "
                                                   "workers on Ray); generation stays in the learner")

    def to_config(self) -> Any:
        """The agent loop's settings (``rollout.RolloutConfig``); where the environments run is not one."""
        from trajtune.rollout import RolloutConfig

        return RolloutConfig(**self.model_dump(exclude={"ray"}))

    def env_factory(self, env: "EnvSpec") -> Any:
        from trajtune.envs.ray_workers import env_factory

        return env_factory(env.name, env.kwargs, self.ray, self.step_timeout_s)

    @field_validator("parser")
    @classmethod
    def _known_parser(cls, v: str) -> str:
        from trajtune.chat.parsers import available_parsers

        if v != "auto" and v not in available_parsers():
            raise ValueError(f"unknown tool-call parser {v!r}; available: auto, {', '.join(available_parsers())}")
        return v


class EvalSpec(_C):
    env: EnvSpec | None = Field(None, description="environment to evaluate on; an RL run defaults to its own env")
    n_tasks: int = Field(64, gt=0)
    n_samples: int = Field(1, gt=0)
    k: list[int] = Field(default_factory=lambda: [1])
    temperature: float = Field(0.0, ge=0)
    seed: int = 0

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

    algorithm: str
    model: ModelSpec
    output_dir: str
    seed: int = 0
    render: RenderSpec = Field(default_factory=RenderSpec)
    train: TrainSpec = Field(default_factory=TrainSpec)
    eval: EvalSpec | None = None
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

    @model_validator(mode="after")
    def _eval_every(self) -> "RunBase":
        if self.train.eval_every and (self.eval is None or self.eval.env is None):
            raise ValueError("train.eval_every is set but there is no eval.env to evaluate on")
        return self


def __getattr__(name: str) -> Any:
    """The run configs live with their algorithms (trajtune.algorithms.*); these names stay importable
    from here."""
    where = {"SFTRunConfig": "trajtune.algorithms.sft", "RLRunConfig": "trajtune.algorithms.rl",
             "RLSpec": "trajtune.algorithms.rl", "RFTRunConfig": "trajtune.algorithms.rft",
             "DPORunConfig": "trajtune.algorithms.dpo"}
    if name in where:
        import importlib

        return getattr(importlib.import_module(where[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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


def _format_errors(e: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid configuration ({e.error_count()} problem{'s' if e.error_count() > 1 else ''}):"]
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling; see examples/ for valid configs)"
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


def validate_config(data: dict[str, Any], cls: type[BaseModel], source: str) -> Any:
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_errors(e, source)) from None


def load_config(path: str | Path | None, cls: type[BaseModel], overrides: list[str] | None = None,
                base: dict[str, Any] | None = None) -> Any:
    data, source = read_config(path, overrides, base)
    tag = cls.model_fields.get("algorithm")
    if tag is not None and tag.default and data.get("algorithm", tag.default) != tag.default:
        raise ConfigError(f"{source}: algorithm: {data['algorithm']} is not a {tag.default} config; run it with "
                          f"`trajtune train --config {source}`")
    return validate_config(data, cls, source)


def load_run_config(path: str | Path | None, overrides: list[str] | None = None,
                    algorithm: str | None = None) -> Any:
    """A run config of any registered algorithm, chosen by its ``algorithm:`` key (the union's tag).
    ``algorithm`` is what the command implies (``trajtune sft`` → sft); a config naming another
    algorithm is refused rather than silently run as something else."""
    from trajtune.algorithms.registry import algorithms

    data, source = read_config(path, overrides)
    known = algorithms()
    tag = data.get("algorithm", algorithm)
    if tag is None:
        raise ConfigError(f"{source}: no `algorithm:` key; set one of: {', '.join(sorted(known))}")
    if algorithm is not None and tag != algorithm:
        raise ConfigError(f"{source}: algorithm: {tag} is not a {algorithm} config; run it with "
                          f"`trajtune train --config {source}`")
    if tag not in known:
        raise ConfigError(f"{source}: unknown algorithm {tag!r}; known: {', '.join(sorted(known))}")
    return validate_config({**data, "algorithm": tag}, known[tag].config, source)


class EnvRunBase(RunBase):
    """A run that acts in an environment (rl, rft, dpo mined from rollouts)."""

    env: EnvSpec
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)


class _RenderOnly(_C):
    render: RenderSpec = Field(default_factory=RenderSpec)


def load_render(options: dict[str, Any], source: str = "--set render.*") -> RenderSpec:
    """Render options given outside a run config (``trajtune eval`` / ``doctor`` ``--set render.KEY=VALUE``)."""
    try:
        return _RenderOnly.model_validate({"render": options}).render
    except ValidationError as e:
        raise ConfigError(_format_errors(e, source)) from None


def dump_config(cfg: BaseModel) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
