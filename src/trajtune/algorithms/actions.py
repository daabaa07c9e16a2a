"""When two agent actions are the same: their text and calls as canonical JSON.

Why apart: RFT deduplicates mined successes by it, DPO groups sibling actions by it, and early
experience drops alternatives equal to the expert's action by it; all must agree.
"""

from __future__ import annotations

import json
from typing import Any

from trajtune.schema import Trajectory


def _action(m: Any) -> list[Any]:
    return [m.text().strip(), [[c.name, c.arguments] for c in (m.tool_calls or [])]]


def _canonical(x: Any) -> str:
    return json.dumps(x, sort_keys=True, ensure_ascii=False, default=str)


def action_key(m: Any) -> str:
    """One assistant action (its text and calls) as canonical text: equal actions, equal keys."""
    return _canonical(_action(m))


def action_signature(t: Trajectory) -> str:
    """The policy's actions as canonical text: two attempts with the same signature are duplicates."""
    return _canonical([_action(m) for m in t.messages if m.role == "assistant"])
