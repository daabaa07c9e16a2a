"""Evaluation runs: roll a model out on an environment's held-out tasks and score the episodes."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from trajtune.algorithms.registry import load_trained
from trajtune.chat.render import ChatRenderer
from trajtune.envs.base import Environment, Task
from trajtune.errors import Interrupted, UsageError
from trajtune.eval.backends import HFBackend
from trajtune.eval.bayes_lora import BayesLoRAScorer
from trajtune.eval.harness import build_suites, run_evaluation
from trajtune.eval.metrics import summarize
from trajtune.eval.store import EvalStore
from trajtune.judge import make_judge
from trajtune.models.loading import adapter_base, load_tokenizer, to_device
from trajtune.models.resolve import ModelLoadError, resolve_model
from trajtune.progress import bar, console
from trajtune.rollout import Episode, RolloutConfig, run_rollouts
from trajtune.schema import AtomicJsonlWriter, atomic_write_text


def evaluate(model: Any, tokenizer: Any, env_factory: Callable[[], Environment], tasks: Sequence[Task],
             rollout: RolloutConfig, *, n: int = 1, ks: Sequence[int] = (1,), seed: int = 0,
             renderer: Any = None, progress: Callable[[int], None] | None = None) -> tuple[dict[str, Any], list[Episode]]:
    """``n`` samples per task (temperature from ``rollout``); greedy when temperature is 0."""
    expanded = [t for t in tasks for _ in range(n)]
    episodes = run_rollouts(model, tokenizer, env_factory, expanded, rollout, seed=seed, renderer=renderer,
                            progress=progress)
    return summarize(episodes, ks=[k for k in ks if k <= n]), episodes


def write_eval(out_dir: str | Path, name: str, metrics: dict[str, Any], episodes: Sequence[Episode]) -> Path:
    """``{name}.json`` (metrics + per-episode trajectories) and ``{name}.episodes.jsonl`` (IR), atomically."""
    import json

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with AtomicJsonlWriter(out / f"{name}.episodes.jsonl", overwrite=True) as w:
        for e in episodes:
            w.write(e.trajectory)
    doc = {"metrics": metrics,
           "episodes": [e.trajectory.model_dump(mode="json", exclude_none=True) for e in episodes]}
    atomic_write_text(out / f"{name}.json", json.dumps(doc, indent=1, ensure_ascii=False))
    return out / f"{name}.json"


#: Episode token limit when neither --max-length nor the model says one.
FALLBACK_MAX_LENGTH = 4096


def model_context_length(name_or_path: str, tokenizer: Any) -> int | None:
    """The longest sequence the model takes: ``max_position_embeddings`` of its config (the base
    model's, for a LoRA adapter directory) and the tokenizer's ``model_max_length`` when that is a
    real number (tokenizers without one report ~1e30). ``None`` when neither is known."""
    import json

    from transformers import AutoConfig

    limits = []
    try:
        # an alias or a GGUF resolves to its local conversion: asking the hub for the alias's name
        # would cost retries offline (and could find a stranger's model of that name)
        source = resolve_model(name_or_path, notify=None).path
        adapter = Path(source) / "adapter_config.json"
        if adapter.exists():
            base = json.loads(adapter.read_text()).get("base_model_name_or_path")
            source = adapter_base(base, adapter).path if base else source
        limits.append(getattr(AutoConfig.from_pretrained(source), "max_position_embeddings", None))
    except (OSError, ValueError, ModelLoadError):  # an id that is not cached, an unknown architecture: no limit known
        pass
    limits.append(getattr(tokenizer, "model_max_length", None))
    sane = [n for n in limits if isinstance(n, int) and 0 < n < 10_000_000]
    return min(sane) if sane else None


def resolve_max_length(requested: int | None, context: int | None) -> tuple[int, str | None]:
    """The episode token limit to use, and a warning when the request had to be clamped.

    Policy: never above the model's context (a longer episode cannot be generated: every one would
    end with ``length`` after a turn); ``None`` means "the model's context"."""
    if context is None:
        return requested or FALLBACK_MAX_LENGTH, None
    if requested is None:
        return context, None
    if requested > context:
        return context, (f"--max-length {requested} is above the model's context length ({context} tokens); "
                         f"using {context}")
    return requested, None


def run_eval(settings: Any, *, out_dir: str | Path | None = None, resume: bool = False, overwrite: bool = False,
             quiet: bool = False, backend: Any = None) -> dict[str, Any]:
    """Load ``settings.model`` and run ``trajtune.eval.harness`` on it (the ``trajtune eval`` command).

    ``backend`` replaces the model (e.g. ``TextBackend(generate_fn)``); the model is then not loaded.
    With ``out_dir`` the episodes are appended as they finish and the results written atomically;
    an existing evaluation there is refused unless ``resume`` or ``overwrite``.
    """
    settings.validate()
    if settings.bayes_lora and backend is not None:
        raise UsageError("--bayes-lora runs the LoRA adapter locally; it cannot score an endpoint's episodes")
    suites = build_suites(settings)  # bad environment / category names fail here, before any loading or writing
    tok = None
    renderer = None
    if backend is None:
        tok = load_tokenizer(settings.model, settings.template)
        renderer = ChatRenderer(tok, settings.render_config())
        if settings.parser == "auto":  # the parser of the tool format the renderer writes calls in
            settings.parser = renderer.parser or "hermes"
        settings.max_length, warning = resolve_max_length(settings.max_length,
                                                          model_context_length(settings.model, tok))
        if warning:
            console.print(f"[yellow]warning:[/yellow] {warning}", highlight=False, soft_wrap=True)
    else:
        if settings.parser == "auto":
            settings.parser = "hermes"
        settings.max_length = settings.max_length or FALLBACK_MAX_LENGTH
    judge = None
    if settings.judge is not None:  # an unreachable endpoint fails here, before anything is written
        judge = make_judge(settings.judge, model=settings.judge_model or "default", rubric=settings.judge_rubric,
                           max_tokens=settings.judge_max_tokens or 256, workers=settings.workers,
                           device=settings.device)
    fresh = out_dir is not None and not Path(out_dir).exists()  # removed again if the model does not load
    store = EvalStore(out_dir, settings.as_dict(), resume=resume, overwrite=overwrite) if out_dir is not None else None
    for warning in store.warnings if store is not None else []:
        console.print(f"[yellow]warning:[/yellow] {warning}", highlight=False, soft_wrap=True)
    scorers: list[Any] = []
    try:
        if backend is None:
            try:
                # load_trained: a DualTune directory loads all its adapters
                model = to_device(load_trained(settings.model), settings.device)
            except BaseException:
                if fresh and store is not None:
                    store.close()
                    shutil.rmtree(out_dir, ignore_errors=True)
                    store = None
                raise
            if settings.bayes_lora:
                scorers.append(BayesLoRAScorer(model, renderer, settings.bayes_lora, seed=settings.seed))
            backend = HFBackend(model, tok, temperature=settings.temperature, top_p=settings.top_p,
                                max_new_tokens=settings.max_new_tokens, max_length=settings.max_length,
                                batch_size=settings.batch_size, parser=settings.parser, workers=settings.workers,
                                step_timeout_s=settings.step_timeout_s, renderer=renderer,
                                mask_observations_at=settings.mask_observations_at)
        total = sum(len(s.tasks) for s in suites) * settings.samples
        target = settings.env or settings.benchmark
        try:
            with bar(f"eval {target}", total, enabled=not quiet) as adv:
                return run_evaluation(settings, backend, store=store, progress=adv, suites=suites, judge=judge,
                                      scorers=scorers)
        except KeyboardInterrupt:
            if store is None:
                raise Interrupted("interrupted; nothing was stored (give --out DIR to make an evaluation "
                                  "resumable)") from None
            raise Interrupted(f"interrupted with {len(store.done)} of {total} episodes stored in {out_dir}; "
                              "continue with --resume") from None
    finally:
        if store is not None:
            store.close()
