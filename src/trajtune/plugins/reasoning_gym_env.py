"""reasoning-gym's procedural tasks as a trajtune ``Environment`` (optional extra ``reasoning-gym``).

reasoning-gym (``pip install reasoning-gym``) ships about a hundred task generators (arithmetic,
algebra, logic puzzles, graph and string tasks), each with its own verifier (``score_answer``).
Why a plug-in: its tasks are single-turn and verifiable, which is what GRPO-style training on
answers needs, and the package already decides what a right answer is; trajtune only adapts it.

A task is one generated entry: ``create_dataset(dataset, seed=task_seed, size=1, **config)[0]``.
Task seeds come from ``split_task_seed``, even for train and odd for test, so the two splits never
draw an entry from the same seed. They can still draw the same *question* when a generator's task
space is small (e.g. one-digit sums): ``split_overlap`` counts that, and the benchmark reports it.

The agent answers in text, with the answer between ``<answer>`` and ``</answer>`` (the package's
own convention and its ``extract_answer``); the last such block counts. The reward is the
package's score of that answer (some generators give partial credit in [0, 1]); success is a score
of 1. A reply without the tags scores 0 and is reported as ``answer_check: no_answer_tag``; a tool
call (no tools are offered) as ``answer_check: tool_call``. Reward terms: ``answer_format`` (the
tags are there) and ``answer_score``.

The entry is regenerated from its seed in ``reset`` rather than stored in the task: entries'
metadata (which ``score_answer`` reads) may hold values that JSON cannot carry.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from trajtune.envs.base import Environment, ResetResult, StepResult, Task, parse_env_options
from trajtune.envs.toolenv import split_task_seed
from trajtune.errors import EnvError
from trajtune.plugins import require
from trajtune.schema import Message, Trajectory

INSTALL_HINT = "pip install 'trajtune[reasoning-gym]'  (or: pip install 'reasoning-gym>=0.1.25,<0.1.26')"

Prompt = Literal["direct", "simple", "default", "chain_of_draft", "DeepSeekZero"]


class ReasoningGymNotInstalledError(EnvError, ImportError):
    """The optional ``reasoning_gym`` package is missing."""


class ReasoningGymOptions(BaseModel):
    """Options of the ``reasoning_gym`` environment."""

    model_config = ConfigDict(extra="forbid")

    dataset: str = Field("basic_arithmetic", description="the generator's name (reasoning_gym.factory.DATASETS, "
                                                         "e.g. basic_arithmetic, chain_sum, letter_counting)")
    config: dict[str, Any] = Field(default_factory=dict, description="the generator's own settings (its config "
                                   "dataclass's fields, e.g. {min_terms: 2, max_terms: 2} for basic_arithmetic)")
    prompt: Prompt = Field("direct", description="which of reasoning-gym's system prompts opens the episode "
                           "(direct: the answer only, in <answer> tags; simple/default/...: step-by-step first)")
    system_prompt: bool = Field(True, description="open with that system prompt (false: the question only; the "
                                "answer tags must then come from training)")


def _rg() -> Any:
    return require("reasoning_gym", ReasoningGymNotInstalledError, "the reasoning_gym environment", INSTALL_HINT)


def _entry(dataset: str, config: dict[str, Any], seed: int) -> tuple[Any, dict[str, Any]]:
    """The generator for ``seed`` and its one entry; a bad name or setting is an ``EnvError``."""
    rg = _rg()
    try:
        ds = rg.create_dataset(dataset, seed=seed, size=1, **config)
    except ValueError as e:  # an unknown name ("Dataset 'x' not registered") or a setting its config refuses
        from reasoning_gym.factory import DATASETS

        hint = "" if dataset in DATASETS else f"; known: {', '.join(sorted(DATASETS))}"
        raise EnvError(f"reasoning_gym dataset {dataset!r}: {e}{hint}") from None
    except (TypeError, AssertionError) as e:  # a setting its config dataclass does not have, or refuses
        raise EnvError(f"reasoning_gym dataset {dataset!r} rejected config {config}: {e}") from None
    return ds, ds[0]


class ReasoningGymEnv(Environment):
    """One reasoning-gym question, one answer in ``<answer>`` tags, scored by the package."""

    name = "reasoning_gym"
    description = ("reasoning-gym's procedural tasks (about 100 generators) with the package's verifiers: answer "
                   "in <answer> tags; options dataset, config, prompt (extra: reasoning-gym).")
    max_turns = 1
    deterministic = True  # the entry is a function of its seed, the score of the answer
    options_model = ReasoningGymOptions
    install = INSTALL_HINT
    reward_terms = ("answer_format", "answer_score")

    def __init__(self, **options: Any) -> None:
        self.options = parse_env_options(ReasoningGymOptions, "reasoning_gym", options)
        _entry(self.options.dataset, self.options.config, 0)  # fail now on a missing package or bad settings
        self.task: Task | None = None
        self._ds: Any = None
        self._entry: dict[str, Any] | None = None
        self.score: float | None = None
        self.check: str | None = None

    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        o = self.options
        out = []
        for i in range(n):
            s = split_task_seed(split, i, seed)
            _, e = _entry(o.dataset, o.config, s)
            out.append(Task(id=f"reasoning_gym-{o.dataset}-{split}-{s}", seed=s, split=split,
                            data={"dataset": o.dataset, "question": e["question"], "answer": _text(e["answer"])}))
        return out

    def reset(self, task: Task) -> ResetResult:
        o = self.options
        if task.data.get("dataset", o.dataset) != o.dataset:
            raise EnvError(f"task {task.id} is from reasoning_gym dataset {task.data['dataset']!r}, but this "
                           f"environment generates {o.dataset!r}")
        self.task, self.score, self.check = task, None, None
        self._ds, self._entry = _entry(o.dataset, o.config, task.seed)
        messages = []
        if o.system_prompt:
            from reasoning_gym.utils import SYSTEM_PROMPTS

            messages.append(Message(role="system", content=SYSTEM_PROMPTS[o.prompt], origin="system"))
        messages.append(Message(role="user", content=self._entry["question"], origin="user"))
        return ResetResult(messages=messages, tools=[])

    def step(self, action: Message) -> StepResult:
        if self.task is None or self._entry is None:
            raise RuntimeError("step() before reset()")
        from reasoning_gym.utils import extract_answer

        answer = None if action.tool_calls else extract_answer(action.text())
        if action.tool_calls:
            self.check, self.score = "tool_call", 0.0
        elif answer is None:
            self.check, self.score = "no_answer_tag", 0.0
        else:
            try:
                self.score = float(self._ds.score_answer(answer, self._entry))
            except Exception as e:  # a verifier that chokes on odd text scores it 0, with the reason kept
                self.check, self.score = f"verifier_error: {type(e).__name__}: {e}", 0.0
            else:
                self.check = "correct" if self.score >= 1.0 else ("partial" if self.score > 0 else "wrong")
        info = {"success": self.success(), "answer_check": self.check, "answer": answer,
                "reward_terms": {"answer_format": float(answer is not None), "answer_score": self.score}}
        return StepResult([], reward=self.score, done=True, info=info)

    def success(self) -> bool:
        return self.score is not None and self.score >= 1.0

    def expert(self, task: Task) -> Trajectory:
        """The generator's own answer, in the tags (reasoning-gym's reference answer)."""
        from trajtune.envs.runner import run_episode

        def policy(messages: list[Message], tools: list[Any]) -> Message:
            assert self._entry is not None
            return Message(role="assistant", content=f"<answer>{_text(self._entry['answer'])}</answer>")

        traj = run_episode(self, task, policy)
        traj.metadata.update({"expert": True, "policy": f"expert:{self.name}", "dataset": self.options.dataset,
                              "answer_check": self.check})
        return traj

    def render(self) -> str:
        if self.task is None or self._entry is None:
            return "[reasoning_gym] no task"
        return (f"[reasoning_gym {self.options.dataset}] {self._entry['question']}\n"
                f"reference answer: {_text(self._entry['answer'])}; check: {self.check}; score: {self.score}")


def _text(answer: Any) -> str:
    return answer if isinstance(answer, str) else json.dumps(answer)


def split_overlap(env: ReasoningGymEnv, n_train: int, n_test: int, seed: int = 0) -> int:
    """How many of ``n_test`` test questions also appear among ``n_train`` training questions (a small
    task space repeats questions across seeds; a held-out score should say how many it repeats)."""
    train = {t.data["question"] for t in env.tasks("train", n_train, seed)}
    return sum(t.data["question"] in train for t in env.tasks("test", n_test, seed))
