"""``fold``: any environment, with ``branch`` and ``return`` tools that fold a sub-task out of the context.

Why: a long-horizon episode outgrows the model's window, and most of what fills it (a finished
sub-task's reads and writes) is no longer needed. With this wrapper the agent calls
``branch(description)`` to start a sub-task and ``return(summary)`` when it is done; the rollout
then drops the sub-task's turns from the active context, keeps the ``branch`` call and answers it
with the summary (Context-Folding, Sun et al. 2025; AgentFold). The KV cache is rolled back to the
branch point, not recomputed, and each folded context trains as its own row
(``trajtune.folding``; ``trajtune.rollout``).

The wrapper itself only keeps the rules and says what happened (``info["fold"]``: ``branch`` or
``return``, with the summary); the rollout does the folding. Where nothing folds (the message-level
runner, an API model) the episode is an ordinary linear one in which ``branch`` and ``return`` are
acknowledged tool calls.

Rules (a broken one is an error observation, counted in ``info["fold_error"]``; the episode goes
on): ``branch`` and ``return`` go alone in their turn; one level of branching (``branch`` inside a
branch is refused); ``return`` only inside a branch; ``description`` and ``summary`` are non-empty
strings; a summary longer than ``max_summary_chars`` is cut there. A branch that never returns is
not an error: the episode ends where the environment or ``max_turns`` ends it, and the record says
so (``metadata["unreturned_branch"]``).

The expert: where the inner environment's expert marks its sub-tasks (``extra["subtask"]`` on the
messages of each, the description as its value), the wrapper's expert wraps each in ``branch`` …
``return`` and records it folded, with the first line of the sub-task's last observation as the summary. SFT on that
record trains every folded context (``folding.expand_folds``).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from trajtune.envs.base import Environment, ResetResult, StepResult, Task
from trajtune.folding import BRANCH_TOOL, FOLD_KEY, RETURN_TOOL
from trajtune.schema import Message, ToolCall, ToolSpec, Trajectory

#: ``Message.extra`` key an inner expert puts on the messages of a sub-task (its description).
SUBTASK_KEY = "subtask"

FOLD_SYSTEM = ("For each sub-task, call branch with its description, do the sub-task, then call return with a "
               "one-line summary; the sub-task's steps then leave your context and only the summary stays.")

TOOLS = [
    ToolSpec(name=BRANCH_TOOL, description="Start a sub-task. Its steps leave your context when you return.",
             parameters={"type": "object", "properties": {"description": {"type": "string"}},
                         "required": ["description"], "additionalProperties": False}),
    ToolSpec(name=RETURN_TOOL, description="Finish the sub-task with a one-line summary of its result.",
             parameters={"type": "object", "properties": {"summary": {"type": "string"}},
                         "required": ["summary"], "additionalProperties": False}),
]


class FoldOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_summary_chars: int = Field(200, gt=0, description="a longer summary is cut to this many characters")
    instructions: bool = Field(True, description="append how to branch and return to the system prompt")


def started_text(description: str) -> str:
    return f"Branch started: {description}"


def returned_text(summary: str) -> str:
    return f"Branch returned: {summary}"


def _tool_msg(call: ToolCall, text: str) -> Message:
    return Message(role="tool", tool_call_id=call.id, name=call.name, content=text, origin="environment")


def folds(env: Environment) -> bool:
    """Whether ``env`` is, or wraps, the ``fold`` wrapper (its episodes can have several rows)."""
    seen = 0
    while env is not None and seen < 16:
        if isinstance(env, FoldEnv):
            return True
        env = env.__dict__.get("inner")  # type: ignore[assignment]
        seen += 1
    return False


class FoldEnv(Environment):
    """Any environment, with a sub-task's turns foldable out of the context (module doc)."""

    folds_context = True  # the rollout records folds (0 too) for episodes of this environment

    def __init__(self, inner: Environment, options: FoldOptions):
        self.inner, self.options = inner, options
        self.name = f"fold({inner.name})"
        self.description = f"{inner.description} (with branch / return context folding)"
        self.max_turns = 3 * getattr(inner, "max_turns", 8)
        self.deterministic = inner.deterministic
        self.reward_terms = tuple(getattr(inner, "reward_terms", ()))
        self.install = getattr(inner, "install", "")
        self.in_branch = False

    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        return self.inner.tasks(split, n, seed)

    def splits(self) -> dict[str, int] | None:
        return self.inner.splits()

    def _with_instructions(self, messages: list[Message]) -> list[Message]:
        if not self.options.instructions:
            return messages
        out = list(messages)
        for i, m in enumerate(out):
            if m.role == "system" and isinstance(m.content, str):
                out[i] = m.model_copy(update={"content": f"{m.content} {FOLD_SYSTEM}"})
                return out
        return [Message(role="system", content=FOLD_SYSTEM)] + out

    def reset(self, task: Task) -> ResetResult:
        self.in_branch = False
        res = self.inner.reset(task)
        return ResetResult(messages=self._with_instructions(list(res.messages)), tools=list(res.tools) + TOOLS)

    def _refuse(self, calls: list[ToolCall], text: str, kind: str) -> StepResult:
        return StepResult([_tool_msg(c, f"Error: {text}") for c in calls], info={"fold_error": kind})

    def step(self, action: Message) -> StepResult:
        calls = action.tool_calls or []
        ours = [c for c in calls if c.name in (BRANCH_TOOL, RETURN_TOOL)]
        if not ours:
            out = self.inner.step(action)
            if isinstance(out.info.get("tools"), list) and out.info["tools"]:
                out.info = {**out.info, "tools": list(out.info["tools"]) + TOOLS}
            return out
        if len(calls) > 1:
            return self._refuse(calls, f"call {ours[0].name} alone in its turn", "not_alone")
        call = calls[0]
        key, what = ("description", "a description") if call.name == BRANCH_TOOL else ("summary", "a summary")
        text = (call.arguments or {}).get(key)
        if not isinstance(text, str) or not text.strip():
            return self._refuse(calls, f"{call.name} needs {what} (a non-empty string)", f"no_{key}")
        if call.name == BRANCH_TOOL:
            if self.in_branch:
                return self._refuse(calls, "already inside a branch; call return first (one level of branching)",
                                    "nested_branch")
            self.in_branch = True
            return StepResult([_tool_msg(call, started_text(text.strip()))], info={"fold": {"event": "branch"}})
        if not self.in_branch:
            return self._refuse(calls, "return outside a branch; call branch first", "return_outside_branch")
        self.in_branch = False
        summary = text.strip()[: self.options.max_summary_chars]
        return StepResult([_tool_msg(call, returned_text(summary))],
                          info={"fold": {"event": "return", "summary": summary}})

    def success(self) -> bool:
        return self.inner.success()

    def render(self) -> str:
        return f"[{'in a branch' if self.in_branch else 'main'}] {self.inner.render()}"

    def expert(self, task: Task) -> Trajectory:
        """The inner expert's trajectory with each marked sub-task folded (module doc)."""
        inner = self.inner.expert(task)
        n_head = next((i for i, m in enumerate(inner.messages) if m.role not in ("system", "user")),
                      len(inner.messages))
        out = self._with_instructions(inner.messages[:n_head])
        body = inner.messages[n_head:]
        k = 0
        i = 0
        while i < len(body):
            sub = body[i].extra.get(SUBTASK_KEY)
            if not isinstance(sub, str):
                out.append(body[i])
                i += 1
                continue
            j = i
            while j < len(body) and body[j].extra.get(SUBTASK_KEY) == sub:
                j += 1
            own = body[i:j]
            last_obs = next((m.text() for m in reversed(own) if m.role == "tool"), "done")
            summary = (last_obs.splitlines() or ["done"])[0][: self.options.max_summary_chars]
            b = ToolCall(id=f"fold{k}b", name=BRANCH_TOOL, arguments={"description": sub})
            r = ToolCall(id=f"fold{k}r", name=RETURN_TOOL, arguments={"summary": summary})
            mark = {FOLD_KEY: {"branch": k}}
            out.append(Message(role="assistant", tool_calls=[b]))
            out.append(Message(role="tool", tool_call_id=b.id, name=BRANCH_TOOL, content=started_text(sub),
                               origin="environment", extra=mark))
            out += [m.model_copy(update={"extra": {**m.extra, **mark}}) for m in own]
            out.append(Message(role="assistant", tool_calls=[r], extra=mark))
            out.append(Message(role="tool", tool_call_id=b.id, name=BRANCH_TOOL, content=returned_text(summary),
                               origin="environment", extra={FOLD_KEY: {"summary": k}}))
            k += 1
            i = j
        return inner.model_copy(update={"messages": out, "tools": list(inner.tools) + TOOLS,
                                        "metadata": {**inner.metadata, "env": self.name, "folds": k}})

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)
