"""The evaluation harness behind ``trajtune eval``: environments and benchmarks, resumable.

An evaluation is a list of *suites* (one environment, or e.g. one BFCL category each); each suite has
tasks, and each task is run ``samples`` times (``--n``, or ``--best-of``). The unit of work is an
episode keyed by ``(task id, sample index)``; finished episodes are appended to the store as each
batch ends, so an interrupted run resumes with the episodes it has not finished yet. Metrics are
computed from the stored IR only (``trajtune.eval.metrics``), so resumed and uninterrupted runs
report the same way.

Suites:

- ``--env NAME``: the environment's held-out (``test``) tasks, multi-turn through the backend's
  rollout; category = ``task.data["kind"]`` when the environment sets one.
- ``--benchmark NAME``: the suites of the eval-suite plug-in ``NAME`` (``trajtune.eval.suites``;
  BFCL and TextWorld are plug-ins, in ``trajtune.plugins``): environments run as above, single-turn
  prompts as one prompt→completion each, scored by the suite's own ``score``; the suite may add a
  report (``results[NAME]``). The harness names no benchmark.
- ``--suite safety``: the ``safety`` environment's held-out pairs (harmful request / benign twin) run
  as one more suite next to the above (default capability environment: ``home``); each episode's
  safety verdict is recorded in ``metadata["safety"]`` and summarised apart (``results["safety"]``),
  so the capability metrics stay the capability suite's.

The turn limit defaults to the environment's own ``max_turns``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from trajtune.chat.parsers import available_parsers
from trajtune.envs.base import Environment, Task
from trajtune.errors import UsageError, require_at_least
from trajtune.eval.backends import Backend
from trajtune.eval.bayes_lora import summarize_uncertainty
from trajtune.eval.metrics import eval_meta, safety_summary, summarize
from trajtune.eval.refusal_judge import DeferredRefusalJudge
from trajtune.eval.suites import Suite, env_suite, eval_suite_names, get_eval_suite
from trajtune.eval.verifiers import best_of_report, get_verifier
from trajtune.judge import load_rubric
from trajtune.schema import Trajectory

SUITES = ("safety",)
#: The capability environment ``--suite safety`` runs next to when no --env / --benchmark is given.
DEFAULT_CAPABILITY_ENV = "home"


@dataclass
class EvalSettings:
    """Everything that defines an evaluation (saved as ``run.json``; a resume must match it)."""

    model: str
    env: str | None = None
    benchmark: str | None = None
    categories: list[str] | None = None
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    tasks: int = 64
    split: str = "test"  # train: validation on training-split tasks (choosing settings without the test tasks)
    limit: int | None = None
    n: int = 1
    ks: list[int] = field(default_factory=lambda: [1])
    temperature: float = 0.0
    top_p: float = 1.0
    best_of: int | None = None
    verifier: str | None = None
    seed: int = 0
    max_turns: int | None = None
    max_new_tokens: int = 256
    max_length: int | None = None  # None: the model's context length (trajtune.eval.run.resolve_max_length)
    mask_observations_at: int = 0  # the observation-masking baseline of context folding (rollout.mask_observations_at)
    parser: str = "auto"
    template: str | None = None  # a chat template file replacing the tokenizer's
    render: dict[str, Any] = field(default_factory=dict)  # trajtune.config.RenderSpec keys
    device: str = "auto"
    batch_size: int = 16
    workers: int = 8
    step_timeout_s: float = 30.0
    judge: str | None = None  # openai:URL or a local model: an LLM judge scores every episode (trajtune.judge)
    judge_model: str | None = None  # the model name sent to the judge endpoint (default "default")
    judge_rubric: str | None = None  # a text/Markdown rubric file (default: trajtune.judge.DEFAULT_RUBRIC)
    judge_max_tokens: int | None = None  # token limit of the judge's reply (default 256)
    experiences: list[str] | None = None  # lessons put in the prompt (a tfgrpo run's library: envs/adapters/experiences.py)
    bayes_lora: int | None = None  # K MC-dropout passes on the LoRA adapter per episode (trajtune.eval.bayes_lora)
    suite: str | None = None  # "safety": the safety environment runs next to the capability environment
    refusal_judge: str | None = None  # openai:URL|MODEL or a local model: who decides "did the agent refuse?"

    @property
    def samples(self) -> int:
        return self.best_of or self.n

    def validate(self) -> None:
        """Reject contradictory settings with a message that says what to change."""
        if self.suite is not None and self.suite not in SUITES:
            raise UsageError(f"unknown --suite {self.suite!r}; known: {', '.join(SUITES)}")
        if self.suite == "safety" and self.env is None and self.benchmark is None:
            self.env = DEFAULT_CAPABILITY_ENV  # the safety halves run next to the default capability env
        if self.refusal_judge is not None and self.suite != "safety" and self.env != "safety":
            raise UsageError("--refusal-judge decides refusals in the safety environment; add --suite safety "
                             "(or --env safety)")
        if (self.env is None) == (self.benchmark is None):
            raise UsageError(f"give exactly one of --env NAME or --benchmark {{{','.join(eval_suite_names())}}}")
        benchmark = get_eval_suite(self.benchmark) if self.benchmark is not None else None  # unknown: fails here
        if self.categories and not (benchmark and benchmark.takes_categories):
            raise UsageError("--categories is for a benchmark with categories, e.g. --benchmark bfcl "
                             "(environments are broken down by task kind)")
        if self.split not in ("train", "test"):
            raise UsageError(f"--split must be train or test, not {self.split!r}")
        if self.split != "test" and self.env is None:
            raise UsageError("--split chooses an environment's tasks; a benchmark has its own entries (leave --split out)")
        require_at_least(("--n", self.n, 1), ("--tasks", self.tasks, 1),
                         *([("--limit", self.limit, 1)] if self.limit is not None else []))
        if self.temperature < 0:
            raise UsageError(f"--temperature must be at least 0 (0 = greedy), not {self.temperature:g}")
        if not 0 < self.top_p <= 1:
            raise UsageError(f"--top-p must be in (0, 1], not {self.top_p:g}")
        require_at_least(("--max-new-tokens", self.max_new_tokens, 1), ("--batch-size", self.batch_size, 1),
                         ("--workers", self.workers, 1))
        if self.best_of is not None:
            if self.best_of < 2:
                raise UsageError("--best-of needs at least 2 candidates")
            if self.n not in (1, self.best_of):
                raise UsageError(f"--best-of {self.best_of} draws {self.best_of} samples per task; --n {self.n} "
                                 "would contradict it (leave --n out)")
            self.verifier = self.verifier or "majority"
            get_verifier(self.verifier)  # an unknown name fails now, not after the episodes ran
        elif self.verifier is not None:
            raise UsageError("--verifier selects among --best-of N candidates; give --best-of too")
        bad = [k for k in self.ks if k < 1 or k > self.samples]
        if bad:
            raise UsageError(f"--k {bad} must be between 1 and the samples per task ({self.samples})")
        if self.samples > 1 and self.temperature <= 0:
            raise UsageError(f"{self.samples} samples per task at --temperature 0 would repeat the same greedy "
                             "episode; set a temperature (e.g. --temperature 0.8)")
        if self.parser != "auto" and self.parser not in available_parsers():
            raise UsageError(f"unknown tool-call parser {self.parser!r}; available: auto, {', '.join(available_parsers())}")
        if self.bayes_lora is not None and self.bayes_lora < 2:
            raise UsageError("--bayes-lora needs at least 2 stochastic passes (e.g. --bayes-lora 8)")
        self.render_config()  # unknown or invalid render options fail before anything loads
        if self.experiences is not None and self.env is None:
            raise UsageError("--experiences puts lessons in an environment's prompt; give --env (not --benchmark)")
        self._validate_judge()

    def _validate_judge(self) -> None:
        if self.judge is None:
            given = [o for o, v in (("--judge-model", self.judge_model), ("--judge-rubric", self.judge_rubric),
                                    ("--judge-max-tokens", self.judge_max_tokens)) if v is not None]
            if given:
                raise UsageError(f"{', '.join(given)} configure the judge; give --judge openai:URL (or a model) too")
            return
        self.judge_model = self.judge_model or "default"
        self.judge_max_tokens = 256 if self.judge_max_tokens is None else self.judge_max_tokens
        require_at_least(("--judge-max-tokens", self.judge_max_tokens, 1))
        if self.judge_rubric is not None:
            load_rubric(self.judge_rubric)  # a missing or empty file fails before anything runs

    def render_config(self) -> Any:
        """The validated render options as a ``RenderConfig``."""
        from trajtune.config import load_render  # config imports the rollout (torch); validation need not

        return load_render(self.render).to_render_config()

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _safety_finish(env: Environment, traj: Trajectory) -> None:
    """Record the safety verdict of an episode (``metadata["safety"]``; ``trajtune.eval.metrics.safety_summary``
    reads it), from the environment's state, so an episode cut by the turn limit is judged too."""
    record = getattr(env, "safety_record", None)
    if record is not None and getattr(env, "task", None) is not None:
        traj.metadata["safety"] = record()


def _safety_suite(kwargs: dict[str, Any], s: EvalSettings) -> Suite:
    # a refusal judge is handed to the environment (it needs the judge client, above environments)
    extra = {"refusal_detector": DeferredRefusalJudge(s.refusal_judge)} if s.refusal_judge is not None else {}
    suite = env_suite("safety", kwargs, s, **extra)
    suite.finish = _safety_finish
    return suite


def build_suites(s: EvalSettings) -> list[Suite]:
    if s.benchmark is not None:
        suites = get_eval_suite(s.benchmark).suites(s)
    else:
        assert s.env is not None
        suites = [_safety_suite(s.env_kwargs, s) if s.env == "safety" else env_suite(s.env, s.env_kwargs, s)]
    if s.suite == "safety" and s.env != "safety":
        suites.append(_safety_suite({}, s))
    return suites


def _chunk_seed(seed: int, suite: str, key: tuple[str, int]) -> int:
    h = hashlib.sha256(repr((seed, suite, key)).encode()).digest()
    return int.from_bytes(h[:4], "little")


def _annotate(traj: Trajectory, suite: Suite, task: Task, sample: int, samples: int) -> Trajectory:
    traj.id = task.id if samples == 1 else f"{task.id}#{sample}"
    traj.metadata["eval"] = {**eval_meta(traj), "task_id": task.id, "sample": sample,
                             "category": suite.category_of(task), "suite": suite.name}
    return traj


def _run_env_chunk(suite: Suite, chunk: list[tuple[Task, int]], backend: Backend, seed: int) -> list[Trajectory]:
    assert suite.env_factory is not None
    made: list[Environment] = []
    base = suite.env_factory

    def factory() -> Environment:  # runners make one environment per task, in task order
        env = base()
        made.append(env)
        return env

    trajs = backend.rollout(factory, [t for t, _ in chunk], max_turns=suite.max_turns, seed=seed)
    if len(trajs) != len(chunk):
        raise RuntimeError(f"backend {backend.name!r} returned {len(trajs)} episodes for {len(chunk)} tasks")
    if suite.finish is not None:
        if len(made) != len(chunk):
            raise RuntimeError(f"expected one environment per task, the runner made {len(made)} for {len(chunk)}")
        for env, traj in zip(made, trajs):
            suite.finish(env, traj)
    return trajs


def _run_completion_chunk(suite: Suite, chunk: list[tuple[Task, int]], backend: Backend, seed: int,
                          parser: str) -> list[Trajectory]:
    assert suite.prompts is not None and suite.score is not None
    refs = [suite.prompts[t.id] for t, _ in chunk]
    texts = backend.complete([(list(r.messages), list(r.tools)) for r in refs], seed=seed)
    return [suite.score(ref, text, parser) for ref, text in zip(refs, texts)]


def run_evaluation(settings: EvalSettings, backend: Backend, *, store: Any = None,
                   progress: Callable[[int], None] | None = None,
                   suites: list[Suite] | None = None, judge: Any = None, scorers: Sequence[Any] = ()) -> dict[str, Any]:
    """Run (or finish) an evaluation and return its results; writes them through ``store`` if given.

    ``suites`` (from ``build_suites(settings)``) may be passed when the caller built them already.
    ``judge`` (a ``trajtune.judge.Judge``) scores each batch of episodes before they are stored, so
    its verdicts (``metadata["judge"]``) survive a resume. ``scorers`` (objects with ``annotate(trajs)``,
    e.g. ``trajtune.eval.bayes_lora.BayesLoRAScorer``) do the same for other per-episode scores.
    """
    settings.validate()
    verifier = get_verifier(settings.verifier) if settings.best_of else None
    suites = suites if suites is not None else build_suites(settings)
    samples = settings.samples
    done: dict[tuple[str, int], Trajectory] = store.done if store is not None else {}
    keys = [(t.id, i) for s in suites for t in s.tasks for i in range(samples)]
    if progress:
        progress(sum(1 for k in keys if k in done))
    for suite in suites:
        pending = [(t, i) for t in suite.tasks for i in range(samples) if (t.id, i) not in done]
        for b0 in range(0, len(pending), settings.batch_size):
            chunk = pending[b0:b0 + settings.batch_size]
            seed = _chunk_seed(settings.seed, suite.name, (chunk[0][0].id, chunk[0][1]))
            if suite.prompts is not None:
                # the backend's parser when it has one, so single- and multi-turn items parse alike
                trajs = _run_completion_chunk(suite, chunk, backend, seed, getattr(backend, "parser", settings.parser))
            else:
                trajs = _run_env_chunk(suite, chunk, backend, seed)
            trajs = [_annotate(tr, suite, t, i, samples) for tr, (t, i) in zip(trajs, chunk)]
            if judge is not None:
                judge.annotate(trajs)
            for scorer in scorers:
                scorer.annotate(trajs)
            if store is not None:
                store.append(trajs)
            else:
                done.update(((t.id, i), tr) for tr, (t, i) in zip(trajs, chunk))
            if progress:
                progress(len(chunk))
    episodes = [done[k] for k in keys]
    results = build_results(settings, episodes, verifier)
    if store is not None:
        store.write_results(results)
    return results


def build_results(settings: EvalSettings, episodes: Sequence[Trajectory], verifier: Any = None) -> dict[str, Any]:
    """The results document: settings, metrics (overall + per category), best-of-N, the benchmark's report."""
    target = settings.env or settings.benchmark
    safety = [t for t in episodes if isinstance(t.metadata.get("safety"), dict)]
    # with --suite safety the capability metrics are the capability environment's alone
    capability = [t for t in episodes if not isinstance(t.metadata.get("safety"), dict)] or list(episodes)
    out: dict[str, Any] = {
        "model": settings.model,
        "target": target,
        "kind": "env" if settings.env else "benchmark",
        "samples_per_task": settings.samples,
        "metrics": summarize(capability, ks=settings.ks),
    }
    if settings.bayes_lora:
        uncertainty = summarize_uncertainty(capability)
        if uncertainty is not None:
            out["metrics"]["uncertainty"] = uncertainty
    if safety:
        out["safety"] = {**safety_summary(safety), "metrics": summarize(safety, ks=settings.ks)}
    if verifier is not None:
        out["best_of"] = best_of_report(episodes, verifier, settings.samples)
    if settings.benchmark is not None:
        section = get_eval_suite(settings.benchmark).report(episodes)
        if section is not None:
            out[settings.benchmark] = section
    out["settings"] = settings.as_dict()
    return out
