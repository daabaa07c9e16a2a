"""The ``tfgrpo`` algorithm: training-free GRPO. The model stays frozen; a library of lessons grows.

Why: a model that cannot (or should not) be trained can still get better at an environment if its
prompt carries what worked and what did not. Each step samples ``group_size`` episodes of
``tasks_per_step`` tasks (the lessons already in the prompt, at ``tfgrpo.temperature``), keeps the
groups whose mean reward is strictly between 0 and 1 (all-success and all-failure groups hold no
contrast), has an LLM summarise every episode of a kept group and then compare the group, proposing
at most ``max_lessons_per_group`` lessons as operations on the library (ADD, UPDATE, DELETE, NONE).
All groups' operations of one step are merged at once (``merge_ops``) and the ids re-indexed G0, G1, ...

It is an algorithm like the others: ``trajtune.train.run`` gives it the run directory, resume, the
progress bar and result.json. Its experience source hands the learner no trajectories, so the learner
makes no update (the weights stay bit-for-bit the starting ones); the objective is never called.

The LLM is the policy itself (greedy, through the code ``trajtune serve`` runs) or any endpoint or
local model ``eval --judge`` accepts, asked through ``judge.ask``. Replies are read with ``json``
(the first JSON list or object in the text); a reply without one, or a failed request, counts in
``llm_failures`` as "no operations" and never stops the run.

The library after every step is a line of ``experiences.jsonl`` (trimmed on resume like the other
step logs, so a resumed run continues from the library of its checkpoint's step) and the current one
is ``experiences.json`` (written atomically); ``trajtune eval --experiences RUN_DIR`` puts it in the
prompt with the same function the rollouts used (``envs.adapters.experiences``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from trajtune import rollout as agent_loop  # by module: tests replace agent_loop.run_rollouts
from trajtune import distributed as dist
from trajtune.algorithms.registry import Algorithm, Recipe, RunContext, register_algorithm
from trajtune.algorithms.rl import episode_writer
from trajtune.config import EnvRunBase, _C
from trajtune.envs.adapters.experiences import EXPERIENCES_FILE, WithExperiences
from trajtune.envs.adapters.openai_policy import endpoint_policy
from trajtune.envs.registry import make_env
from trajtune.errors import ConfigError
from trajtune.experience import pick_tasks
from trajtune.judge import ask, make_judge, render_episode
from trajtune.schema import Message, atomic_write_text
from trajtune.serve import ChatService

SUMMARY_PROMPT = """\
You review one attempt of an AI agent at a task. In two to four sentences, say what the agent did,
step by step, and which of its actions helped or hurt the result. Reply with plain text only."""

CONTRAST_PROMPT = """\
You compare several attempts of an AI agent at the same task, each with its reward (higher is
better), and keep a library of short, general lessons that help the agent on tasks like this one.
Find what the better attempts did that the worse ones did not, and propose at most {k} lesson(s) as
operations on the library:
  {{"op": "ADD", "text": "<new lesson>"}}
  {{"op": "UPDATE", "id": "G<n>", "text": "<better wording of lesson G<n>>"}}
  {{"op": "DELETE", "id": "G<n>"}}   (a lesson that is wrong or misleading)
  {{"op": "NONE"}}                   (nothing to learn)
A lesson is one sentence an agent can act on, without details of this particular task.
Reply with only a JSON list of operations."""

#: Longest text kept of one summary / one lesson.
MAX_SUMMARY_CHARS = 1500
MAX_LESSON_CHARS = 500

OpName = Literal["ADD", "UPDATE", "DELETE", "NONE"]


class TFGRPOSpec(_C):
    tasks_per_step: int = Field(8, gt=0, description="tasks sampled per step (one group each)")
    group_size: int = Field(5, gt=1, description="G: episodes sampled per task; the LLM contrasts the group")
    n_train_tasks: int = Field(64, gt=0, description="training tasks drawn from the environment, cycled over the "
                                                     "steps (epochs = train.steps × tasks_per_step / n_train_tasks)")
    temperature: float = Field(0.7, gt=0, description="sampling temperature of the rollouts (the LLM's own "
                                                      "requests are greedy)")
    max_lessons_per_group: int = Field(2, gt=0, description="ADD/UPDATE operations kept per group at most (the "
                                                            "first ones the LLM proposes)")
    llm: str = Field("policy", description="who summarises and proposes lessons: policy (the frozen model itself, "
                                           "greedy), openai:URL (an OpenAI-compatible endpoint) or a local model "
                                           "(alias, path, HF id), as for `trajtune eval --judge`")
    llm_model: str = Field("default", description="with llm: openai:URL, the model name sent to the endpoint")
    max_tokens: int = Field(256, gt=0, description="tokens the LLM may answer one request with")
    workers: int = Field(4, gt=0, description="LLM requests in flight at once")

    @model_validator(mode="after")
    def _no_ops(self) -> "TFGRPOSpec":
        if "llm_model" in self.non_default() and not self.llm.startswith("openai:"):
            raise ValueError("tfgrpo.llm_model only applies to llm: openai:URL")
        return self


#: train.* settings that mean something without weight updates.
_TRAIN_KEYS = {"steps", "save_every", "keep_last"}


class TFGRPORunConfig(EnvRunBase):
    """``algorithm: tfgrpo``: training-free GRPO (a lesson library in the prompt; no weight update)."""

    algorithm: Literal["tfgrpo"] = Field("tfgrpo", description="training-free GRPO: learn prompt lessons, "
                                                               "not weights")
    tfgrpo: TFGRPOSpec = Field(default_factory=TFGRPOSpec, description="groups, the lesson LLM and its limits")

    @model_validator(mode="after")
    def _no_ops(self) -> "TFGRPORunConfig":
        unused = sorted(self.train.non_default() - _TRAIN_KEYS)
        if unused:
            raise ValueError(f"train.{unused[0]} does nothing in tfgrpo (no weight is updated); only train.steps, "
                             "train.save_every and train.keep_last apply")
        if self.model.lora is not None:
            raise ValueError("model.lora does nothing in tfgrpo (no weight is updated); remove it")
        if self.eval is not None:
            raise ValueError("eval: is not supported by tfgrpo (it would evaluate without the lessons); after the "
                             "run, evaluate with `trajtune eval --model MODEL --env ENV --experiences OUTPUT_DIR`")
        if "temperature" in self.rollout.non_default():
            raise ValueError("rollout.temperature is not used by tfgrpo; set tfgrpo.temperature")
        if self.rollout.ray is not None:
            raise ValueError("rollout.ray is not supported by tfgrpo; remove it")
        return self


# ---------------------------------------------------------------------------------------------
# the library and its operations


@dataclass(frozen=True)
class Op:
    op: OpName
    id: int | None = None  # the library index (G<id>) of UPDATE and DELETE
    text: str | None = None  # the lesson of ADD and UPDATE


def lesson_ids(library: Sequence[str]) -> dict[str, str]:
    """The library as it is saved and shown to the LLM: {"G0": lesson, "G1": ...}."""
    return {f"G{i}": text for i, text in enumerate(library)}


def merge_ops(library: Sequence[str], ops: Sequence[Op]) -> list[str]:
    """One step's operations applied together; the result is re-indexed from G0.

    DELETE wins over UPDATE of the same id (whatever their order); of several UPDATEs of one id the
    last wins; an UPDATE of an id the library does not have is an ADD; ADDs (and those UPDATEs) are
    appended in order, leaving out a text the library already holds."""
    n = len(library)
    deleted = {o.id for o in ops if o.op == "DELETE" and o.id is not None and 0 <= o.id < n}
    updated: dict[int, str] = {}
    added: list[str] = []
    for o in ops:
        if o.op == "UPDATE" and o.id is not None and 0 <= o.id < n:
            if o.id not in deleted and o.text:
                updated[o.id] = o.text
        elif o.op in ("ADD", "UPDATE") and o.text:
            added.append(o.text)
    kept = [updated.get(i, text) for i, text in enumerate(library) if i not in deleted]
    for text in added:
        if text not in kept:
            kept.append(text)
    return kept


def _op_id(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        v = value.strip()
        v = v[1:] if v[:1] in ("G", "g") else v
        return int(v) if v.isdigit() else None
    return None


def _one_op(item: Any) -> Op | None:
    """An operation from one JSON item; None when it is not one (unknown op, missing id or text)."""
    if not isinstance(item, dict):
        return None
    name = item.get("op", item.get("operation"))
    if not isinstance(name, str) or name.strip().upper() not in ("ADD", "UPDATE", "DELETE", "NONE"):
        return None
    name = name.strip().upper()
    text = item.get("text", item.get("lesson", item.get("content")))
    text = text.strip()[:MAX_LESSON_CHARS] if isinstance(text, str) and text.strip() else None
    op_id = _op_id(item.get("id"))
    if name in ("ADD", "UPDATE") and text is None:
        return None
    if name in ("UPDATE", "DELETE") and op_id is None:
        return None
    return Op(name, op_id if name != "ADD" else None, text if name != "DELETE" else None)  # type: ignore[arg-type]


def _json_values(text: str) -> list[Any]:
    """Every JSON list or object that starts at a ``[`` or ``{`` in ``text``, in order (not nested ones)."""
    dec = json.JSONDecoder()
    out, i = [], 0
    while True:
        starts = [j for j in (text.find("[", i), text.find("{", i)) if j >= 0]
        if not starts:
            return out
        i = min(starts)
        try:
            value, end = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            i += 1
            continue
        out.append(value)
        i = end


def parse_ops(text: str) -> list[Op]:
    """The operations of an LLM reply: a JSON list of {"op", "id", "text"} (alone, fenced or within other
    text), or an object holding one under "operations"/"ops", or a single operation object. Items that
    are not operations are left out; ValueError when the reply holds no such list or object, or only
    items that are not operations."""
    for value in _json_values(text or ""):
        if isinstance(value, dict):
            inner = value.get("operations", value.get("ops"))
            value = inner if isinstance(inner, list) else [value] if "op" in value or "operation" in value else None
        if isinstance(value, list) and (not value or any(isinstance(x, dict) for x in value)):
            ops = [o for o in map(_one_op, value) if o is not None]
            if value and not ops:
                raise ValueError(f"no valid operation in the reply: {json.dumps(value)[:120]}")
            return [o for o in ops if o.op != "NONE"]
    raise ValueError(f"no JSON list of operations in the reply: {(text or '')[:120]!r}")


def cap_lessons(ops: Sequence[Op], k: int) -> list[Op]:
    """At most ``k`` ADD/UPDATE operations (the first ones); DELETEs are kept."""
    out, n = [], 0
    for o in ops:
        if o.op in ("ADD", "UPDATE"):
            if n >= k:
                continue
            n += 1
        out.append(o)
    return out


def keep_group(rewards: Sequence[float]) -> bool:
    """A group teaches something only when some episodes did better than others: mean strictly in (0, 1)."""
    mean = sum(rewards) / len(rewards) if rewards else 0.0
    return 0.0 < mean < 1.0


# ---------------------------------------------------------------------------------------------
# the experience source


Ask = Callable[[list[Message]], str]  # messages -> reply text; ValueError when there is no reply


def _reward(episode: Any) -> float:
    r = episode.tokens.reward if episode.tokens is not None else episode.trajectory.reward
    return float(r or 0.0)


@dataclass
class LessonSource:
    """Each step: rollouts with the current lessons, then the LLM's operations merged into the library.
    Returns no trajectories, so the learner makes no update."""

    tokenizer: Any
    env_factory: Callable[[], Any]
    tasks: list[Any]
    rollout: Any  # rollout.RolloutConfig (at tfgrpo.temperature)
    spec: TFGRPOSpec
    ask: Ask
    seed: int = 0
    renderer: Any = None
    out: Path | None = None
    on_episodes: Callable[[int, list[Any]], None] | None = None
    library: list[str] = field(default_factory=list)

    def factory(self) -> Callable[[], Any]:
        """Environments whose prompt carries the library as it is at the start of the step."""
        lessons, base = list(self.library), self.env_factory
        return lambda: WithExperiences(base(), lessons)

    def batch(self, step: int, model: Any) -> tuple[list[Any], dict[str, float]]:
        s = self.spec
        tasks = pick_tasks(self.tasks, step, 0, s.tasks_per_step, self.seed)
        episodes = agent_loop.run_rollouts(model, self.tokenizer, self.factory(),
                                           [t for t in tasks for _ in range(s.group_size)], self.rollout,
                                           seed=self.seed * 1_000_003 + step, renderer=self.renderer)
        if self.on_episodes is not None:
            self.on_episodes(step, episodes)
        groups = [episodes[i * s.group_size:(i + 1) * s.group_size] for i in range(len(tasks))]
        ops, metrics = self.propose(groups)
        self.library = merge_ops(self.library, ops)
        self.save(step + 1, ops)
        rewards = [_reward(e) for e in episodes]
        success = [bool(e.trajectory.outcome and e.trajectory.outcome.success) for e in episodes]
        return [], {"reward": sum(rewards) / len(rewards), "success": sum(success) / len(success),
                    **metrics, "lessons": float(len(self.library))}

    # -- the LLM -----------------------------------------------------------------------------
    def _summary(self, episode: Any) -> str | None:
        msgs = [Message(role="system", content=SUMMARY_PROMPT),
                Message(role="user", content=f"{render_episode(episode.trajectory)}\n\n## Reward\n{_reward(episode):g}")]
        try:
            text = self.ask(msgs).strip()
        except ValueError:
            return None
        return text[:MAX_SUMMARY_CHARS] or None

    def _contrast(self, group: list[Any], summaries: list[str | None]) -> list[Op] | None:
        task = next((m.text() for m in group[0].trajectory.messages if m.role == "user"), "") or ""
        lib = "\n".join(f"{k}. {v}" for k, v in lesson_ids(self.library).items()) or "(none yet)"
        attempts = [f"### Attempt {i} (reward {_reward(e):g})\n{text or '(no summary)'}"
                    for i, (e, text) in enumerate(zip(group, summaries), 1)]
        user = "\n\n".join(["## Task", task[:2000], "## Current lessons", lib, "## Attempts", *attempts])
        msgs = [Message(role="system", content=CONTRAST_PROMPT.format(k=self.spec.max_lessons_per_group)),
                Message(role="user", content=user)]
        try:
            return cap_lessons(parse_ops(self.ask(msgs)), self.spec.max_lessons_per_group)
        except ValueError:
            return None

    def propose(self, groups: list[list[Any]]) -> tuple[list[Op], dict[str, float]]:
        """The operations all kept groups propose (against the library as it is now) and counts."""
        kept = [g for g in groups if keep_group([_reward(e) for e in g])]
        with ThreadPoolExecutor(max_workers=self.spec.workers) as pool:
            flat = list(pool.map(self._summary, [e for g in kept for e in g]))
            per_group = [flat[i * self.spec.group_size:(i + 1) * self.spec.group_size] for i in range(len(kept))]
            proposed = list(pool.map(self._contrast, kept, per_group))
        ops = [o for got in proposed if got is not None for o in got]
        failures = sum(s is None for s in flat) + sum(p is None for p in proposed)
        return ops, {"groups_kept": float(len(kept)), "groups_skipped": float(len(groups) - len(kept)),
                     "ops": float(len(ops)), "llm_failures": float(failures)}

    # -- the run directory -------------------------------------------------------------------
    def save(self, step: int, ops: Sequence[Op] = ()) -> None:
        """The library after ``step``: a line of experiences.jsonl, and experiences.json (atomic)."""
        if self.out is None:
            return
        lib = lesson_ids(self.library)
        with (self.out / "experiences.jsonl").open("a", encoding="utf-8") as f:
            f.write(json.dumps({"step": step, "experiences": lib,
                                "ops": [{k: v for k, v in o.__dict__.items() if v is not None} for o in ops]},
                               ensure_ascii=False) + "\n")
        self.write_current(step)

    def write_current(self, step: int) -> None:
        if self.out is not None:
            atomic_write_text(self.out / EXPERIENCES_FILE, json.dumps(
                {"step": step, "experiences": lesson_ids(self.library)}, indent=1, ensure_ascii=False))

    def restore(self, step: int) -> None:
        """Continue from the library after ``step`` (experiences.jsonl is already trimmed to it)."""
        self.library = []
        path = self.out / "experiences.jsonl" if self.out is not None else None
        if path is not None and path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    rec = json.loads(line)
                    if rec.get("step", 0) <= step:
                        self.library = list(rec.get("experiences", {}).values())
        self.write_current(step)


class NoUpdate:
    """The objective of a run without weight updates: the source never hands the learner a batch."""

    name = "none"

    def denominator(self, batch: Any) -> float:
        return 0.0

    def loss_sum(self, model: Any, batch: Any) -> Any:
        raise RuntimeError("tfgrpo makes no weight update; its experience source returns no trajectories")


# ---------------------------------------------------------------------------------------------
# the recipe


def _prepare(cfg: TFGRPORunConfig, ctx: RunContext) -> Any:
    if dist.world_size() > 1:
        raise ConfigError(f"tfgrpo with {dist.world_size()} processes is not supported (there is nothing to train "
                          "in parallel); launch a single process")
    make_env(cfg.env.name, **cfg.env.kwargs)  # fail fast on an unknown environment (EnvError)
    if cfg.tfgrpo.llm.startswith("openai:"):  # an unreachable endpoint is refused before anything is written

        endpoint_policy(cfg.tfgrpo.llm, cfg.tfgrpo.llm_model, option="tfgrpo.llm")
    return None


def make_ask(spec: TFGRPOSpec, ctx: RunContext) -> Ask:
    """The lesson LLM: the policy answered in-process (greedy), or ``judge.make_judge``'s backend."""
    if spec.llm == "policy":
        complete, model = ChatService(ctx.model, ctx.tokenizer, ctx.renderer, name="policy",
                                      max_tokens=spec.max_tokens).complete, "policy"
    else:
        judge = make_judge(spec.llm, model=spec.llm_model, max_tokens=spec.max_tokens, workers=spec.workers)
        complete, model = judge.complete, judge.model
    return lambda messages: ask(complete, model, messages, spec.max_tokens)


def _build(cfg: TFGRPORunConfig, ctx: RunContext, prepared: Any) -> Recipe:
    from dataclasses import replace

    assert ctx.out is not None
    s = cfg.tfgrpo
    tasks = make_env(cfg.env.name, **cfg.env.kwargs).tasks("train", s.n_train_tasks, seed=cfg.seed)
    source = LessonSource(ctx.tokenizer, cfg.rollout.env_factory(cfg.env), tasks,
                          replace(cfg.rollout.to_config(), temperature=s.temperature), s, make_ask(s, ctx),
                          seed=cfg.seed, renderer=ctx.renderer, out=ctx.out,
                          on_episodes=episode_writer(ctx.out / "rollouts.jsonl"))
    if not (ctx.out / EXPERIENCES_FILE).exists():
        source.write_current(0)
    return Recipe(source=source, objective=NoUpdate(), micro_batch_size=cfg.train.micro_batch_size,
                  step_logs=[ctx.out / "rollouts.jsonl", ctx.out / "experiences.jsonl"],
                  result={"experiences": str(ctx.out / EXPERIENCES_FILE)}, shown=("reward", "lessons"),
                  plot=("reward.png", ("reward", "success", "lessons"), "Training-free GRPO"),
                  on_resume=source.restore)


register_algorithm(Algorithm("tfgrpo", TFGRPORunConfig, "training-free GRPO: a library of prompt lessons, no "
                             "weight update", _prepare, _build))
