"""Error-masked SFT (KAT-Coder, AgentRefine): learn the recovery, not the mistake.

Agent logs are full of turns that went wrong and were then fixed: a call to a tool that does not
exist, arguments that did not parse, a call the tool answered with an error, a step a verifier
flagged. Plain SFT teaches the model to make those mistakes too. Dropping the turns would teach
recoveries from nothing; so an error turn stays in the context (the model still sees what happened
and the error it drew) with weight 0, and every later turn, the recovery included, is trained.

What counts as an error turn (an assistant message), checked in this order:

- ``invalid_call``: its tool calls did not parse (``extra.parse_errors``, as trajtune's parsers
  record them), call a tool the trajectory does not declare, or carry arguments that are not a JSON
  object;
- ``error_observation``: a tool result answering one of its calls (or, without call ids, any tool
  result before the next assistant turn; also an environment note sent because it made no valid
  call) is an error: ``extra.error`` / ``extra.is_error`` (MCP's ``isError``) set, or the text starts
  with ``Error`` / ``Exception`` or holds a Python traceback;
- ``verifier_flag``: the message's ``extra.verifier_flag`` or ``extra.error`` is set (a data
  pipeline's own judgement).

The rewrite is on the IR: it turns the run's ``data.train_on`` (all / last / hint) into explicit
per-message ``train`` flags, clears the flag of each error turn, and the renderer then follows the
flags. So context, tokenization and provenance are exactly those of plain SFT; only weights differ.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Literal

from trajtune.schema import Message, Trajectory

_ERROR_TEXT = re.compile(r"^\s*(error|exception)\b|traceback \(most recent call last\)", re.IGNORECASE)
Reason = Literal["invalid_call", "error_observation", "verifier_flag"]


def observation_is_error(m: Message) -> bool:
    """A tool result (or an environment note) that reports a failure."""
    if m.extra.get("error") or m.extra.get("is_error"):
        return True
    return bool(_ERROR_TEXT.search(m.text()))


def _invalid_call(m: Message, declared: set[str]) -> bool:
    if m.extra.get("parse_errors"):
        return True
    for c in m.tool_calls or []:
        if declared and c.name not in declared:
            return True
        if c.arguments is None and c.arguments_raw is not None and c.input is None and c.code is None:
            return True  # raw arguments that never became a JSON object
    return False


def error_turns(traj: Trajectory) -> dict[int, Reason]:
    """Message index → why that assistant turn is an error turn (see the module docstring)."""
    declared = {t.name for t in traj.tools}
    out: dict[int, Reason] = {}
    msgs = traj.messages
    for i, m in enumerate(msgs):
        if m.role != "assistant":
            continue
        if _invalid_call(m, declared):
            out[i] = "invalid_call"
            continue
        ids = {c.id for c in m.tool_calls or []}
        j = i + 1
        while j < len(msgs) and msgs[j].role != "assistant":
            o = msgs[j]
            answers = o.role == "tool" and (not ids or o.tool_call_id is None or o.tool_call_id in ids)
            env_note = o.role == "user" and o.origin == "environment"
            if (answers or env_note) and observation_is_error(o):
                out[i] = "error_observation"
                break
            j += 1
        if i not in out and (m.extra.get("verifier_flag") or m.extra.get("error")):
            out[i] = "verifier_flag"
    return out


def explicit_flags(traj: Trajectory, train_on: str) -> Trajectory:
    """A copy whose assistant messages carry ``train_on``'s choice (all / last / hint) as explicit
    ``train`` flags, so that rendering it with ``train_on: hint`` trains the same turns."""
    assistant = [i for i, m in enumerate(traj.messages) if m.role == "assistant"]
    last = assistant[-1] if assistant else -1
    out = traj.model_copy(deep=True)
    for i in assistant:
        m = out.messages[i]
        m.train = {"all": True, "last": i == last}.get(train_on, m.train is not False)
    return out


def mask_error_turns(traj: Trajectory, train_on: str) -> tuple[Trajectory, Counter]:
    """A copy whose assistant messages carry explicit ``train`` flags: ``train_on``'s choice, with
    error turns set to ``False``. Render it with ``train_on: hint``. Returns the copy and the masked
    turns counted by reason."""
    errors = error_turns(traj)
    out = explicit_flags(traj, train_on)
    masked: Counter = Counter()
    for i, reason in errors.items():
        m = out.messages[i]
        if m.train:
            masked[reason] += 1
            m.train = False
    return out, masked
