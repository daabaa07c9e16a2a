"""IR -> TokenTrajectory through the tokenizer's own chat template, by delta rendering.

Why delta rendering: the only text a model is trained on should be the text it would produce at
inference. We render the conversation up to each assistant turn with the generation prompt, then
through the turn, and take the difference: that difference (up to and including the end-of-turn
token) is the policy's, everything else is prompt or environment. Rollouts build their token
sequences from the same segments (``segment_texts``), so static data and live rollouts share one
masking path and the same token boundaries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from trajtune.schema import Message, ToolSpec, Trajectory

SOURCE_PROMPT, SOURCE_POLICY, SOURCE_ENV, SOURCE_PAD = 0, 1, 2, 3
SOURCE_NAMES = {SOURCE_PROMPT: "prompt", SOURCE_POLICY: "policy", SOURCE_ENV: "env", SOURCE_PAD: "pad"}


class RenderError(ValueError):
    """The template cannot be rendered in a way that keeps the provenance contract."""


@dataclass
class TokenTrajectory:
    """Token ids with, per token, where it came from and how much it counts.

    ``turn`` is the assistant-turn index a token belongs to (for prompt/env tokens: the number of
    assistant turns before them). ``logprobs`` holds the sampling log-probabilities of policy tokens
    when the trajectory was sampled (0.0 elsewhere), ``advantages`` is filled by RL transforms.
    """

    ids: list[int]
    source: list[int]
    turn: list[int]
    weight: list[float]
    logprobs: list[float] | None = None
    advantages: list[float] | None = None
    traj_id: str = ""
    group: str = ""
    reward: float | None = None
    success: bool | None = None
    termination: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ids)

    def check(self) -> None:
        n = len(self.ids)
        for name in ("source", "turn", "weight"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"TokenTrajectory.{name} has {len(getattr(self, name))} entries for {n} ids")
        for name in ("logprobs", "advantages"):
            v = getattr(self, name)
            if v is not None and len(v) != n:
                raise ValueError(f"TokenTrajectory.{name} has {len(v)} entries for {n} ids")

    def policy_ids(self) -> list[int]:
        return [i for i, s in zip(self.ids, self.source) if s == SOURCE_POLICY]

    def n_policy(self) -> int:
        return sum(1 for s in self.source if s == SOURCE_POLICY)


@dataclass
class RenderConfig:
    """How to turn assistant turns into trained tokens.

    ``train_on``: ``all`` assistant turns, ``last`` turn only, or ``hint`` (every assistant turn
    unless its ``train`` flag is False). ``end_of_turn``: the string that closes an assistant turn
    (default: the tokenizer's eos token). ``non_prefix``: what to do when a template rewrites
    earlier turns (``error``; ``split`` arrives with the template-hardening work).
    """

    train_on: Literal["all", "last", "hint"] = "hint"
    end_of_turn: str | None = None
    non_prefix: Literal["error", "split"] = "error"


def message_to_template_dict(m: Message) -> dict[str, Any]:
    """The dict HF chat templates expect. Arguments go in as dicts (a string would be double-encoded)."""
    d: dict[str, Any] = {"role": m.role, "content": m.text() if m.content is not None else ""}
    if m.name is not None:
        d["name"] = m.name
    if m.tool_calls:
        d["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments if c.arguments is not None else {}},
            }
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        d["tool_call_id"] = m.tool_call_id
    if m.reasoning_content is not None:
        d["reasoning_content"] = m.reasoning_content
    return d


def tools_to_template(tools: list[ToolSpec]) -> list[dict[str, Any]] | None:
    return [t.to_openai() for t in tools] or None


class ChatRenderer:
    """Renders conversations with one tokenizer's chat template and tokenizes them in segments."""

    def __init__(self, tokenizer: Any, config: RenderConfig | None = None, chat_template: str | None = None):
        self.tok = tokenizer
        self.config = config or RenderConfig()
        self.chat_template = chat_template
        if chat_template is None and not getattr(tokenizer, "chat_template", None):
            raise RenderError(
                "the tokenizer has no chat template; pass one (render.chat_template / --template FILE) "
                "or use a model whose tokenizer_config.json defines `chat_template`"
            )
        eot = self.config.end_of_turn or getattr(tokenizer, "eos_token", None)
        if not eot:
            raise RenderError("no end-of-turn string: the tokenizer has no eos_token; set render.end_of_turn")
        self.eot = eot
        self._eot_ids = self.encode(eot)

    # -- text -------------------------------------------------------------------------------
    def render_text(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                    add_generation_prompt: bool) -> str:
        try:
            out = self.tok.apply_chat_template(
                messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt,
                chat_template=self.chat_template,
            )
        except Exception as e:  # jinja errors ("raise_exception" in templates) are user-facing
            raise RenderError(f"chat template failed to render {len(messages)} message(s): {e}") from e
        if not isinstance(out, str):
            raise RenderError(f"apply_chat_template returned {type(out).__name__}, expected text")
        return out

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"]) if text else []

    def split_policy(self, delta: str) -> tuple[str, str]:
        """Split an assistant delta into (text through end-of-turn, trailing text)."""
        idx = delta.rfind(self.eot)
        if idx < 0:
            raise RenderError(
                f"end-of-turn {self.eot!r} not found in the rendered assistant turn {delta[-80:]!r}; "
                "set render.end_of_turn to the string your template closes assistant turns with"
            )
        cut = idx + len(self.eot)
        return delta[:cut], delta[cut:]

    def _prefix_check(self, before: str, after: str, where: str) -> None:
        if not after.startswith(before):
            i = next((k for k, (a, b) in enumerate(zip(before, after)) if a != b), min(len(before), len(after)))
            raise RenderError(
                f"chat template is not prefix-stable at {where}: rendering diverges at character {i} "
                f"({before[max(0, i - 30):i + 30]!r} vs {after[max(0, i - 30):i + 30]!r}); "
                "the template rewrites earlier turns (e.g. drops past <think> blocks). "
                "Use render.non_prefix: split, or fix the template"
            )

    # -- the segments ---------------------------------------------------------------------------
    def segment_texts(self, traj: Trajectory) -> list[tuple[int, str, int]]:
        """(source, text, message_index) segments whose concatenation is the rendered trajectory.

        Policy segments are the assistant turns through their end-of-turn string; the text a
        template puts after end-of-turn (e.g. a newline) opens the following segment. The
        trajectory ends at the last end-of-turn if it ends with an assistant turn.
        """
        msgs = [message_to_template_dict(m) for m in traj.messages]
        tools = tools_to_template(traj.tools)
        segments: list[tuple[int, str, int]] = []
        rendered = ""  # text covered so far, including a pending tail after the last eot
        covered = 0  # length of ``rendered`` already emitted as segments
        pending_source = SOURCE_PROMPT  # the first segment is always the prompt
        for i, m in enumerate(traj.messages):
            if m.role != "assistant":
                if segments and (m.role == "tool" or m.origin == "environment"):
                    pending_source = SOURCE_ENV
                continue
            prompt = self.render_text(msgs[:i], tools, add_generation_prompt=True)
            self._prefix_check(rendered, prompt, f"message {i} (generation prompt)")
            if len(prompt) > covered:
                segments.append((pending_source, prompt[covered:], i))
            full = self.render_text(msgs[: i + 1], tools, add_generation_prompt=False)
            self._prefix_check(prompt, full, f"message {i} (assistant turn)")
            policy, tail = self.split_policy(full[len(prompt):])
            segments.append((SOURCE_POLICY, policy, i))
            rendered = full
            covered = len(full) - len(tail)
            pending_source = SOURCE_PROMPT
        if traj.messages and traj.messages[-1].role != "assistant":
            full = self.render_text(msgs, tools, add_generation_prompt=False)
            self._prefix_check(rendered, full, "the final messages")
            if len(full) > covered:
                segments.append((pending_source, full[covered:], len(msgs) - 1))
        return segments

    def observation_text(self, history: list[Message], tools: list[ToolSpec], n_prev: int) -> str:
        """Text to append after an assistant turn: what the template puts after its end-of-turn,
        the new messages, and the next generation prompt. ``history[:n_prev]`` ends with that turn."""
        msgs = [message_to_template_dict(m) for m in history]
        t = tools_to_template(tools)
        before = self.render_text(msgs[:n_prev], t, add_generation_prompt=False)
        after = self.render_text(msgs, t, add_generation_prompt=True)
        self._prefix_check(before, after, f"message {n_prev} (observation)")
        idx = before.rfind(self.eot)
        if idx < 0:
            raise RenderError(f"end-of-turn {self.eot!r} not found after assistant message {n_prev - 1}")
        return before[idx + len(self.eot):] + after[len(before):]

    def prompt_text(self, messages: list[Message], tools: list[ToolSpec]) -> str:
        return self.render_text([message_to_template_dict(m) for m in messages], tools_to_template(tools),
                                add_generation_prompt=True)

    # -- tokens ---------------------------------------------------------------------------------
    def render(self, traj: Trajectory) -> TokenTrajectory:
        return self.render_many([traj])[0]

    def render_many(self, trajs: list[Trajectory]) -> list[TokenTrajectory]:
        """Render many trajectories, tokenizing all their segments in one batched call (much faster)."""
        all_segments = [self.segment_texts(t) for t in trajs]
        flat = [text for segs in all_segments for _, text, _ in segs]
        encoded = self.tok(flat, add_special_tokens=False)["input_ids"] if flat else []
        out = []
        k = 0
        for traj, segs in zip(trajs, all_segments):
            out.append(self._assemble(traj, segs, encoded[k:k + len(segs)]))
            k += len(segs)
        return out

    def _assemble(self, traj: Trajectory, segments: list[tuple[int, str, int]],
                  encoded: list[list[int]]) -> TokenTrajectory:
        assistant_idx = [i for i, m in enumerate(traj.messages) if m.role == "assistant"]
        last_assistant = assistant_idx[-1] if assistant_idx else -1
        ids: list[int] = []
        source: list[int] = []
        turn: list[int] = []
        weight: list[float] = []
        n_turns = 0
        for (src, _text, mi), tids in zip(segments, encoded):
            tids = list(tids)
            if src == SOURCE_POLICY:
                m = traj.messages[mi]
                if self.config.train_on == "last":
                    w = 1.0 if mi == last_assistant else 0.0
                elif self.config.train_on == "hint":
                    w = 0.0 if m.train is False else 1.0
                else:
                    w = 1.0
                ids += tids
                source += [SOURCE_POLICY] * len(tids)
                turn += [n_turns] * len(tids)
                weight += [w] * len(tids)
                n_turns += 1
            else:
                ids += tids
                source += [src] * len(tids)
                turn += [n_turns] * len(tids)
                weight += [0.0] * len(tids)
        outcome = traj.outcome
        tt = TokenTrajectory(
            ids=ids, source=source, turn=turn, weight=weight, traj_id=traj.id, reward=traj.reward,
            success=outcome.success if outcome else None, termination=outcome.termination if outcome else None,
        )
        tt.check()
        return tt


def render_trajectory(traj: Trajectory, tokenizer: Any, config: RenderConfig | None = None) -> TokenTrajectory:
    return ChatRenderer(tokenizer, config).render(traj)

