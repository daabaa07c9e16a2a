"""BFCL's single-turn categories as an Environment (``env: bfcl_single_turn``).

Why an environment beside the eval suite (``--benchmark bfcl``, which scores one completion per
entry): wrappers need the Environment protocol. With ``retry`` around it, a failed answer gets
feedback and a second attempt (first- and second-attempt success on BFCL); the verdict is the
same AST / relevance check the suite applies (``runner.check_entry``), on the calls the rollout
parsed with the run's tool format.

BFCL is an evaluation set: ``tasks`` has only a ``test`` split, so no training run can draw an
entry from it (the same rule as ``bfcl_multi_turn``).
"""

from __future__ import annotations

import random

from pydantic import BaseModel, ConfigDict, Field

from trajtune.envs.base import Environment, ResetResult, StepResult, Task, parse_env_options
from trajtune.plugins.bfcl.data import MULTI_TURN_CATEGORIES, load_bfcl, resolve_categories
from trajtune.plugins.bfcl.runner import check_entry
from trajtune.schema import Message, Trajectory


class BFCLSingleTurnOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    categories: list[str] | str = Field("simple_python", description="single-turn BFCL categories or groups")
    limit: int | None = Field(None, gt=0, description="the first N entries of each category")


class BFCLSingleTurnEnv(Environment):
    """One single-turn BFCL entry per episode: the answer is judged by BFCL's checker, then it ends."""

    name = "bfcl_single_turn"
    description = "BFCL single-turn function calling (simple, multiple, parallel, relevance ...), judged by BFCL's AST checker."
    max_turns = 1
    options_model = BFCLSingleTurnOptions  # `trajtune envs show` lists its fields

    def __init__(self, **options: object):
        o = parse_env_options(BFCLSingleTurnOptions, self.name, dict(options))
        cats = resolve_categories([o.categories] if isinstance(o.categories, str) else o.categories)
        bad = [c for c in cats if c in MULTI_TURN_CATEGORIES]
        if bad:
            raise ValueError(f"{bad} are multi-turn BFCL categories; use env bfcl_multi_turn for them")
        self.categories, self.limit = cats, o.limit
        self._entries: dict[str, Trajectory] | None = None
        self.entry: Trajectory | None = None
        self.verdict: tuple[bool, str, str] | None = None

    def _all(self) -> dict[str, Trajectory]:
        if self._entries is None:
            self._entries = {t.id: t for cat in self.categories for t in load_bfcl(cat, limit=self.limit)}
        return self._entries

    def splits(self) -> dict[str, int]:
        return {"test": len(self._all())}

    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        """The first ``n`` entries in file order when ``seed == 0``, else a seeded sample (kept in
        file order). Asking for ``train`` is an error: BFCL is only ever evaluated."""
        if split != "test":
            raise ValueError("BFCL has only a 'test' split (it is an evaluation benchmark); "
                             "train on other data and evaluate here")
        ids = list(self._all())
        if n > len(ids):
            raise ValueError(f"asked for {n} BFCL tasks, only {len(ids)} exist in {self.categories}")
        idx = list(range(len(ids)))
        chosen = idx[:n] if seed == 0 else sorted(random.Random(seed).sample(idx, n))
        return [Task(id=ids[i], seed=i, split="test",
                     data={"record_id": ids[i], "kind": self._all()[ids[i]].reference.data["category"]})  # type: ignore[union-attr]
                for i in chosen]

    def reset(self, task: Task) -> ResetResult:
        rid = task.data.get("record_id", task.id)
        entry = self._all().get(rid)
        if entry is None:
            raise KeyError(f"no BFCL entry {rid!r} in {self.categories}")
        self.entry, self.verdict = entry, None
        return ResetResult(messages=[m.model_copy(deep=True) for m in entry.messages],
                           tools=[t.model_copy(deep=True) for t in entry.tools])

    def step(self, action: Message) -> StepResult:
        if self.entry is None:
            raise RuntimeError("step() before reset()")
        assert self.entry.reference is not None
        errors = list(action.extra.get("parse_errors") or [])
        self.verdict = valid, reason, message = check_entry(self.entry.reference.data, list(action.tool_calls or []),
                                                            errors)
        return StepResult([], reward=1.0 if valid else 0.0, done=True,
                          info={"success": valid, "bfcl_reason": reason, "detail": message})

    def success(self) -> bool:
        return bool(self.verdict and self.verdict[0])

    def render(self) -> str:
        if self.entry is None:
            return "[bfcl] no entry"
        v = "-" if self.verdict is None else f"{self.verdict[1]}: {self.verdict[2]}"
        return f"[bfcl {self.entry.id}] {v}"
