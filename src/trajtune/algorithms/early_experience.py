"""Early experience (Zhang et al., Meta, 2025): learn from the policy's own alternative actions at the
expert's states, without any reward (``rft.early_experience``).

Why: SFT on expert trajectories only ever shows the expert's action at each state, so the model never
sees what happens when it does something else. Early experience branches off the expert's path: at
states s along an expert trajectory, the policy proposes its own actions a', the environment executes
them (the state is reached by replaying the expert's earlier actions: a deterministic environment),
and the outcomes s' become training data of two kinds:

- **implicit world modelling** (``world_model``): from the state and an action (the expert's and each
  alternative), predict what the environment returns. A record is a system prompt
  (``WORLD_MODEL_SYSTEM``), the state and the action as text, and the observation as the trained
  assistant reply.
- **self-reflection** (``reflection``): the policy is shown the state, the expert's action with its
  outcome and the alternatives with theirs, and asked why the expert's action is better
  (``REFLECTION_PROMPT``, greedy); the record is the expert's trajectory up to s with the expert's
  action trained, its ``thought`` set to that reflection (rendered before the action).

The records join the expert data in ``rft`` (with ``rft.k: 0``, no attempt is mined for success:
the run is SFT on expert data plus early experience, the paper's setting). Alternatives identical to
the expert's action are dropped and counted; a reflection that comes back empty is counted, and that
state gets no reflection record. World-model records whose action the environment answered with nothing
are counted too (``silent_outcomes``): in an environment that ends every episode at the first action
(``fncall`` with ``single_turn: true``) they all read ``(the episode ends)`` and teach nothing, which
the ``rft`` run reports.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from pydantic import Field, model_validator

from trajtune import rollout as agent_loop  # by module: tests replace agent_loop.run_rollouts
from trajtune.algorithms.actions import action_key
from trajtune.config import _C
from trajtune.envs.base import Environment, ResetResult, StepResult, Task
from trajtune.schema import Message, Trajectory

WORLD_MODEL_SYSTEM = ("You predict what the environment returns. Given the conversation so far and the agent's "
                      "next action, write the environment's response exactly.")
REFLECTION_PROMPT = ("Below is a task in progress, the action an expert took next and what it led to, and other "
                     "actions that could have been taken and what they led to. In two or three sentences, explain "
                     "why the expert's action is the better one. Write only the explanation.")
ENDED = "(the episode ends)"


class EarlyExperienceSpec(_C):
    world_model: bool = Field(True, description="train predicting the environment's response to the expert's and the "
                                                "alternative actions (implicit world modelling)")
    reflection: bool = Field(True, description="train the expert's action preceded by the policy's own explanation of "
                                               "why it beats the alternatives (self-reflection)")
    alternatives: int = Field(3, gt=0, description="the policy's own actions sampled at each state")
    states: int = Field(4, gt=0, description="evenly spaced states per expert trajectory at most (the first included)")

    @model_validator(mode="after")
    def _some(self) -> "EarlyExperienceSpec":
        if not (self.world_model or self.reflection):
            raise ValueError("rft.early_experience: world_model and reflection are both false: nothing would be built")
        return self


def describe(m: Message) -> str:
    """One message as a line of text (the world model's and the reflection's view of a state)."""
    if m.role == "assistant":
        calls = "; ".join(f"{c.name}({json.dumps(c.arguments if c.arguments is not None else c.arguments_raw, sort_keys=True)})"
                          for c in m.tool_calls or [])
        text = m.text() or ""
        return "Agent: " + " ".join(x for x in (text, f"[calls] {calls}" if calls else "") if x)
    label = {"user": "User", "tool": "Tool result", "system": "System"}.get(m.role, m.role)
    return f"{label}: {m.text() or ''}"


def state_text(prefix: list[Message]) -> str:
    return "\n".join(describe(m) for m in prefix if m.role != "system")


def outcome_text(observations: list[Message]) -> str:
    """What the environment returned after an action (its observation messages), or ``ENDED``."""
    return "\n".join(m.text() or "" for m in observations) if observations else ENDED


def expert_states(traj: Trajectory, n: int) -> list[int]:
    """Message indices of the expert actions whose states are explored: ``n`` evenly spaced assistant
    turns at most, the first included."""
    where = [j for j, m in enumerate(traj.messages) if m.role == "assistant"]
    if not where:
        return []
    step = max(1, -(-len(where) // n))
    return where[::step][:n]


def _observations_after(messages: list[Message], i: int) -> list[Message]:
    out = []
    for m in messages[i + 1:]:
        if m.role == "assistant":
            break
        out.append(m)
    return out


class _Prompt(Environment):
    """A one-turn 'environment' that only asks a question: the policy's reply is the reflection."""

    name = "early_experience_reflection"
    max_turns = 1

    def __init__(self, prompts: dict[str, list[Message]]):
        self.prompts = prompts

    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:  # pragma: no cover - not used
        return []

    def reset(self, task: Task) -> ResetResult:
        return ResetResult(messages=list(self.prompts[task.id]), tools=[])

    def step(self, action: Message) -> StepResult:
        return StepResult([], done=True)


def _world_model_records(experts: list[tuple[Task, Trajectory]],
                         branches: dict[tuple[int, int], list[tuple[Message, list[Message]]]]) -> list[Trajectory]:
    """One record per (state, action): the state and the action as text, the outcome as the trained reply."""
    records = []
    for (e, i), options in branches.items():
        traj = experts[e][1]
        state = state_text(traj.messages[:i])
        for j, (action, obs) in enumerate(options):
            records.append(Trajectory(
                id=f"{traj.id}-wm-{i}-{j}",
                messages=[Message(role="system", content=WORLD_MODEL_SYSTEM),
                          Message(role="user", content=f"{state}\n\nNext action:\n{describe(action)}\n\n"
                                                       "What does the environment return?"),
                          Message(role="assistant", content=outcome_text(obs), train=True)],
                metadata={"early_experience": "world_model", "expert": traj.id, "state": i,
                          "expert_action": j == 0}))
    return records


def early_experience_mine(model: Any, tokenizer: Any, renderer: Any, env_factory: Any,
                          experts: list[tuple[Task, Trajectory]], rollout: Any, spec: EarlyExperienceSpec,
                          seed: int) -> tuple[list[Trajectory], dict[str, int]]:
    """Branch off each expert trajectory (module doc); returns the records and counts."""
    one_turn = replace(rollout, max_turns=1)
    jobs: list[tuple[int, int]] = []  # (expert index, message index of the state's expert action)
    tasks, prefixes = [], []
    for e, (task, traj) in enumerate(experts):
        for i in expert_states(traj, spec.states):
            for _ in range(spec.alternatives):
                tasks.append(task)
                prefixes.append(traj.messages[:i])
                jobs.append((e, i))
    counts = {"experts": len(experts), "states": len(set(jobs)), "alternatives": 0, "duplicates": 0,
              "world_model_records": 0, "silent_outcomes": 0, "reflection_records": 0, "empty_reflections": 0}
    if not tasks:
        return [], counts
    episodes = agent_loop.run_rollouts(model, tokenizer, env_factory, tasks, one_turn, seed=seed, renderer=renderer,
                                       prefixes=prefixes)
    # per state: the expert's (action, outcome) first, then the distinct alternatives
    branches: dict[tuple[int, int], list[tuple[Message, list[Message]]]] = {}
    for (e, i), ep in zip(jobs, episodes):
        traj = experts[e][1]
        options = branches.setdefault((e, i), [(traj.messages[i], _observations_after(traj.messages, i))])
        if not ep.turns:  # no action of its own (the state already filled the context)
            continue
        msgs = ep.trajectory.messages
        at = max(j for j, m in enumerate(msgs) if m.role == "assistant")  # its one turn is the last one
        action = msgs[at]
        if any(action_key(action) == action_key(a) for a, _ in options):
            counts["duplicates"] += 1
            continue
        options.append((action, _observations_after(msgs, at)))
        counts["alternatives"] += 1
    records: list[Trajectory] = []
    if spec.world_model:
        records = _world_model_records(experts, branches)
        counts["world_model_records"] = len(records)
        # an action the environment answers with nothing (a single-turn environment ends every episode
        # at once) leaves only ENDED to predict: counted, so that a run can say its records teach nothing
        counts["silent_outcomes"] = sum(not obs for options in branches.values() for _, obs in options)
    if spec.reflection:
        keys = [k for k, options in branches.items() if len(options) > 1]  # nothing to compare without alternatives
        prompts = {}
        for e, i in keys:
            traj = experts[e][1]
            (expert, expert_obs), *others = branches[(e, i)]
            lines = [f"Task so far:\n{state_text(traj.messages[:i])}",
                     f"Expert action: {describe(expert)}\nResult: {outcome_text(expert_obs)}"]
            lines += [f"Other action {n}: {describe(a)}\nResult: {outcome_text(o)}" for n, (a, o) in enumerate(others, 1)]
            prompts[f"{e}:{i}"] = [Message(role="system", content=REFLECTION_PROMPT),
                                   Message(role="user", content="\n\n".join(lines))]
        if prompts:
            greedy = replace(one_turn, temperature=0.0)
            asks = [Task(id=k, seed=n) for n, k in enumerate(prompts)]
            replies = agent_loop.run_rollouts(model, tokenizer, lambda: _Prompt(prompts), asks, greedy, seed=seed,
                                              renderer=renderer)
            for (e, i), reply in zip(keys, replies):
                said = next((m for m in reply.trajectory.messages if m.role == "assistant"), None)
                text = (said.text() or "").strip() if said is not None else ""
                if not text:
                    counts["empty_reflections"] += 1
                    continue
                traj = experts[e][1]
                history = [m.model_copy(update={"train": False}) if m.role == "assistant" else m
                           for m in traj.messages[:i]]
                action = traj.messages[i].model_copy(update={"thought": text, "train": True})
                records.append(Trajectory(id=f"{traj.id}-sr-{i}", messages=[*history, action], tools=traj.tools,
                                          metadata={"early_experience": "reflection", "expert": traj.id, "state": i}))
                counts["reflection_records"] += 1
    return records, counts
