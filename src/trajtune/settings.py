"""One declaration per setting.

A setting that is both a runtime option (a dataclass field of ``RolloutConfig``, ``RenderConfig``,
``LearnerConfig``) and a run-config key is declared once, in the dataclass, with :func:`setting`:
its name, type, default, description and bounds. ``trajtune.config`` builds the pydantic section
from those fields (``config.runtime_section``), so the config cannot drift from the runtime default.

This module is the bottom layer: standard library only, so chat, rollout and learner can use it
without importing ``trajtune.config`` (which sits above them).
"""

from __future__ import annotations

import dataclasses
from typing import Any

#: The bounds a setting may carry; they become pydantic's ``Field(gt=..., ...)`` in the config.
BOUNDS = ("gt", "ge", "lt", "le")


def setting(default: Any = dataclasses.MISSING, *, description: str, default_factory: Any = dataclasses.MISSING,
            **bounds: float) -> Any:
    """A dataclass field that is also a config key. ``description`` is what ``trajtune config show``
    prints; ``bounds`` (gt, ge, lt, le) are checked when a config is validated (constructing the
    dataclass directly checks nothing, as before)."""
    unknown = set(bounds) - set(BOUNDS)
    if unknown:
        raise TypeError(f"setting(): unknown bound(s) {sorted(unknown)}; known: {', '.join(BOUNDS)}")
    return dataclasses.field(default=default, default_factory=default_factory,
                             metadata={"description": description, "bounds": dict(bounds)})


def is_setting(f: dataclasses.Field[Any]) -> bool:
    return "description" in f.metadata
