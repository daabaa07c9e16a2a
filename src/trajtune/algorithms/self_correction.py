"""Trained self-correction: only the turns that correct a failure train (``rl.train_turns``).

Reflect, Retry, Reward (Bensal et al., 2025): after a failed attempt the model writes a short
self-reflection and tries again; GRPO rewards *only the reflection tokens*, with the retry's
verdict as reward, so the model learns to write reflections that make its next attempt succeed,
without being pushed toward any particular answer. RISE (Qu et al., 2024) trains the improved
attempt instead. Episodes come from the ``retry`` environment wrapper (envs/adapters/retry.py),
whose messages mark where a reflection and a retry start.

``train_turns``:

- ``reflection``: the assistant turn that answers the wrapper's reflection request;
- ``retry``: the assistant turns after the wrapper's "try again" (the whole retried attempt).

Episodes without such a turn (solved at the first attempt, or cut before the reflection) carry no
evidence about it: they get zero weight and ``meta["masked"]``, which keeps them out of their group's
baseline (``advantages.assign_advantages``), so a reflection's advantage compares it only with the
group's other reflections. The episode's reward is its last attempt's (the wrapper gives a retried
failure 0), so a reflection's reward is whether the retry after it succeeded.
"""

from __future__ import annotations

from typing import Any, Literal

from trajtune.envs.adapters.retry import RETRY_KEY, RetryEnv, attempts
from trajtune.errors import ConfigError
from trajtune.tokens import SOURCE_POLICY

TrainTurns = Literal["all", "reflection", "retry"]

#: the wrapper's mark that opens the turns each setting trains
_MARK = {"reflection": "reflect", "retry": "retry"}


def chosen_turns(messages: list[Any], train_turns: TrainTurns) -> set[int]:
    """Assistant-turn indices (0-based, in message order) that ``train_turns`` trains: for
    ``reflection`` the turn right after a reflection request; for ``retry`` every turn after a
    "try again" up to the next mark."""
    mark = _MARK[train_turns]
    out: set[int] = set()
    turn, active = 0, False
    for m in messages:
        tag = m.extra.get(RETRY_KEY)
        if isinstance(tag, str) and tag != "injected_error":
            active = tag == mark
            continue
        if m.role == "assistant":
            if active:
                out.add(turn)
                if train_turns == "reflection":
                    active = False
            turn += 1
    return out


def restrict_to_turns(episodes: list[Any], train_turns: TrainTurns) -> dict[str, float]:
    """Keep the weight of each episode's policy tokens only on the chosen turns; mask the episodes
    that have none (module doc). Returns metrics: the share of episodes that train and, among
    them, the share whose final attempt succeeded."""
    trained = solved = 0
    for e in episodes:
        tt, traj = e.tokens, e.trajectory
        own = int(tt.meta.get("turns", 0))
        offset = sum(1 for m in traj.messages if m.role == "assistant") - own  # a replayed prefix's turns
        turns = {k - offset for k in chosen_turns(traj.messages, train_turns) if k >= offset}
        tt.weight = [w if s == SOURCE_POLICY and t in turns else 0.0
                     for w, s, t in zip(tt.weight, tt.source, tt.turn)]
        if not any(tt.weight):
            tt.meta["masked"] = True
            continue
        trained += 1
        solved += int(bool(traj.outcome and traj.outcome.success))
    n = max(1, len(episodes))
    return {f"{train_turns}/episodes": trained / n,
            f"{train_turns}/success": solved / trained if trained else 0.0}


def first_attempt_success(episodes: list[Any]) -> float:
    """The share of episodes solved without a retry (a metric beside ``success``, which counts the
    retries too)."""
    ok = sum(1 for e in episodes if e.trajectory.outcome and e.trajectory.outcome.success
             and attempts(e.trajectory) == 1)
    return ok / max(1, len(episodes))


def check_retry_env(env: Any, train_turns: TrainTurns) -> None:
    """``rl.train_turns`` other than ``all`` needs episodes from the ``retry`` wrapper, and
    ``reflection`` needs its reflection turns: anything else would train nothing, silently."""
    if not isinstance(env, RetryEnv):
        raise ConfigError(f"rl.train_turns: {train_turns} trains the turns of the retry environment wrapper; wrap the "
                          f"environment: env: {{name: retry, kwargs: {{env: {env.name}, ...}}}} (docs/envs.md, retry)")
    if env.options.retries == 0:
        raise ConfigError(f"rl.train_turns: {train_turns} with the retry wrapper's retries: 0: no episode is retried, so "
                          "nothing would train; set env.kwargs.retries >= 1")
    if train_turns == "reflection" and not env.options.reflect:
        raise ConfigError("rl.train_turns: reflection with the retry wrapper's reflect: false: there is no reflection "
                          "turn to train; set env.kwargs.reflect: true or rl.train_turns: retry")
