"""An LLM judge for evaluated episodes (``trajtune eval ... --judge openai:URL``).

Each episode is rendered as text (the task, every message, tool calls with their arguments, tool
results, the final answer and how the episode ended), put under a rubric (``DEFAULT_RUBRIC`` or a
text/Markdown file) and sent to a chat-completions endpoint: any OpenAI-compatible server through
the standard-library client of ``trajtune.envs.adapters.openai_policy``, or a local model answered
in-process by ``trajtune.serve.ChatService`` (the same code ``trajtune serve`` runs).

The reply is read with ``parse_score``: a JSON object ``{"score": x, "reason": ...}`` (the whole
reply, a fenced block, or the first object in the text), else a ``Score: N`` line. It is parsed
with ``json`` and a regular expression, never evaluated. Each episode gets ``metadata["judge"]``:
``{"score", "reason", "judge"}``, or ``{"score": None, "error", "raw", "judge"}`` when the reply
had no score, so a failure is kept and counted (``metrics.judge.parse_failures``), never dropped.
An endpoint that cannot be reached stops the evaluation with one line naming its URL.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from trajtune.envs.adapters.openai_policy import PolicyError, endpoint_policy, from_openai_message, to_openai_messages
from trajtune.errors import ModelLoadError, UsageError, require_at_least, require_input
from trajtune.schema import Message, Trajectory
from trajtune.serve import local_service

DEFAULT_RUBRIC = """\
You are grading one episode of an AI agent that solves a task by calling tools.

Score the episode from 0 to 10:

- 10: the task is fully and correctly done; every tool call was needed, well-formed and used its
  results correctly; the final answer is right and says only what the results support.
- 7-9: the task is done, with minor problems (a redundant call, a small inaccuracy, a clumsy answer).
- 4-6: partly done: a required step is missing or one result was misread, but the approach was sound.
- 1-3: mostly wrong: wrong tools or arguments, ignored errors, or an answer the results contradict.
- 0: nothing useful, malformed output, an unsafe or invented action, or a claim of success without doing the task.

Judge what the agent did, as shown, not what it says it did. Penalise made-up facts and tool results.
"""

#: Appended to every rubric (the default or a file), so the reply has a shape ``parse_score`` reads.
ANSWER_FORMAT = ('Reply with only a JSON object: {"score": <number on the rubric\'s scale>, '
                 '"reason": "<one or two sentences>"}.')

#: Longest text kept of one message / of the whole rendered episode (head and tail are kept).
MAX_MESSAGE_CHARS = 2000
MAX_EPISODE_CHARS = 24000


class JudgeParseError(ValueError):
    """The judge's reply holds no score."""


# ---------------------------------------------------------------------------------------------
# rendering an episode


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


def _call_text(call: Any) -> str:
    args = json.dumps(call.arguments, ensure_ascii=False, sort_keys=True) if call.arguments is not None \
        else (call.arguments_raw or "")
    return f"{call.name}({args})"


def render_episode(traj: Trajectory) -> str:
    """The episode as the judge reads it: task, transcript (calls and results), final answer, ending."""
    msgs = traj.messages
    task = next((m.text() for m in msgs if m.role == "user"), "") or ""
    parts = ["## Task", _clip(task, MAX_MESSAGE_CHARS)]
    if traj.tools:
        parts += ["## Tools the agent had", ", ".join(t.name for t in traj.tools)]
    parts.append("## Transcript")
    first_user = next((i for i, m in enumerate(msgs) if m.role == "user"), -1)
    for i, m in enumerate(msgs):
        if m.role == "system" or i == first_user:
            continue
        if m.role == "assistant":
            lines = [f"[agent] {_clip(m.text() or '', MAX_MESSAGE_CHARS)}".rstrip()]
            lines += [f"  -> tool call: {_clip(_call_text(c), MAX_MESSAGE_CHARS)}" for c in m.tool_calls or []]
            parts.append("\n".join(lines))
        elif m.role == "tool":
            who = f" {m.name}" if m.name else ""
            parts.append(f"[tool result{who}] {_clip(m.text() or '', MAX_MESSAGE_CHARS)}")
        else:
            parts.append(f"[{m.role}] {_clip(m.text() or '', MAX_MESSAGE_CHARS)}")
    final = traj.outcome.final_answer if traj.outcome else None
    if final is None:
        final = next((m.text() for m in reversed(msgs) if m.role == "assistant" and m.text()), None)
    parts += ["## Final answer", final or "(none)"]
    term = traj.outcome.termination if traj.outcome else None
    if term:
        parts += ["## How the episode ended", str(term)]
    return _clip("\n\n".join(parts), MAX_EPISODE_CHARS)


def judge_messages(traj: Trajectory, rubric: str) -> list[Message]:
    """The judging prompt: the rubric (and the answer format) as system, the episode as user."""
    return [Message(role="system", content=rubric.rstrip() + "\n\n" + ANSWER_FORMAT),
            Message(role="user", content="Grade this episode.\n\n" + render_episode(traj))]


# ---------------------------------------------------------------------------------------------
# reading the reply

_SCORE_LINE = re.compile(r"^[\s*#>_-]*score[\s*_]*[:=][\s*_]*(-?\d+(?:\.\d+)?)(?:\s*/\s*\d+(?:\.\d+)?)?",
                         re.IGNORECASE | re.MULTILINE)
_NUMBER = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(?:/\s*\d+(?:\.\d+)?)?\s*$")


def _as_score(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        x = float(value)
    elif isinstance(value, str) and _NUMBER.match(value):
        x = float(_NUMBER.match(value).group(1))  # type: ignore[union-attr]
    else:
        return None
    return x if math.isfinite(x) else None


def _json_objects(text: str) -> list[Any]:
    """Every JSON object that starts at a ``{`` in ``text`` (decoded with ``json``, in order)."""
    dec = json.JSONDecoder()
    out, i = [], text.find("{")
    while i >= 0:
        try:
            obj, end = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            i = text.find("{", i + 1)
            continue
        out.append(obj)
        i = text.find("{", end)
    return out


def parse_score(text: str) -> tuple[float, str]:
    """(score, reason) from a judge reply; ``JudgeParseError`` when there is no score in it.

    Accepted: a JSON object with a numeric ``score`` (alone, in a fenced block, or within other
    text; the first such object wins), else the last ``Score: N`` (or ``Score: N/10``) line, whose
    reason is the rest of the reply."""
    for obj in _json_objects(text or ""):
        if isinstance(obj, dict) and "score" in obj:
            score = _as_score(obj["score"])
            if score is not None:
                reason = obj.get("reason", obj.get("explanation", ""))
                return score, reason if isinstance(reason, str) else json.dumps(reason, ensure_ascii=False)
    lines = list(_SCORE_LINE.finditer(text or ""))
    if lines:
        m = lines[-1]
        reason = (text[:m.start()] + text[m.end():]).strip()
        return float(m.group(1)), reason
    raise JudgeParseError(f"no score in the judge's reply: {(text or '')[:120]!r}")


# ---------------------------------------------------------------------------------------------
# the judge

Complete = Callable[[dict[str, Any]], dict[str, Any]]


def ask(complete: Complete, model: str, messages: list[Message], max_tokens: int) -> str:
    """The reply text of one greedy request; any failure (the endpoint, or a response without a
    message) is a ValueError, which the callers count as "no answer" instead of stopping a run."""
    try:
        resp = complete({"model": model, "messages": to_openai_messages(messages), "temperature": 0.0,
                         "max_tokens": max_tokens})
        return from_openai_message(resp["choices"][0].get("message")).text() or ""
    except Exception as e:  # noqa: BLE001 - counted by the caller, never a crash
        raise ValueError(f"the judge failed: {type(e).__name__}: {str(e)[:200]}") from None


class Judge:
    """Scores trajectories through ``complete``: an OpenAI chat-completions request body → response."""

    def __init__(self, complete: Complete, *, name: str, model: str = "default", rubric: str = DEFAULT_RUBRIC,
                 max_tokens: int = 256, workers: int = 4):
        self.complete, self.name, self.model = complete, name, model
        self.rubric, self.max_tokens, self.workers = rubric, max_tokens, max(1, workers)

    def request_body(self, traj: Trajectory) -> dict[str, Any]:
        return {"model": self.model, "messages": to_openai_messages(judge_messages(traj, self.rubric)),
                "temperature": 0.0, "max_tokens": self.max_tokens}

    def reply_text(self, traj: Trajectory) -> str:
        try:
            resp = self.complete(self.request_body(traj))
        except PolicyError as e:  # unreachable, or an HTTP error: the evaluation stops, naming the judge
            raise ModelLoadError(f"--judge {self.name}: {e}") from None
        try:
            msg = from_openai_message(resp["choices"][0].get("message"))
        except (KeyError, IndexError, TypeError, AttributeError, PolicyError):  # counted, like an unreadable reply
            raise JudgeParseError("the judge's response has no choices[0].message: "
                                  + json.dumps(resp, default=str)[:200]) from None
        return msg.text() or ""

    def verdict(self, traj: Trajectory) -> dict[str, Any]:
        """``metadata["judge"]`` for one episode (see the module docstring)."""
        text = ""
        try:
            text = self.reply_text(traj)
            score, reason = parse_score(text)
        except JudgeParseError as e:
            return {"score": None, "error": str(e), "raw": text[:2000], "judge": self.name}
        return {"score": score, "reason": reason[:2000], "judge": self.name}

    def annotate(self, trajs: Sequence[Trajectory]) -> None:
        """Judge ``trajs`` (``workers`` requests at a time) and store each verdict in its metadata."""
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            verdicts = list(pool.map(self.verdict, trajs))
        for t, v in zip(trajs, verdicts):
            t.metadata["judge"] = v


def load_rubric(path: str | None) -> str:
    if path is None:
        return DEFAULT_RUBRIC
    text = require_input(path, "--judge-rubric").read_text(encoding="utf-8")
    if not text.strip():
        raise UsageError(f"--judge-rubric {path} is empty")
    return text


def make_judge(spec: str, *, model: str = "default", rubric: str | None = None, max_tokens: int = 256,
               workers: int = 4, device: str = "auto") -> Judge:
    """``openai:URL`` → a judge on that endpoint (it must answer ``GET URL/models``); anything else is a
    local model (alias, path, HF id) answered in-process as ``trajtune serve`` would."""
    require_at_least(("--judge-max-tokens", max_tokens, 1))
    text = load_rubric(rubric)
    if spec.startswith("openai:"):
        policy = endpoint_policy(spec, model, option="--judge")
        return Judge(policy.post, name=spec, model=model, rubric=text, max_tokens=max_tokens, workers=workers)

    service = local_service(spec, max_tokens=max_tokens, device=device)
    return Judge(service.complete, name=spec, model=spec, rubric=text, max_tokens=max_tokens, workers=1)


def judge_summary(scores: Sequence[float | None]) -> dict[str, Any]:
    """``metrics.judge``: episodes judged, how many replies had a score, their mean, the failures."""
    got = [s for s in scores if s is not None]
    return {"episodes": len(scores), "scored": len(got), "parse_failures": len(scores) - len(got),
            "mean_score": sum(got) / len(got) if got else None}
