"""Agent metrics over episodes: success, reward, format errors, turns, unbiased pass@k."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from math import comb
from typing import Any


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al., 2021): 1 - C(n-c, k) / C(n, k) for n samples with c correct."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per task, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def summarize(episodes: Sequence[Any], ks: Sequence[int] = (1,)) -> dict[str, Any]:
    """Aggregate rollout ``Episode``s (several per task allowed) into one metrics dict."""
    if not episodes:
        return {"episodes": 0}
    by_task: dict[str, list[bool]] = defaultdict(list)
    for e in episodes:
        by_task[e.trajectory.id].append(bool(e.trajectory.outcome and e.trajectory.outcome.success))
    n_turns = sum(e.turns for e in episodes)
    n_fmt = sum(e.format_errors for e in episodes)
    terminations: dict[str, int] = defaultdict(int)
    for e in episodes:
        terminations[(e.trajectory.outcome.termination if e.trajectory.outcome else None) or "unknown"] += 1
    out: dict[str, Any] = {
        "episodes": len(episodes),
        "tasks": len(by_task),
        "success": sum(sum(v) for v in by_task.values()) / len(episodes),
        "mean_reward": sum(float(e.trajectory.reward or 0.0) for e in episodes) / len(episodes),
        "format_error_rate": n_fmt / max(1, n_turns),
        "episodes_with_format_errors": sum(1 for e in episodes if e.format_errors) / len(episodes),
        "mean_turns": n_turns / len(episodes),
        "terminations": dict(sorted(terminations.items())),
    }
    n_min = min(len(v) for v in by_task.values())
    for k in ks:
        if k <= n_min:
            out[f"pass@{k}"] = sum(pass_at_k(len(v), sum(v), k) for v in by_task.values()) / len(by_task)
    return out
