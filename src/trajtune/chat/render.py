"""IR -> TokenTrajectory through the tokenizer's own chat template, by delta rendering.

Why delta rendering: the only text a model is trained on should be the text it would produce at
inference. We render the conversation up to each assistant turn with the generation prompt, then
through the turn, and take the difference: that difference (up to and including the end-of-turn
token) is the policy's, everything else is prompt or environment. Rollouts build their token
sequences from the same segments (``segment_texts``), so static data and live rollouts share one
masking path and the same token boundaries.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from trajtune.chat.templates import (
    adapt_call_ids,
    detect_end_of_turn,
    inline_reasoning,
    needs_mistral_ids,
    reasoning_mode,
    template_source,
)
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
    (default: detected from the template, else the tokenizer's eos token). ``non_prefix``: what to
    do when a template rewrites earlier turns (e.g. drops past ``<think>`` blocks): ``error``
    raises; ``split`` makes ``render_samples`` emit one sample per assistant turn, each with the
    prefix the model would really see. ``call_ids``: ``auto`` adapts ids where a template family
    requires it (Mistral: 9 alphanumeric characters), ``keep`` passes them unchanged, ``mistral``
    forces the adaptation. ``reasoning``: how ``reasoning_content`` reaches the template — ``auto``
    (``field`` if the template reads ``reasoning_content``, ``inline`` as a ``<think>`` block if it
    mentions ``<think>``, else ``drop``). ``thought`` (a visible rationale kept apart in the IR, e.g.
    ADP's ``description``): ``content`` puts it before the content, separated by a blank line, so it
    is trained; ``drop`` leaves it out. ``template_kwargs``: extra variables for the template
    (e.g. ``{"enable_thinking": False}``).
    """

    train_on: Literal["all", "last", "hint"] = "hint"
    end_of_turn: str | None = None
    non_prefix: Literal["error", "split"] = "error"
    call_ids: Literal["auto", "keep", "mistral"] = "auto"
    reasoning: Literal["auto", "field", "inline", "drop"] = "auto"
    thought: Literal["content", "drop"] = "content"
    template_kwargs: dict[str, Any] = field(default_factory=dict)


class NonPrefixError(RenderError):
    """Rendering the conversation so far is not a prefix of rendering it one turn further."""

    def __init__(self, message: str, where: str):
        super().__init__(message)
        self.where = where


def message_to_template_dict(m: Message, id_map: dict[str, str] | None = None,
                             reasoning: str = "field", thought: str = "content") -> dict[str, Any]:
    """The dict HF chat templates expect. Arguments go in as dicts (a string would be double-encoded).

    A call whose arguments could not be decoded (``arguments`` None, ``arguments_raw`` set) is
    passed as the raw string: that is the text the model wrote, and templates such as Qwen's print
    a string as-is. A custom call's free-text ``input`` goes in as ``{"input": …}`` (the form the
    react parser reads back), so the action's text is trained. ``id_map`` renames call ids (see ``templates.adapt_call_ids``); ``reasoning``
    says where ``reasoning_content`` goes (``field``, ``inline`` into the content, or ``drop``);
    ``thought`` whether a visible thought is prepended to the content.
    """
    ids = id_map or {}
    content = m.text() if m.content is not None else ""
    if m.thought and thought == "content" and m.role == "assistant":
        content = f"{m.thought}\n\n{content}" if content else m.thought
    d: dict[str, Any] = {"role": m.role, "content": content}
    if m.name is not None:
        d["name"] = m.name
    if m.tool_calls:
        calls = []
        for c in m.tool_calls:
            if c.arguments is not None:
                args: Any = c.arguments
            elif c.type == "custom" and c.input is not None:  # free-text action (ReAct name[input])
                args = {"input": c.input}
            elif c.arguments_raw is not None:
                try:
                    decoded = json.loads(c.arguments_raw)
                except json.JSONDecodeError:
                    decoded = None
                args = decoded if isinstance(decoded, dict) else c.arguments_raw
            else:
                args = {}
            calls.append({"id": ids.get(c.id, c.id), "type": "function",
                          "function": {"name": c.name, "arguments": args}})
        d["tool_calls"] = calls
    if m.tool_call_id is not None:
        d["tool_call_id"] = ids.get(m.tool_call_id, m.tool_call_id)
    if m.reasoning_content is not None:
        if reasoning == "field":
            d["reasoning_content"] = m.reasoning_content
        elif reasoning == "inline" and m.role == "assistant":
            d["content"] = inline_reasoning(m.reasoning_content, content)
    return d


def tools_to_template(tools: list[ToolSpec]) -> list[dict[str, Any]] | None:
    return [t.to_openai() for t in tools] or None


_PLACEHOLDER = "\u2063trajtune-placeholder\u2063"


def _describe(msgs: list[dict[str, Any]]) -> str:
    roles = [m["role"] for m in msgs]
    return " → ".join(roles) if len(roles) <= 12 else " → ".join(roles[:5] + ["…"] + roles[-6:])


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
        self.template = template_source(tokenizer, chat_template)
        self._gen_header: str | None = None
        self._gen_header_known = False
        ids = self.config.call_ids
        self.id_style = ("mistral" if needs_mistral_ids(self.template) else "keep") if ids == "auto" else ids
        r = self.config.reasoning
        self.reasoning = reasoning_mode(self.template) if r == "auto" else r
        eot = self.config.end_of_turn or detect_end_of_turn(self.render_text, tokenizer) \
            or getattr(tokenizer, "eos_token", None)
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
                chat_template=self.chat_template, **self.config.template_kwargs,
            )
        except Exception as e:  # jinja errors ("raise_exception" in templates) are user-facing
            raise RenderError(
                f"chat template failed to render {len(messages)} message(s) ({_describe(messages) or 'none'}"
                f"{', with generation prompt' if add_generation_prompt else ''}): {e}. Delta rendering needs "
                "the template to render every conversation prefix that ends before an assistant turn (and "
                "the turn itself); this template refuses that conversation (strict role alternation? one "
                "call per turn?) — adapt the data, fix the template, or pass --template FILE"
            ) from e
        if not isinstance(out, str):
            raise RenderError(f"apply_chat_template returned {type(out).__name__}, expected text")
        return out

    def generation_prompt_text(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        """``messages`` rendered with the generation prompt, also for templates that refuse that.

        Some templates only accept a generation prompt after a user turn (not after a tool
        result) but do render a finished assistant turn there. Then the prompt is recovered by
        rendering a placeholder assistant turn and cutting at the placeholder, and accepted only
        if it ends with the template's own generation prompt (measured after a lone user turn).
        """
        try:
            return self.render_text(messages, tools, add_generation_prompt=True)
        except RenderError as first:
            recovered = self._prompt_by_placeholder(messages, tools)
            if recovered is None:
                raise first
            return recovered

    def _prompt_by_placeholder(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str | None:
        try:
            text = self.render_text(messages + [{"role": "assistant", "content": _PLACEHOLDER}], tools, False)
        except RenderError:
            return None
        header = self._generation_header()
        cut = text.find(_PLACEHOLDER)
        if cut < 0 or header is None or not text[:cut].endswith(header):
            return None
        return text[:cut]

    def _generation_header(self) -> str | None:
        """What ``add_generation_prompt`` appends after a user turn (None if not measurable)."""
        if not self._gen_header_known:
            probe = [{"role": "user", "content": "Hi"}]
            try:
                a = self.render_text(probe, None, add_generation_prompt=False)
                b = self.render_text(probe, None, add_generation_prompt=True)
                self._gen_header = b[len(a):] if b.startswith(a) else None
            except RenderError:
                self._gen_header = None
            self._gen_header_known = True
        return self._gen_header

    def template_messages(self, messages: list[Message]) -> list[dict[str, Any]]:
        """IR messages as template dicts, with this template's id and reasoning adaptations."""
        id_map = adapt_call_ids(messages, self.id_style)
        return [message_to_template_dict(m, id_map, self.reasoning, self.config.thought) for m in messages]

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
            raise NonPrefixError(
                f"chat template is not prefix-stable at {where}: rendering diverges at character {i} "
                f"({before[max(0, i - 30):i + 30]!r} vs {after[max(0, i - 30):i + 30]!r}); "
                "the template rewrites earlier turns (e.g. drops past <think> blocks or moves the system "
                "prompt). Use render.non_prefix: split (one sample per assistant turn), or fix the template",
                where,
            )

    def _turn(self, msgs: list[dict[str, Any]], tools: list[dict[str, Any]] | None, i: int) -> tuple[str, str, str]:
        """(generation prompt before message i, policy text of message i through eot, full render)."""
        prompt = self.generation_prompt_text(msgs[:i], tools)
        full = self.render_text(msgs[: i + 1], tools, add_generation_prompt=False)
        if not full.startswith(prompt):
            # Not fixable by splitting: the turn itself does not extend its own generation prompt
            # (e.g. the prompt opens a <think> block that the rendered turn strips).
            self._prefix_check(prompt, full, f"message {i} (assistant turn vs its generation prompt)")
        policy, _tail = self.split_policy(full[len(prompt):])
        return prompt, policy, full

    # -- the segments ---------------------------------------------------------------------------
    def segment_texts(self, traj: Trajectory) -> list[tuple[int, str, int]]:
        """(source, text, message_index) segments whose concatenation is the rendered trajectory.

        Policy segments are the assistant turns through their end-of-turn string; the text a
        template puts after end-of-turn (e.g. a newline, or Phi-3's closing eos) opens the
        following segment only if the next rendering keeps it. The trajectory ends at the last
        end-of-turn if it ends with an assistant turn. Raises ``NonPrefixError`` where a later
        rendering rewrites text already emitted.
        """
        msgs = self.template_messages(traj.messages)
        tools = tools_to_template(traj.tools)
        segments: list[tuple[int, str, int]] = []
        committed = ""  # text emitted as segments so far (ends at the last end-of-turn)
        pending_source = SOURCE_PROMPT  # the first segment is always the prompt
        for i, m in enumerate(traj.messages):
            if m.role != "assistant":
                if segments and (m.role == "tool" or m.origin == "environment"):
                    pending_source = SOURCE_ENV
                continue
            prompt, policy, _full = self._turn(msgs, tools, i)
            self._prefix_check(committed, prompt, f"message {i} (generation prompt)")
            if len(prompt) > len(committed):
                segments.append((pending_source, prompt[len(committed):], i))
            segments.append((SOURCE_POLICY, policy, i))
            committed = prompt + policy
            pending_source = SOURCE_PROMPT
        if traj.messages and traj.messages[-1].role != "assistant":
            full = self.render_text(msgs, tools, add_generation_prompt=False)
            self._prefix_check(committed, full, "the final messages")
            if len(full) > len(committed):
                segments.append((pending_source, full[len(committed):], len(msgs) - 1))
        return segments

    def observation_text(self, history: list[Message], tools: list[ToolSpec], n_prev: int) -> str:
        """Text to append after an assistant turn: what the template puts after its end-of-turn,
        the new messages, and the next generation prompt. ``history[:n_prev]`` ends with that turn.

        With ``non_prefix: split`` a template that rewrites the earlier turn is tolerated here: the
        rollout keeps the tokens the model actually saw, and the observation is cut from the new
        rendering after the same number of end-of-turn strings.
        """
        msgs = self.template_messages(history)
        t = tools_to_template(tools)
        before = self.render_text(msgs[:n_prev], t, add_generation_prompt=False)
        after = self.generation_prompt_text(msgs, t)
        idx = before.rfind(self.eot)
        if idx < 0:
            raise RenderError(f"end-of-turn {self.eot!r} not found after assistant message {n_prev - 1}")
        cut = idx + len(self.eot)
        try:
            self._prefix_check(before[:cut], after, f"message {n_prev} (observation)")
        except NonPrefixError:
            if self.config.non_prefix != "split":
                raise
            k, pos = before.count(self.eot), -1
            for _ in range(k):
                pos = after.find(self.eot, pos + 1)
                if pos < 0:
                    raise
            return after[pos + len(self.eot):]
        return after[cut:]

    def prompt_text(self, messages: list[Message], tools: list[ToolSpec]) -> str:
        return self.generation_prompt_text(self.template_messages(messages), tools_to_template(tools))

    # -- tokens ---------------------------------------------------------------------------------
    def _turn_weight(self, traj: Trajectory, mi: int, last_assistant: int) -> float:
        if self.config.train_on == "last":
            return 1.0 if mi == last_assistant else 0.0
        if self.config.train_on == "hint":
            return 0.0 if traj.messages[mi].train is False else 1.0
        return 1.0

    def _token_trajectory(self, traj: Trajectory, ids: list[int], source: list[int], turn: list[int],
                          weight: list[float], meta: dict[str, Any] | None = None) -> TokenTrajectory:
        outcome = traj.outcome
        tt = TokenTrajectory(
            ids=ids, source=source, turn=turn, weight=weight, traj_id=traj.id, reward=traj.reward,
            success=outcome.success if outcome else None, termination=outcome.termination if outcome else None,
            meta=meta or {},
        )
        tt.check()
        return tt

    def render(self, traj: Trajectory) -> TokenTrajectory:
        """One TokenTrajectory for the whole conversation.

        Raises ``NonPrefixError`` (a ``RenderError``) if the template rewrites earlier turns,
        whatever ``non_prefix`` says: one sequence cannot then be trained without mis-masking.
        Use ``render_samples`` to get the per-turn split.
        """
        try:
            segments = self.segment_texts(traj)
        except NonPrefixError as e:
            if self.config.non_prefix == "split":
                raise NonPrefixError(f"{e} (render.non_prefix is 'split': use render_samples(), which "
                                     "returns one sample per assistant turn)", e.where) from e
            raise
        assistant_idx = [i for i, m in enumerate(traj.messages) if m.role == "assistant"]
        last_assistant = assistant_idx[-1] if assistant_idx else -1
        ids: list[int] = []
        source: list[int] = []
        turn: list[int] = []
        weight: list[float] = []
        n_turns = 0
        for src, text, mi in segments:
            tids = self.encode(text)
            if src == SOURCE_POLICY:
                w = self._turn_weight(traj, mi, last_assistant)
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
        return self._token_trajectory(traj, ids, source, turn, weight)

    def render_split(self, traj: Trajectory, include_untrained: bool = False) -> list[TokenTrajectory]:
        """One sample per assistant turn, each its own generation prompt + the turn through eot.

        The prefix (everything before the turn, earlier assistant turns included, as the template
        renders them at that point) is ``SOURCE_PROMPT`` with weight 0; only the turn itself is
        policy. ``turn`` is the turn's index in the conversation for every token of the sample.
        Turns with weight 0 (``train_on``) are left out unless ``include_untrained``.
        """
        msgs = self.template_messages(traj.messages)
        tools = tools_to_template(traj.tools)
        assistant_idx = [i for i, m in enumerate(traj.messages) if m.role == "assistant"]
        last_assistant = assistant_idx[-1] if assistant_idx else -1
        samples: list[TokenTrajectory] = []
        for k, i in enumerate(assistant_idx):
            w = self._turn_weight(traj, i, last_assistant)
            if w == 0.0 and not include_untrained:
                continue
            prompt, policy, _full = self._turn(msgs, tools, i)
            p_ids, a_ids = self.encode(prompt), self.encode(policy)
            samples.append(self._token_trajectory(
                traj, p_ids + a_ids, [SOURCE_PROMPT] * len(p_ids) + [SOURCE_POLICY] * len(a_ids),
                [k] * (len(p_ids) + len(a_ids)), [0.0] * len(p_ids) + [w] * len(a_ids),
                meta={"split_turn": k, "message_index": i},
            ))
        for s in samples:
            s.meta["n_samples"] = len(samples)
        return samples

    def is_prefix_stable(self, traj: Trajectory) -> bool:
        try:
            self.segment_texts(traj)
        except NonPrefixError:
            return False
        return True

    def render_samples(self, traj: Trajectory, include_untrained: bool = False) -> list[TokenTrajectory]:
        """Training samples for ``traj``: ``[render(traj)]`` where the template is prefix-stable;
        otherwise, with ``non_prefix: split``, one sample per assistant turn (``render_split``),
        and with ``non_prefix: error`` a ``NonPrefixError``. Never a silently mis-masked sequence."""
        try:
            return [self.render(traj)]
        except NonPrefixError:
            if self.config.non_prefix != "split":
                raise
        return self.render_split(traj, include_untrained=include_untrained)

def render_trajectory(traj: Trajectory, tokenizer: Any, config: RenderConfig | None = None) -> TokenTrajectory:
    return ChatRenderer(tokenizer, config).render(traj)
