"""Critical-step SFT (ATLaS): train only the turns that matter, keep the rest as context.

Why: in a long expert trajectory most turns are routine (look something up, read it back); ATLaS
finds that training on the ~30 % that carry the decision (making the plan, noticing what an
observation means, the action that achieves the goal, correcting a mistake) generalizes better
than training on all of them. Turns that are not selected stay in the context with weight 0, so
the model still sees the whole history.

Selectors (``data.critical_steps.selector``):

- ``heuristic`` (ours; no judge): each assistant turn gets points for the four ATLaS criteria as
  far as they can be read off the record: **self-correction** (the previous observation was an
  error) 3, **critical action** (the turn earned a positive per-turn reward) 3, **plan creation**
  (the first turn, or a turn whose text lays out steps) 2, **critical observation** (the final
  answer after tool results, or a call to a tool not used before, i.e. acting on new
  information) 1. The top ``ratio`` of turns (at least one per trajectory) by points, earlier
  turns first on ties, are selected.
- ``judge``: an LLM (``openai:URL`` or a local model, through the same code as ``eval --judge``)
  reads the numbered transcript with the four criteria and answers ``{"critical": [turn numbers]}``.
  A reply that cannot be read (or an endpoint error on one record) is counted in
  ``judge_failures`` and that record falls back to the heuristic: it never stops the run.

If nothing is selected in the whole dataset the run stops with a clear message.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from trajtune.algorithms.error_mask import explicit_flags, observation_is_error
from trajtune.errors import DataError
from trajtune.judge import MAX_MESSAGE_CHARS, _call_text, _clip, _json_objects, ask, make_judge
from trajtune.schema import Message, Trajectory

ATLAS_CRITERIA = """\
A turn is critical when it does at least one of:
1. Plan creation: it sets out the plan or the next sub-goals for the task.
2. Critical observation: it notices what a tool result means for the task and acts on it.
3. Critical action: it takes the action that achieves (part of) the goal.
4. Self-correction: it recognises an earlier mistake or error and fixes it."""

JUDGE_PROMPT = ATLAS_CRITERIA + """

You will read the transcript of an AI agent's episode, with its turns numbered. Pick the critical
turns, about {percent}% of them (at least one). Reply with only a JSON object:
{{"critical": [turn numbers], "reason": "one sentence"}}"""

_PLAN_WORDS = re.compile(r"\b(plan|first|then|next|step|steps|finally)\b", re.IGNORECASE)


def assistant_turns(traj: Trajectory) -> list[int]:
    return [i for i, m in enumerate(traj.messages) if m.role == "assistant"]


def _previous_observations(msgs: list[Message], i: int) -> list[Message]:
    out = []
    j = i - 1
    while j >= 0 and msgs[j].role != "assistant":
        if msgs[j].role == "tool" or (msgs[j].role == "user" and msgs[j].origin == "environment"):
            out.append(msgs[j])
        j -= 1
    return out


def heuristic_points(traj: Trajectory) -> dict[int, float]:
    """Message index → points for the ATLaS criteria (see the module docstring)."""
    msgs = traj.messages
    turns = assistant_turns(traj)
    used: set[str] = set()
    points: dict[int, float] = {}
    for k, i in enumerate(turns):
        m = msgs[i]
        p = 0.0
        before = _previous_observations(msgs, i)
        if any(observation_is_error(o) for o in before):
            p += 3  # self-correction
        if (m.reward or 0.0) > 0:
            p += 3  # critical action
        text = m.text() or ""
        if k == 0 or (len(text) >= 40 and _PLAN_WORDS.search(text)):
            p += 2  # plan creation
        names = {c.name for c in m.tool_calls or []}
        if (names - used) or (not m.tool_calls and before and i == turns[-1]):
            p += 1  # critical observation: acting on new information, or answering from results
        used |= names
        points[i] = p
    return points


def select_heuristic(traj: Trajectory, ratio: float) -> set[int]:
    points = heuristic_points(traj)
    if not points:
        return set()
    k = max(1, math.ceil(ratio * len(points) - 1e-9))
    ranked = sorted(points, key=lambda i: (-points[i], i))
    return set(ranked[:k])


def numbered_transcript(traj: Trajectory) -> str:
    parts, n = [], 0
    for m in traj.messages:
        if m.role == "assistant":
            n += 1
            lines = [f"[turn {n}] {_clip(m.text() or '', MAX_MESSAGE_CHARS)}".rstrip()]
            lines += [f"  -> tool call: {_clip(_call_text(c), MAX_MESSAGE_CHARS)}" for c in m.tool_calls or []]
            parts.append("\n".join(lines))
        elif m.role == "tool":
            parts.append(f"[tool result{' ' + m.name if m.name else ''}] {_clip(m.text() or '', MAX_MESSAGE_CHARS)}")
        else:
            parts.append(f"[{m.role}] {_clip(m.text() or '', MAX_MESSAGE_CHARS)}")
    return "\n\n".join(parts)


def parse_critical(text: str, n_turns: int) -> set[int]:
    """Turn numbers (1-based) from ``{"critical": [...]}``; ValueError when there is no usable list."""
    for obj in _json_objects(text or ""):
        if isinstance(obj, dict) and isinstance(obj.get("critical"), list):
            got = obj["critical"]
            if all(isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= n_turns for x in got) and got:
                return set(got)
            raise ValueError(f"\"critical\" must list turn numbers 1..{n_turns}: {got!r}"[:200])
    raise ValueError(f"no {{\"critical\": [...]}} in the reply: {(text or '')[:120]!r}")


class JudgeSelector:
    """Asks a chat-completions endpoint (``complete``: request body → response) for the critical turns."""

    def __init__(self, complete: Callable[[dict[str, Any]], dict[str, Any]], model: str, ratio: float,
                 max_tokens: int = 256):
        self.complete, self.model, self.ratio, self.max_tokens = complete, model, ratio, max_tokens

    def select(self, traj: Trajectory) -> set[int]:
        """Message indices of the judge's critical turns; ValueError when its reply cannot be used."""
        turns = assistant_turns(traj)
        msgs = [Message(role="system", content=JUDGE_PROMPT.format(percent=round(100 * self.ratio))),
                Message(role="user", content="Which turns are critical?\n\n" + numbered_transcript(traj))]
        text = ask(self.complete, self.model, msgs, self.max_tokens)  # a failure: ValueError, counted
        return {turns[n - 1] for n in parse_critical(text, len(turns))}


def make_selector(spec: Any) -> JudgeSelector | None:
    """The judge selector for ``data.critical_steps`` (None for the heuristic)."""
    if spec.selector != "judge":
        return None

    judge = make_judge(spec.judge, model=spec.judge_model)
    return JudgeSelector(judge.complete, judge.model, spec.ratio)


def select_critical(trajs: list[Trajectory], spec: Any, train_on: str,
                    selector: JudgeSelector | None = None) -> tuple[list[Trajectory], dict[str, Any]]:
    """Copies whose assistant messages carry ``train`` flags: ``train_on``'s choice (or the flags an
    earlier rewrite set) AND selected as critical. Returns them and counts for result.json."""
    out: list[Trajectory] = []
    total = selected = failures = 0
    for t in trajs:
        t2 = explicit_flags(t, train_on)
        if selector is not None:
            try:
                chosen = selector.select(t2)
            except ValueError:
                failures += 1
                chosen = select_heuristic(t2, spec.ratio)
        else:
            chosen = select_heuristic(t2, spec.ratio)
        for i in assistant_turns(t2):
            m = t2.messages[i]
            m.train = bool(m.train) and i in chosen
            total += 1
            selected += int(m.train)
        out.append(t2)
    if selected == 0:
        raise DataError(f"data.critical_steps ({spec.selector}) selected no trainable turn in {len(trajs)} "
                        f"record(s) ({total} assistant turns); check the data's train flags / mask_errors, or raise "
                        "data.critical_steps.ratio")
    counts: dict[str, Any] = {"turns": total, "selected": selected, "ratio": round(selected / max(1, total), 4)}
    if selector is not None:
        counts["judge_failures"] = failures
    return out, counts
