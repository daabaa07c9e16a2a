"""FAFT, feedback-aware fine-tuning (``data.faft``): learn what a plan that passes looks like from
plans that pass and plans that fail.

Why: plain SFT on the successful plans throws the failed ones away, and training on the failed
ones teaches failure. FAFT keeps both, but makes the verifier's verdict part of the input:
(task, feedback) → plan, where the feedback is the verifier's pass/fail summary of *that* plan
("the plan fails: budget"). The model learns how plans depend on the feedback; at inference the
slot says that every constraint passes, and it writes the plan that goes with that.

A record's feedback is ``metadata["feedback"]``: the environment's ``info["feedback"]`` that
rollouts, ``trajtune eval --out`` and ``trajtune data generate`` record (the built-in ``trip``
reports it), or your own. It is appended to the first user message as
``FEEDBACK_PREFIX + feedback``. Records without it are left out and counted; none at all is an
error. At inference, wrap the environment so its request carries the slot:
``env: {name: feedback_slot, kwargs: {env: trip, text: "all constraints pass"}}``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from trajtune.envs.adapters.feedback_slot import FEEDBACK_PREFIX, add_feedback  # noqa: F401
from trajtune.errors import DataError
from trajtune.schema import Trajectory


def faft_records(trajs: list[Trajectory]) -> tuple[list[Trajectory], dict[str, Any]]:
    """Each record with its own feedback in the request; counts for result.json."""
    out, counts = [], Counter()
    for t in trajs:
        fb = t.metadata.get("feedback")
        if not isinstance(fb, str) or not fb.strip() or not any(m.role == "user" for m in t.messages):
            counts["no_feedback"] += 1
            continue
        counts["with_feedback"] += 1
        out.append(t.model_copy(update={"messages": add_feedback(t.messages, fb.strip())}))
    if not out:
        raise DataError(f"data.faft: none of the {len(trajs)} records has metadata.feedback (the verifier's summary); "
                        "record it with trajtune data generate / eval --out on an environment that reports "
                        "info['feedback'] (e.g. trip), or write it yourself")
    return out, dict(sorted(counts.items()))
