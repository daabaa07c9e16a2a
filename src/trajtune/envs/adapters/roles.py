"""``roles``: several roles take turns in one episode of any environment (planner and executor,
two players), each with its own instructions and the tools it may use.

Why: some agent systems are teams (MAGRPO, MARFT, Chain-of-Agents): one role plans or looks up,
another acts, and only together do they finish the task. The wrapper turns any environment into
such an episode without touching it: the roles act in turn (``order: alternate``), every role
sees the whole conversation (one shared transcript, as in Chain-of-Agents), and before each turn
a user-side note says whose turn it is and what that role is for. A call to a tool the acting
role may not use is not executed: each of its calls is answered with an error naming the role's
tools, and the turn passes on. Success and reward are the inner environment's (a joint reward);
an inner environment may report per-role rewards in ``info["role_rewards"]``.

A joint reward blames every role for any role's mistake: a scout whose look-up was right, followed
by the operator's wrong change, earns a negative advantage, and can unlearn the right look-up. A
role with ``expert_weight`` w > 0 is also paid for its own part: its reward is (1 - w) x the joint
reward + w x the share of the expert's turns for that role that it matched (the same tool calls with
the same arguments at the same turn of the role; a turn without calls matches one without calls).
The expert is the inner environment's, run for each task at reset (so it needs one that is
deterministic); every role's reward then goes out in ``info["role_rewards"]``, one part per step.

``acting_role()`` says who acts next; the rollout switches to that role's LoRA adapter when the
model has one per role (``rl.role_adapters``), records the role of every assistant turn
(``message.extra["agent_role"]``, ``TokenTrajectory.meta["turn_roles"]``) and the learner trains
each adapter on its own role's tokens, with per-role group baselines (``algorithms/roles.py``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trajtune.envs.base import Environment, ResetResult, StepResult, Task
from trajtune.envs.tools import tool_message
from trajtune.errors import EnvError
from trajtune.schema import Message, Trajectory

ROLE_KEY = "agent_role"  # Message.extra: the role that wrote an assistant turn, or a note is for


class RoleSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_-]{0,31}$", description="the role's name (also its adapter's)")
    tools: list[str] | None = Field(None, description="the tools this role may call (default: all)")
    prompt: str = Field("", description="what this role is for, shown in the note before each of its turns")
    expert_weight: float = Field(0.0, ge=0.0, le=1.0, description=(
        "the share of this role's reward paid for matching the expert's turns for the role (module doc); "
        "0: the joint reward alone"))


class RolesOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    roles: list[RoleSpec] = Field(min_length=2, description="the roles, in the order they act")
    order: Literal["alternate"] = Field("alternate", description="alternate: role 1, role 2, ..., role 1, ...")

    @model_validator(mode="after")
    def _unique(self) -> "RolesOptions":
        names = [r.name for r in self.roles]
        if len(set(names)) != len(names):
            raise ValueError(f"role names must be unique, got {names}")
        return self


def note(role: RoleSpec, tools: list[str]) -> Message:
    allowed = ", ".join(role.tools if role.tools is not None else tools) or "none"
    text = f"[{role.name}'s turn] {role.prompt}".rstrip() + f" (tools: {allowed})"
    return Message(role="user", content=text, origin="environment", extra={ROLE_KEY: role.name})


class RolesEnv(Environment):
    """Any environment, acted in by several roles in turn (module doc)."""

    def __init__(self, inner: Environment, options: RolesOptions):
        self.inner, self.options = inner, options
        self.name = f"roles({inner.name})"
        self.description = f"{inner.description} (roles: {', '.join(r.name for r in options.roles)})"
        self.roles = tuple(r.name for r in options.roles)
        self.max_turns = getattr(inner, "max_turns", 8) * len(self.roles)
        self.deterministic = inner.deterministic
        self.reward_terms = tuple(getattr(inner, "reward_terms", ()))
        self.install = getattr(inner, "install", "")
        self.k = 0
        self.tool_names: list[str] = []
        self.expert_turns: dict[str, list[Any]] = {}  # role -> the expert's calls of each of its turns
        self.paid = any(r.expert_weight > 0 for r in options.roles)
        if self.paid and not inner.deterministic:
            raise EnvError(f"roles option expert_weight needs a deterministic environment, and {inner.name} is not: "
                           "its expert's turns would not be the ones this episode's state calls for")

    def acting_role(self) -> str:
        """The role whose turn is next."""
        return self.roles[self.k % len(self.roles)]

    def _spec(self) -> RoleSpec:
        return self.options.roles[self.k % len(self.roles)]

    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        return self.inner.tasks(split, n, seed)

    def splits(self) -> dict[str, int] | None:
        return self.inner.splits()

    def reset(self, task: Task) -> ResetResult:
        self.k = 0
        if self.paid:  # before the reset: a scripted expert runs its episode in the environment itself
            actions = [m for m in self.inner.expert(task).messages if m.role == "assistant"]
            self.expert_turns = {r: [_calls(a) for a in actions[i::len(self.roles)]] for i, r in enumerate(self.roles)}
        res = self.inner.reset(task)
        self.tool_names = [t.name for t in res.tools]
        return ResetResult(messages=[*res.messages, note(self._spec(), self.tool_names)], tools=res.tools)

    def step(self, action: Message) -> StepResult:
        spec = self._spec()
        calls = action.tool_calls or []
        refused = [c.name for c in calls if spec.tools is not None and c.name not in spec.tools]
        if refused:
            allowed = ", ".join(spec.tools or []) or "no tools"
            text = f"Error: the {spec.name} may not call {', '.join(sorted(set(refused)))}; its tools: {allowed}"
            out = StepResult([tool_message(c.id, c.name, text) for c in calls], info={"role_refused": len(refused)})
        else:
            out = self.inner.step(action)
            if isinstance(out.info.get("tools"), list) and out.info["tools"]:
                self.tool_names = [getattr(t, "name", None) or t["name"] for t in out.info["tools"]]
        if self.paid:
            out.info["role_rewards"] = self._role_rewards(spec, action, float(out.reward))
        self.k += 1
        if not out.done and not (out.termination and out.termination != "done"):
            out.observations = [*out.observations, note(self._spec(), self.tool_names)]
        return out

    def success(self) -> bool:
        return self.inner.success()

    def _role_rewards(self, spec: RoleSpec, action: Message, reward: float) -> dict[str, float]:
        """This step's part of every role's reward: the joint reward's share for each, plus the acting
        role's share for matching the expert's turn (module doc)."""
        out = {r.name: (1.0 - r.expert_weight) * reward for r in self.options.roles}
        turns, j = self.expert_turns.get(spec.name, []), self.k // len(self.roles)
        if spec.expert_weight > 0 and j < len(turns) and _calls(action) == turns[j]:
            out[spec.name] += spec.expert_weight / len(turns)
        return out

    def render(self) -> str:
        return f"[next: {self.acting_role()}] {self.inner.render()}"

    def expert(self, task: Task) -> Trajectory:
        """The inner expert's actions, replayed through the roles (each turn by the role whose turn it
        is); an action the acting role may not take fails the replay."""
        from trajtune.envs.runner import run_episode

        actions = [m for m in self.inner.expert(task).messages if m.role == "assistant"]
        it = iter(actions)

        def policy(messages: list[Message], tools: list[Any]) -> Message:
            try:
                return next(it).model_copy(deep=True)
            except StopIteration:
                raise RuntimeError("the inner expert ran out of actions before the episode ended") from None

        traj = run_episode(self, task, policy, max_turns=self.max_turns)
        traj.metadata.update(expert=True, policy=f"expert:{self.name}")
        return traj

    def __getattr__(self, name: str) -> Any:  # environment-specific attributes
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


def _calls(action: Message) -> list[tuple[str, Any]]:
    """What a turn did, for comparing it with the expert's: its calls' names and arguments, in order."""
    return [(c.name, c.arguments if c.arguments is not None else (c.arguments_raw or c.input))
            for c in action.tool_calls or []]
