"""Evaluation runs: roll a model out on an environment's held-out tasks and score the episodes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from trajtune.envs.base import Environment, Task
from trajtune.eval.metrics import summarize
from trajtune.rollout import Episode, RolloutConfig, run_rollouts
from trajtune.schema import AtomicJsonlWriter, atomic_write_text


def evaluate(model: Any, tokenizer: Any, env_factory: Callable[[], Environment], tasks: Sequence[Task],
             rollout: RolloutConfig, *, n: int = 1, ks: Sequence[int] = (1,), seed: int = 0,
             renderer: Any = None, progress: Callable[[int], None] | None = None) -> tuple[dict[str, Any], list[Episode]]:
    """``n`` samples per task (temperature from ``rollout``); greedy when temperature is 0."""
    expanded = [t for t in tasks for _ in range(n)]
    episodes = run_rollouts(model, tokenizer, env_factory, expanded, rollout, seed=seed, renderer=renderer,
                            progress=progress)
    return summarize(episodes, ks=[k for k in ks if k <= n]), episodes


def write_eval(out_dir: str | Path, name: str, metrics: dict[str, Any], episodes: Sequence[Episode]) -> Path:
    """``{name}.json`` (metrics + per-episode trajectories) and ``{name}.episodes.jsonl`` (IR), atomically."""
    import json

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with AtomicJsonlWriter(out / f"{name}.episodes.jsonl", overwrite=True) as w:
        for e in episodes:
            w.write(e.trajectory)
    doc = {"metrics": metrics,
           "episodes": [e.trajectory.model_dump(mode="json", exclude_none=True) for e in episodes]}
    atomic_write_text(out / f"{name}.json", json.dumps(doc, indent=1, ensure_ascii=False))
    return out / f"{name}.json"
