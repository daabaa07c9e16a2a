"""Context folding on the IR: how a folded episode is recorded, and the training rows it becomes.

Why: an agent whose episode outgrows its context window can ``branch`` into a sub-task and
``return`` a short summary (Context-Folding / FoldGRPO, Sun et al. 2025; AgentFold): when it returns,
the sub-task's turns leave the active context and only the summary stays. Training must then see
each context the model actually sampled in, and nothing else: the sub-task's turns were sampled with
the sub-task in context, the turns after the return without it.

The record is one linear trajectory holding every message in the order it happened; the fold is in
the marks (``Message.extra[FOLD_KEY]``):

- ``{"branch": k}`` on every message that lived only inside branch ``k``: the branch's opening
  observation, the turns and observations of the sub-task, and the ``return`` call;
- ``{"summary": k}`` on the tool message that answers branch ``k``'s ``branch`` call in the folded
  context (the summary the agent returned).

``expand_folds`` turns such a record into the rows training sees: one row per returned branch (the
context before the branch, untrained, then the branch up to its ``return`` call) and one for the
active context at the end. The rollout (``trajtune.rollout``) builds the same rows token by token as
it samples, and the renderer expands a folded record the same way for SFT, so a folded episode and a
folded expert trajectory train alike. Only one level of branching: a ``branch`` inside a branch is
refused by the environment (``envs/adapters/fold.py``).
"""

from __future__ import annotations

from typing import Any

from trajtune.schema import Message, Trajectory

#: ``Message.extra`` key of the fold marks.
FOLD_KEY = "fold"
BRANCH_TOOL = "branch"
RETURN_TOOL = "return"
#: What replaces an old observation in the observation-masking baseline (``rollout.mask_observations_at``).
MASKED_TEXT = "[observation omitted]"


def fold_mark(m: Message) -> dict[str, Any] | None:
    mark = m.extra.get(FOLD_KEY)
    return mark if isinstance(mark, dict) else None


def is_folded(traj: Trajectory) -> bool:
    """Whether ``traj`` holds fold marks (a record of a folded episode or a folded expert trajectory)."""
    return any(fold_mark(m) for m in traj.messages)


def _untrained(m: Message) -> Message:
    return m.model_copy(update={"train": False}) if m.role == "assistant" else m


def expand_folds(traj: Trajectory) -> list[Trajectory]:
    """The rows a folded record trains as (module doc); ``[traj]`` for a record without marks.

    A returned branch's row is the context as it was when the branch began (its assistant turns
    untrained: the main row trains them) followed by the branch's own messages, ending with the
    ``return`` call. The last row is the context active at the end: the main context with every
    returned branch folded into its summary, or, when the episode ended inside a branch that never
    returned, that branch's context (trained in full: it is where those turns were sampled)."""
    return [row for row, _ in expand_folds_indexed(traj)]


def expand_folds_indexed(traj: Trajectory) -> list[tuple[Trajectory, list[int]]]:
    """``expand_folds`` with, per row, the record's index of each of its messages (for findings)."""
    if not is_folded(traj):
        return [(traj, list(range(len(traj.messages))))]
    main: list[int] = []
    branches: dict[Any, tuple[list[int], list[int]]] = {}  # k -> (context at its start, its messages)
    returned: set[Any] = set()
    open_k: Any = None
    for i, m in enumerate(traj.messages):
        mark = fold_mark(m) or {}
        if "branch" in mark:
            k = mark["branch"]
            if k not in branches:
                branches[k] = (list(main), [])
            branches[k][1].append(i)
            open_k = k
            continue
        if "summary" in mark:
            returned.add(mark["summary"])
            open_k = None
        main.append(i)
    msgs = traj.messages
    rows: list[tuple[Trajectory, list[int]]] = []
    for n, (k, (context, own)) in enumerate(branches.items()):
        if k in returned:
            rows.append((_row(traj, [_untrained(msgs[i]) for i in context] + [msgs[i] for i in own], f"branch{n}"),
                         context + own))
    if open_k is not None and open_k not in returned:  # ended inside a branch: that context is the last one
        context, own = branches[open_k]
        rows.append((_row(traj, [msgs[i] for i in context + own], "main"), context + own))
    else:
        rows.append((_row(traj, [msgs[i] for i in main], "main"), main))
    return rows


def _row(traj: Trajectory, messages: list[Message], part: str) -> Trajectory:
    return traj.model_copy(update={"messages": messages, "metadata": {**traj.metadata, "fold_row": part}})


def active_context(traj: Trajectory) -> list[Message]:
    """The messages in the agent's context at the end of a folded record (its last row)."""
    return expand_folds(traj)[-1].messages
