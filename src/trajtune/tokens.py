"""Token trajectories: token ids with, per token, where it came from and how much it counts.

This is the one currency between the renderer and rollouts (which produce it), the transforms
(which annotate it: advantages, reference log-probs, weights) and the learner (which trains on it).
It lives apart from the renderer so that the learner and the algorithms depend on the contract,
not on chat-template machinery.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SOURCE_PROMPT, SOURCE_POLICY, SOURCE_ENV, SOURCE_PAD = 0, 1, 2, 3
SOURCE_NAMES = {SOURCE_PROMPT: "prompt", SOURCE_POLICY: "policy", SOURCE_ENV: "env", SOURCE_PAD: "pad"}
#: ``meta`` key of an episode's other rows: contexts that left its active one (a returned branch of
#: context folding, the context before observation masking), each a TokenTrajectory of its own.
CLOSED_ROWS = "closed_rows"


@dataclass
class TokenTrajectory:
    """Token ids with, per token, where it came from and how much it counts.

    ``turn`` is the assistant-turn index a token belongs to (for prompt/env tokens: the number of
    assistant turns before them). ``logprobs`` holds the sampling log-probabilities of policy tokens
    when the trajectory was sampled (0.0 elsewhere), ``advantages`` is filled by RL transforms.
    """

    ids: list[int]
    source: list[int]
    turn: list[int]
    weight: list[float]
    logprobs: list[float] | None = None
    advantages: list[float] | None = None
    traj_id: str = ""
    group: str = ""
    reward: float | None = None
    success: bool | None = None
    termination: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ids)

    def check(self) -> None:
        n = len(self.ids)
        for name in ("source", "turn", "weight"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"TokenTrajectory.{name} has {len(getattr(self, name))} entries for {n} ids")
        for name in ("logprobs", "advantages"):
            v = getattr(self, name)
            if v is not None and len(v) != n:
                raise ValueError(f"TokenTrajectory.{name} has {len(v)} entries for {n} ids")

    def policy_ids(self) -> list[int]:
        return [i for i, s in zip(self.ids, self.source) if s == SOURCE_POLICY]

    def n_policy(self) -> int:
        return sum(1 for s in self.source if s == SOURCE_POLICY)
