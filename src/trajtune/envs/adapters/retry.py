"""``retry``: a failed attempt is not the end — feedback, an optional reflection, and another try.

Why: trained self-correction (Reflect, Retry, Reward, Bensal et al. 2025; RISE, Qu et al. 2024)
needs episodes in which the model learns that it failed, says what went wrong, and tries again;
evaluating it needs first- and second-attempt success on the same tasks. This wrapper turns any
environment whose episodes end with a verdict into such episodes, without touching the inner one:

1. the agent attempts the task as usual;
2. when the inner episode ends without success and attempts are left, the wrapper answers with a
   user message (``feedback``: ``binary`` says only that the attempt failed, as the paper's
   verifier does; ``detail`` adds the inner verdict's own words, ``info["detail"]``, which for some
   environments names the expected value);
3. with ``reflect: true`` that message asks for a short reflection and the agent's next turn is
   taken as the reflection whatever it contains (tool calls in it are not executed); the wrapper
   then asks for the retry;
4. the inner environment is reset to the same task, and the retry is played and judged as a fresh
   attempt, with the whole conversation so far in the agent's context.

``inject_error`` replaces the result of the first attempt's first tool call with a transient tool
error (``ERROR_TEXT``) on a seeded share of the tasks: the call is not executed, the episode goes on,
and an agent that recovers calls again. It measures recovery after a tool failure.

A retried attempt earns no reward (what it would have earned stays in ``info["failed_attempt"]``), so
an episode's reward is its last attempt's.

Every message the wrapper adds carries ``extra["retry"]``: ``reflect`` (the feedback with the
reflection request), ``retry`` (the feedback or the reflection's answer, with "try again") or
``injected_error``. The trajectory alone then says what happened: ``eval.metrics.retry_summary``
counts first- and later-attempt success from it, and ``rl.train_turns`` finds the reflection turn by
it (``algorithms.self_correction``).
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from trajtune.envs.base import Environment, ResetResult, StepResult, Task
from trajtune.schema import Message, Trajectory

#: ``Message.extra`` key of every message the wrapper adds.
RETRY_KEY = "retry"

FAILED_TEXT = "Your answer was not correct."
REFLECT_TEXT = ("Before you try again, reflect in two or three sentences: what went wrong, and what will you do "
                "differently? Write only the reflection; do not call a tool yet.")
RETRY_TEXT = "Now try again."
ERROR_TEXT = "Error: the service is temporarily unavailable (timeout). Please try the call again."


class RetryOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    retries: int = Field(1, ge=0, le=4, description="attempts after the first (0: only inject_error applies)")
    reflect: bool = Field(True, description="ask for a reflection turn before each retry")
    feedback: Literal["binary", "detail"] = Field(
        "binary", description="what the failed attempt is told: binary (only that it failed) or detail (the "
                              "inner environment's info['detail'] as well, which may name the expected value)")
    inject_error: float = Field(0.0, ge=0.0, le=1.0, description="share of tasks (seeded by task) whose first "
                                                                 "tool call gets a transient tool error instead of "
                                                                 "its result")


def _added(role: str, text: str, kind: str, **fields: Any) -> Message:
    return Message(role=role, content=text, origin="environment", extra={RETRY_KEY: kind}, **fields)  # type: ignore[arg-type]


def retry_marks(traj: Trajectory) -> list[str]:
    """The wrapper's marks on an episode's messages, in order (``reflect``, ``retry``, ``injected_error``)."""
    return [str(m.extra[RETRY_KEY]) for m in traj.messages if isinstance(m.extra.get(RETRY_KEY), str)]


def from_retry(traj: Trajectory) -> bool:
    """Whether an episode was played through the wrapper (its environment name, or its marks)."""
    return str(traj.metadata.get("env", "")).startswith("retry(") or bool(retry_marks(traj))


def attempts(traj: Trajectory) -> int:
    """How many attempts an episode made (1 + the wrapper's requests to try again)."""
    return 1 + retry_marks(traj).count("retry")


def injected(task: Task, share: float) -> bool:
    """Whether ``task`` gets the injected tool error (a hash of its id and seed, so every run and
    every sample of the task agree)."""
    if share <= 0:
        return False
    h = hashlib.sha256(f"inject|{task.id}|{task.seed}".encode()).digest()
    return int.from_bytes(h[:8], "little") / 2**64 < share


class RetryEnv(Environment):
    """Any environment, with feedback and another attempt after a failed one (module doc)."""

    def __init__(self, inner: Environment, options: RetryOptions):
        self.inner, self.options = inner, options
        self.name = f"retry({inner.name})"
        self.description = f"{inner.description} (with {options.retries} retr{'y' if options.retries == 1 else 'ies'})"
        per_attempt = getattr(inner, "max_turns", 8) + (1 if options.inject_error > 0 else 0)
        self.max_turns = per_attempt * (options.retries + 1) + (options.retries if options.reflect else 0)
        self.deterministic = inner.deterministic and options.inject_error == 0
        self.reward_terms = tuple(getattr(inner, "reward_terms", ()))
        self.install = getattr(inner, "install", "")
        self.task: Task | None = None

    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        return self.inner.tasks(split, n, seed)

    def splits(self) -> dict[str, int] | None:
        return self.inner.splits()

    def reset(self, task: Task) -> ResetResult:
        self.task = task
        self.attempt = 1
        self.phase = "act"  # act | reflect
        self.pending_error = injected(task, self.options.inject_error)
        return self.inner.reset(task)

    def step(self, action: Message) -> StepResult:
        if self.task is None:
            raise RuntimeError("step() before reset()")
        if self.phase == "reflect":  # the reflection: not executed; the inner world starts the task afresh
            self.phase = "act"
            return StepResult([_added("user", RETRY_TEXT, "retry")], info=self._next_attempt({}))
        calls = action.tool_calls or []
        if self.pending_error and calls:  # the first call of the first attempt fails in transit
            self.pending_error = False
            return StepResult([_added("tool", ERROR_TEXT, "injected_error", tool_call_id=c.id, name=c.name)
                               for c in calls], info={"attempt": self.attempt, "injected_error": True})
        out = self.inner.step(action)
        out.info = {**out.info, "attempt": self.attempt}
        failed = out.done and out.termination in (None, "done") and not self.inner.success()
        if not failed or self.attempt > self.options.retries:
            return out
        # Retried: the episode's reward is its last attempt's, so this one earns nothing (what it
        # would have earned stays in info for the record).
        info = {k: v for k, v in out.info.items() if k != "reward_terms"}
        info["failed_attempt"] = {"reward": out.reward, "reward_terms": out.info.get("reward_terms")}
        text = FAILED_TEXT
        detail = out.info.get("detail")
        if self.options.feedback == "detail" and isinstance(detail, str) and detail:
            text = f"{text} {detail}."
        obs = list(out.observations)
        if self.options.reflect:
            self.phase = "reflect"
            obs.append(_added("user", f"{text} {REFLECT_TEXT}", "reflect"))
            return StepResult(obs, info=info)
        obs.append(_added("user", f"{text} {RETRY_TEXT}", "retry"))
        return StepResult(obs, info=self._next_attempt(info))

    def _next_attempt(self, info: dict[str, Any]) -> dict[str, Any]:
        """Start the next attempt: the inner environment resets to the same task; its tools (the
        rollout takes a changed list from ``info["tools"]``) go into ``info``, which is returned."""
        assert self.task is not None
        self.attempt += 1
        res = self.inner.reset(self.task)
        if res.tools:
            info["tools"] = res.tools
        return info

    def success(self) -> bool:
        return self.inner.success()

    def render(self) -> str:
        return f"[attempt {getattr(self, 'attempt', 1)}] {self.inner.render()}"

    def __getattr__(self, name: str) -> Any:  # environment-specific attributes (a benchmark's failure record)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

