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
import os
import re
from dataclasses import dataclass
from typing import Any, Literal

from trajtune import errors
from trajtune.chat.parsers import detect_parser, parse_tool_calls
from trajtune.chat.profile import (
    PROBE_ARG_VALUE,
    PROBE_CALL_ID,
    PROBE_RESULT,
    PROBE_TOOL,
    PROBE_TOOL_DESC,
    PROBE_TOOL_NAME,
    TemplateProfile,
    probe_call,
    probe_template,
    probe_tool_role,
    reasoning_inline,
)
from trajtune.chat.templates import (
    adapt_call_ids,
    detect_call_end_of_turn,
    detect_end_of_turn,
    inline_reasoning,
    needs_mistral_ids,
    special_strings,
    template_source,
)
from trajtune.chat.tool_formats import FALLBACK_ORDER, TOOL_FORMATS, ToolFormat
from trajtune.folding import expand_folds, is_folded
from trajtune.schema import Message, ToolCall, ToolSpec, Trajectory
from trajtune.settings import setting

# The token-level contract lives in trajtune.tokens; re-exported here for the renderer's users.
from trajtune.tokens import (  # noqa: E402,F401
    SOURCE_ENV,
    SOURCE_NAMES,
    SOURCE_PAD,
    SOURCE_POLICY,
    SOURCE_PROMPT,
    TokenTrajectory,
)


class RenderError(errors.RenderError):
    """The template cannot be rendered in a way that keeps the provenance contract."""


ToolFormatName = Literal["auto", "native", "hermes", "llama3_json", "pythonic", "lfm2"]


@dataclass
class RenderConfig:
    """How to turn assistant turns into trained tokens. Each field is also a config key
    (``render.*``, and ``data.train_on``): ``config.RenderSpec`` is built from these fields, so a
    setting is declared here only, with its default and description.

    Details the descriptions leave out: ``train_on: hint`` trains every assistant turn unless its
    ``train`` flag is False; ``all_tokens`` keeps provenance as it is, only weights change.
    ``end_of_turn`` falls back to the tokenizer's eos token where the template shows nothing (an
    answer and a tool call may close differently). ``non_prefix: split`` makes ``render_samples``
    emit one sample per assistant turn, each with the prefix the model would really see.
    ``call_ids: auto`` adapts ids where a template family requires it, ``keep`` passes them
    unchanged. ``reasoning: auto`` is ``field`` if the template renders a reasoning field,
    ``inline`` if it handles ``<think>``, else ``drop``. ``thought: content`` puts the thought
    before the content, separated by a blank line. ``tool_format: auto`` picks ``native`` where
    the template renders tools and calls and its calls parse back; where it renders the tools but
    reads calls only from the content (LFM2), the format that writes them in that family's own
    syntax; else the first fallback that renders. ``assistant_prefix`` is added at the token
    level (the template never sees it); a message that records its own prefix
    (``extra["assistant_prefix"]``, as rollouts do) keeps that one.
    """

    train_on: Literal["all", "last", "hint", "all_tokens"] = setting(
        "hint", description="which assistant turns carry loss: all, the last one, or as each message's train hint "
                            "says (all when there is none); all_tokens: every token, system, user and tool results "
                            "too (agentic continual pre-training; the only choice for format: text)")
    end_of_turn: str | list[str] | None = setting(
        None, description="string(s) closing an assistant turn; default: detected per turn type from the template")
    non_prefix: Literal["error", "split"] = setting(
        "error", description="templates that rewrite earlier turns: refuse (error) or one sample per turn (split)")
    call_ids: Literal["auto", "keep", "mistral"] = setting(
        "auto", description="adapt tool-call ids to what the template accepts (mistral: 9 alphanumeric characters)")
    reasoning: Literal["auto", "field", "inline", "drop"] = setting(
        "auto", description="where reasoning_content goes: the template's reasoning field, an inline <think> block, "
        "or nowhere")
    thought: Literal["content", "drop"] = setting(
        "content", description="a visible thought (e.g. ADP's description): trained before the content, or dropped")
    tool_format: ToolFormatName = setting(
        "auto", description="native: the template's own tool support; hermes / llama3_json / pythonic: tools, calls "
        "and results written as text in that convention; lfm2: the template lists the tools, calls are written "
        "into the content as LFM2 does; auto: native where the template renders tools and calls, its own call "
        "syntax where it reads calls only from the content, else hermes")
    system_role: Literal["auto", "native", "fold"] = setting(
        "auto", description="fold: the system prompt goes into the first user turn (auto: when the template refuses "
        "a system message)")
    tool_role: Literal["auto", "native", "user"] = setting(
        "auto", description="user: tool results are rendered as user turns (auto: when the template refuses tool "
        "messages)")
    content_format: Literal["auto", "string", "parts"] = setting(
        "auto", description="parts: message content passed as a list of text parts (auto: when the template ignores "
        "plain strings)")
    arguments_format: Literal["auto", "dict", "string"] = setting(
        "auto", description="string: tool-call arguments passed as JSON text (auto: when the template prints "
        "arguments as given)")
    template_kwargs: dict[str, Any] = setting(
        default_factory=dict, description="extra template variables, e.g. {enable_thinking: false}")
    assistant_prefix: str | None = setting(
        None, description="text injected right after the assistant header of every agent turn and kept in the "
        "history (a prefix injection guard, docs/ping.md); prompt tokens: no loss, no RL credit")


#: Where a rollout records the prefix it injected before an assistant turn (``Message.extra``).
PREFIX_KEY = "assistant_prefix"


class NonPrefixError(RenderError):
    """Rendering the conversation so far is not a prefix of rendering it one turn further."""

    def __init__(self, message: str, where: str):
        super().__init__(message)
        self.where = where


def _template_args(c: ToolCall, as_string: bool) -> Any:
    """A call's arguments for a template: a dict (a string would be double-encoded), or the JSON
    string for templates that print arguments as given. A call whose arguments could not be decoded
    (``arguments`` None, ``arguments_raw`` set) is passed as the raw string: that is the text the model
    wrote, and templates such as Qwen's print a string as-is. A custom call's free-text ``input`` goes
    in as ``{"input": …}`` (the form the react parser reads back), so the action's text is trained."""
    if c.arguments is not None:
        return json.dumps(c.arguments, ensure_ascii=False) if as_string else c.arguments
    if c.type == "custom" and c.input is not None:  # a free-text action (ReAct name[input]): trained as text
        args = {"input": c.input}
        return json.dumps(args, ensure_ascii=False) if as_string else args
    if c.arguments_raw is not None:
        try:
            decoded = json.loads(c.arguments_raw)
        except json.JSONDecodeError:
            decoded = None
        if isinstance(decoded, dict) and not as_string:
            return decoded
        return c.arguments_raw
    return "{}" if as_string else {}


def message_to_template_dict(m: Message, id_map: dict[str, str] | None = None,
                             reasoning: str = "field", thought: str = "content", *,
                             tool_format: ToolFormat | None = None, arguments: str = "dict",
                             reasoning_field: str = "reasoning_content") -> dict[str, Any]:
    """The dict HF chat templates expect for one IR message.

    ``id_map`` renames call ids (see ``templates.adapt_call_ids``); ``reasoning`` says where
    ``reasoning_content`` goes (``field`` under the key ``reasoning_field``, ``inline`` into the
    content, or ``drop``); ``thought`` whether a visible thought is prepended to the content. With a
    ``tool_format`` the calls are written into the content as text and tool results wrapped in that
    format's markup; ``arguments`` is ``dict`` or ``string`` (JSON text, for templates that print it).
    """
    ids = id_map or {}
    content = m.text() if m.content is not None else ""
    if m.thought and thought == "content" and m.role == "assistant":
        content = f"{m.thought}\n\n{content}" if content else m.thought
    if tool_format is not None and m.role == "tool":
        content = tool_format.result_text(content)
    d: dict[str, Any] = {"role": m.role, "content": content}
    if m.name is not None:
        d["name"] = m.name
    if m.tool_calls and tool_format is not None:
        d["content"] = tool_format.assistant_text(content, m.tool_calls)
    elif m.tool_calls:
        d["tool_calls"] = [{"id": ids.get(c.id, c.id), "type": "function",
                            "function": {"name": c.name, "arguments": _template_args(c, arguments == "string")}}
                           for c in m.tool_calls]
    if m.tool_call_id is not None:
        d["tool_call_id"] = ids.get(m.tool_call_id, m.tool_call_id)
    if m.reasoning_content is not None:
        if reasoning == "field":
            d[reasoning_field] = m.reasoning_content
        elif reasoning == "inline" and m.role == "assistant":
            d["content"] = inline_reasoning(m.reasoning_content, d["content"])
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
                "the tokenizer has no chat template; pass one (model.chat_template in the config, --template FILE "
                "on the command line) or use a model whose tokenizer_config.json defines `chat_template`"
            )
        self.template = template_source(tokenizer, chat_template)
        self._gen_header: str | None = None
        self._gen_header_known = False
        ids = self.config.call_ids
        self.id_style = ("mistral" if needs_mistral_ids(self.template) else "keep") if ids == "auto" else ids
        self.format: ToolFormat | None = None
        self.profile = self._profile()
        self.reasoning, self.reasoning_field = self._reasoning()
        self.tool_format, self.tool_format_reason = self._resolve_tool_format()
        self.format = TOOL_FORMATS.get(self.tool_format)
        self._probe_tool_role()
        self.eots = self._end_of_turns()
        self.eot = self.eots[0]
        self._eot_re = re.compile("|".join(re.escape(e) for e in sorted(self.eots, key=len, reverse=True)))

    # -- what the template can do ------------------------------------------------------------
    def _profile(self) -> TemplateProfile:
        """Probe the template, then apply the config's explicit choices over what was measured."""
        p = probe_template(self.render_text)
        c = self.config
        for key, attr in (("system_role", "system_role"), ("content_format", "content"),
                          ("arguments_format", "arguments")):
            value = getattr(c, key)
            if value != "auto" and value != getattr(p, attr):
                setattr(p, attr, value)
                p.notes.append(f"render.{key}: {value} (set in the config)")
        return p

    def _reasoning(self) -> tuple[str, str]:
        r, found = self.config.reasoning, self.profile.reasoning_field
        if r == "auto":
            r = "field" if found else ("inline" if reasoning_inline(self.template) else "drop")
        return r, found or "reasoning_content"

    def _resolve_tool_format(self) -> tuple[str, str]:
        """``native`` where the template renders tools and calls and the calls parse back; else the
        first text format whose probe conversation renders completely."""
        chosen = self.config.tool_format
        if chosen != "auto":
            return chosen, "set in the config"
        p = self.profile
        if p.tools_rendered and p.calls_rendered:
            why = self._native_roundtrip_problem()
            if why is None:
                return "native", "the template renders tools and tool calls, and its calls parse back"
        elif p.tools_rendered and (own := self._content_call_format()) is not None:
            return own.name, ("the template lists the tools but reads tool calls only from the assistant content: "
                              f"calls are written there as the model writes them ({own.name})")
        else:
            missing = [w for w, ok in (("tools", p.tools_rendered), ("tool calls", p.calls_rendered)) if not ok]
            why = f"the template does not render {' or '.join(missing)}"
        for name in FALLBACK_ORDER:
            if self._fallback_renders(TOOL_FORMATS[name]):
                return name, f"{why}: tools, calls and results are written as {name} text"
        raise RenderError(f"{why}, and no text tool format renders through it either (hermes, llama3_json, "
                          "pythonic were tried); pass a template with --template FILE / model.chat_template")

    def _native_roundtrip_problem(self) -> str | None:
        parser = detect_parser(self.template)
        if parser is None:
            return "no tool-call parser recognises the template's call format"
        user = {"role": "user", "content": self._wrap("Hi")}
        call = probe_call(self.profile.arguments)
        call_turn = {"role": "assistant", "content": self._wrap(""), "tool_calls": [call]}
        try:
            prompt = self.render_text([user], [PROBE_TOOL], True)
            full = self.render_text([user, call_turn], [PROBE_TOOL], False)
        except RenderError as e:
            return f"the template fails on a tool call ({e})"
        body = full[len(prompt):] if full.startswith(prompt) else full[full.find("Hi") + 2:]
        want = [(PROBE_TOOL_NAME, {"zq_key": PROBE_ARG_VALUE})]
        # The turn ends with closing tokens the parser need not understand (``<|end|>``, an eos):
        # peel them off one at a time until the call reads back.
        specials = special_strings(self.tok)
        while True:
            parsed = parse_tool_calls(body, parser, reasoning=True)
            if [(c.name, c.arguments) for c in parsed.tool_calls] == want:
                return None
            stripped = body.rstrip(" \t\r\n")
            last = next((t for t in specials if stripped.endswith(t)), None)
            if last is None:
                return f"the {parser!r} parser does not read back the template's calls"
            body = stripped[: -len(last)]

    def _content_call_format(self) -> ToolFormat | None:
        """The format for a template that lists the tools but never reads ``tool_calls``, where its
        source shows a call syntax one format writes (LFM2's ``<|tool_call_start|>``): that format,
        if its probe conversation renders and its calls parse back; else None."""
        parser = detect_parser(self.template)
        call = ToolCall(id=PROBE_CALL_ID, name=PROBE_TOOL_NAME, arguments={"zq_key": PROBE_ARG_VALUE})
        for fmt in TOOL_FORMATS.values():
            if not fmt.native_tool_list or fmt.parser != parser:
                continue
            back = parse_tool_calls(fmt.call_text([call]), parser).tool_calls
            if [(c.name, c.arguments) for c in back] == [(call.name, call.arguments)] and self._fallback_renders(fmt):
                return fmt
        return None

    def _fallback_renders(self, fmt: ToolFormat) -> bool:
        tools = [ToolSpec(name=PROBE_TOOL_NAME, description=PROBE_TOOL_DESC)]
        call = ToolCall(id=PROBE_CALL_ID, name=PROBE_TOOL_NAME, arguments={"zq_key": PROBE_ARG_VALUE})
        # (no tool result here: how results reach the template is probed once the format is known)
        msgs = [Message(role="user", content="Hi"), Message(role="assistant", tool_calls=[call])]
        saved = self.format
        self.format = fmt
        try:
            dicts, t = self.template_inputs(msgs, tools)
            text = self.render_text(dicts, t, False)
        except RenderError:
            return False
        finally:
            self.format = saved
        return all(w in text for w in (PROBE_TOOL_NAME, PROBE_TOOL_DESC, PROBE_ARG_VALUE))

    def _probe_tool_role(self) -> None:
        if self.config.tool_role != "auto":
            self.profile.tool_role = self.config.tool_role
            self.profile.notes.append(f"render.tool_role: {self.config.tool_role} (set in the config)")
            return
        if self.format is None:
            assistant = {"role": "assistant", "content": self._wrap(""), "tool_calls": [probe_call(self.profile.arguments)]}
            tools: Any = [PROBE_TOOL]
        else:
            assistant = {"role": "assistant", "content": self._wrap("<tool_call>x</tool_call>")}
            tools = None
        wrapped = self.format is not None and not self.format.native_tool_list  # (else the template wraps results)
        probe_tool_role(self.render_text, self.profile, assistant, tools, text_format=wrapped)

    def _end_of_turns(self) -> list[str]:
        """The strings that close an assistant turn: an answer's closer first, then a call's if it differs."""
        given = self.config.end_of_turn
        self.closer_appended = False
        if given:
            return [given] if isinstance(given, str) else list(given)
        final, self.closer_appended = detect_end_of_turn(self.render_text, self.tok, self._wrap)
        eots = [final] if final else []
        if self.format is None and self.profile.calls_rendered:
            user = {"role": "user", "content": self._wrap("Hi")}
            call_turn = {"role": "assistant", "content": self._wrap(""),
                         "tool_calls": [probe_call(self.profile.arguments)]}
            result = {"role": "tool" if self.profile.tool_role == "native" else "user",
                      "tool_call_id": PROBE_CALL_ID, "content": self._wrap(PROBE_RESULT)}
            call_eot = detect_call_end_of_turn(self.render_text, self.tok, [user], call_turn, result, [PROBE_TOOL],
                                               PROBE_ARG_VALUE, appended=self.closer_appended)
            if call_eot and call_eot not in eots:
                eots.append(call_eot)
        if not eots:
            eos = getattr(self.tok, "eos_token", None)
            if not eos:
                raise RenderError("no end-of-turn string: the tokenizer has no eos_token; set render.end_of_turn")
            eots = [eos]
        return eots

    def _wrap(self, text: str) -> Any:
        return [{"type": "text", "text": text}] if self.profile.content == "parts" else text

    def describe(self) -> list[str]:
        """What this renderer does with the template, in words (for ``trajtune doctor``)."""
        lines = [f"tool format: {self.tool_format} ({self.tool_format_reason}); parser: {self.parser}"]
        lines += self.profile.notes
        if len(self.eots) > 1:
            lines.append(f"end of turn differs by turn type: {self.eots[0]!r} after an answer, "
                         f"{self.eots[1]!r} after a tool call")
        return lines

    @property
    def parser(self) -> str | None:
        """The registered parser that reads this renderer's tool calls back from model text."""
        if self.format is not None:
            return self.format.parser
        return detect_parser(self.template)

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

    def template_inputs(self, messages: list[Message],
                        tools: list[ToolSpec] | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        """IR messages and tools as this template takes them: ``(messages, tools)`` for
        ``apply_chat_template``, with every adaptation the profile and the tool format call for.

        Each adaptation is local to a message or to the start of the conversation, so converting a
        prefix of a conversation gives a prefix of the converted conversation wherever it ends at
        an assistant turn: delta rendering stays exact.
        """
        id_map = adapt_call_ids(messages, self.id_style)
        p, fmt = self.profile, self.format
        dicts = [message_to_template_dict(m, id_map, self.reasoning, self.config.thought, tool_format=fmt,
                                          arguments=p.arguments, reasoning_field=self.reasoning_field)
                 for m in messages]
        if p.tool_role == "user":
            dicts = [{"role": "user", "content": d["content"]} if d["role"] == "tool" else d for d in dicts]
        template_tools = tools_to_template(tools or [])
        if fmt is not None and tools and not fmt.native_tool_list:
            tool_text = fmt.system_text(tools)
            template_tools = None
            if dicts and dicts[0]["role"] == "system":
                first = dicts[0]["content"]
                dicts[0] = {**dicts[0], "content": f"{first}\n\n{tool_text}" if first else tool_text}
            else:
                dicts.insert(0, {"role": "system", "content": tool_text})
        if p.system_role == "fold":
            dicts = _fold_system(dicts)
        if p.alternation:
            dicts = _merge_user_side(dicts)
        if p.content == "parts":
            dicts = [{**d, "content": [{"type": "text", "text": d["content"]}]} if isinstance(d.get("content"), str)
                     else d for d in dicts]
        return dicts, template_tools

    def turn_prefix(self, m: Message) -> str:
        """The text injected right after the assistant header of ``m`` ("" for none): the prefix the
        message records (what the model really saw), else ``assistant_prefix`` of the config."""
        if m.role != "assistant":
            return ""
        recorded = m.extra.get(PREFIX_KEY)
        if isinstance(recorded, str):
            return recorded
        return self.config.assistant_prefix or ""

    def prompt_ids(self, messages: list[Message], tools: list[ToolSpec]) -> list[int]:
        """The token ids a model continues from for the next assistant turn: the generation prompt,
        with every earlier turn's assistant prefix in its place and this turn's at the end (the same
        ids a rollout reaching this point holds). Without any prefix: the encoded ``prompt_text``."""
        guard = self.config.assistant_prefix or ""
        if (not guard and not any(self.turn_prefix(m) for m in messages)) or (messages and messages[-1].role == "assistant"):
            return self.encode(self.prompt_text(messages, tools)) + self.encode(guard)
        try:
            segments = self.segment_texts(Trajectory(id="prompt", messages=list(messages), tools=list(tools)),
                                          generation_prompt=True)
        except NonPrefixError:  # the template rewrites history: earlier prefixes cannot be placed
            return self.encode(self.prompt_text(messages, tools)) + self.encode(guard)
        return [i for _, text, _ in segments for i in self.encode(text)]

    def template_messages(self, messages: list[Message], tools: list[ToolSpec] | None = None) -> list[dict[str, Any]]:
        """IR messages as template dicts (see ``template_inputs``)."""
        return self.template_inputs(messages, tools)[0]

    def stop_ids(self) -> list[int]:
        """The token ids generation stops on: one per end-of-turn string (each must be one token)."""
        out = []
        for e in self.eots:
            ids = self.encode(e)
            if len(ids) != 1:
                raise RenderError(f"end-of-turn {e!r} must be a single token to stop generation, got {ids}; add it "
                                  "as a special token or set render.end_of_turn")
            out.append(ids[0])
        return out

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"]) if text else []

    def _last_eot_end(self, text: str) -> int:
        """Index just after the last end-of-turn string in ``text``, or -1."""
        ends = [text.rfind(e) + len(e) for e in self.eots if e in text]
        return max(ends) if ends else -1

    def split_policy(self, delta: str) -> tuple[str, str]:
        """Split an assistant delta into (text through end-of-turn, trailing text)."""
        cut = self._last_eot_end(delta)
        if cut < 0:
            raise RenderError(
                f"end-of-turn {' or '.join(map(repr, self.eots))} not found in the rendered assistant turn "
                f"{delta[-80:]!r}; set render.end_of_turn to the string your template closes assistant turns with"
            )
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

    def _turn(self, traj: Trajectory, i: int, reanchor: bool = False) -> tuple[str, str]:
        """(generation prompt before message i, policy text of message i through end-of-turn).

        Some templates rewrite the history once a turn follows it (GPT-OSS drops the reasoning of
        earlier turns), so the rendering through turn i does not start with the prompt the model
        saw. With ``reanchor`` (one sample per turn) the turn is then cut out of that rendering at
        its own header and put after the real prompt; otherwise that is a ``NonPrefixError``.
        """
        before, tools = self.template_inputs(traj.messages[:i], traj.tools)
        through, _ = self.template_inputs(traj.messages[: i + 1], traj.tools)
        prompt = self.generation_prompt_text(before, tools)
        full = self.render_text(through, tools, add_generation_prompt=False)
        if full.startswith(prompt):
            turn: str | None = full[len(prompt):]
        else:
            turn = self._reanchored_turn(before, tools, prompt, full) if reanchor else None
            if turn is None and reanchor:
                raise RenderError(
                    f"trajectory {traj.id!r}, message {i}: the generation prompt ends with "
                    f"{prompt[-40:]!r}, but the template renders the finished turn without that opening "
                    f"({full[len(os.path.commonprefix([prompt, full])):][:60]!r}): it cuts part of what the model "
                    "writes out of every rendered turn (e.g. reasoning after a '<think>' the prompt opens), so the "
                    "turn the model would really write cannot be recovered from this template. Pass a template "
                    "that renders the trained turn in full (--template FILE / model.chat_template)")
            if turn is None:
                self._prefix_check(prompt, full, f"message {i} (assistant turn vs its generation prompt)")
        assert turn is not None
        if self.closer_appended:
            return prompt, turn + self._closer(traj.messages[i])
        return prompt, self.split_policy(turn)[0]

    def _closer(self, m: Message) -> str:
        """For templates that write no closer: the token that ends this kind of turn (a call turn is
        ended by the tool result's opener, an answer by the user's)."""
        if m.tool_calls and self.format is None and len(self.eots) > 1:
            return self.eots[1]
        return self.eots[0]

    def _reanchored_turn(self, before: list[dict[str, Any]], tools: Any, prompt: str, full: str) -> str | None:
        """The last turn of ``full`` after its assistant header, or None where it cannot be found.

        The header is what the generation prompt appends; the turn starts at the last header inside
        the text ``full`` shares with the same history followed by a placeholder answer (so an
        assistant message holding several headers, GPT-OSS analysis + final, stays whole)."""
        header = self._generation_header()
        if not header or not prompt.endswith(header):
            return None
        try:
            ph = self.render_text(before + [{"role": "assistant", "content": self._wrap(_PLACEHOLDER)}], tools, False)
        except RenderError:
            return None
        common = next((k for k, (a, b) in enumerate(zip(full, ph)) if a != b), min(len(full), len(ph)))
        pos = full.rfind(header, 0, common)
        return full[pos + len(header):] if pos >= 0 else None

    # -- the segments ---------------------------------------------------------------------------
    def segment_texts(self, traj: Trajectory, generation_prompt: bool = False) -> list[tuple[int, str, int]]:
        """(source, text, message_index) segments whose concatenation is the rendered trajectory.

        Policy segments are the assistant turns through their end-of-turn string; the text a
        template puts after end-of-turn (e.g. a newline, or Phi-3's closing eos) opens the
        following segment only if the next rendering keeps it. The trajectory ends at the last
        end-of-turn if it ends with an assistant turn. Raises ``NonPrefixError`` where a later
        rendering rewrites text already emitted, and ``RenderError`` where the template drops a
        message's content, a call or a tool result (see ``verify``).

        ``assistant_prefix`` (``turn_prefix``) is a prompt segment of its own between a turn's
        generation prompt and the turn: the template never sees it (so any template keeps its own
        rendering of the turn), and it is tokenized apart, exactly as a rollout appends it. With
        ``generation_prompt`` a conversation that does not end with an assistant turn ends with the
        next turn's generation prompt and prefix (``prompt_ids``).
        """
        segments: list[tuple[int, str, int]] = []
        committed = ""  # text emitted as segments so far (ends at the last end-of-turn)
        pending_source = SOURCE_PROMPT  # the first segment is always the prompt
        for i, m in enumerate(traj.messages):
            if m.role != "assistant":
                if segments and (m.role == "tool" or m.origin == "environment"):
                    pending_source = SOURCE_ENV
                continue
            prompt, policy = self._turn(traj, i)
            self._prefix_check(committed, prompt, f"message {i} (generation prompt)")
            if len(prompt) > len(committed):
                segments.append((pending_source, prompt[len(committed):], i))
            guard = self.turn_prefix(m)
            if guard:
                segments.append((SOURCE_PROMPT, guard, i))
            segments.append((SOURCE_POLICY, policy, i))
            committed = prompt + policy
            pending_source = SOURCE_PROMPT
        if traj.messages and traj.messages[-1].role != "assistant":
            msgs, tools = self.template_inputs(traj.messages, traj.tools)
            full = (self.generation_prompt_text(msgs, tools) if generation_prompt
                    else self.render_text(msgs, tools, add_generation_prompt=False))
            self._prefix_check(committed, full, "the final messages")
            if len(full) > len(committed):
                segments.append((pending_source, full[len(committed):], len(traj.messages) - 1))
            if generation_prompt and self.config.assistant_prefix:
                segments.append((SOURCE_PROMPT, self.config.assistant_prefix, len(traj.messages)))
        self.verify(traj, {mi: t for src, t, mi in segments if src == SOURCE_POLICY}, "".join(t for _, t, _ in segments))
        return segments

    def verify(self, traj: Trajectory, policy: dict[int, str], text: str) -> None:
        """Refuse a rendering that lost part of the conversation: an assistant message's content, a
        tool call (name and argument keys), a tool result, or the tools themselves.

        ``policy`` maps assistant message indices to their policy text, ``text`` is everything
        rendered. A template that silently drops these would train the model on a conversation
        different from the data, so this is an error, never a warning.
        """
        def seen(needle: str, hay: str) -> bool:
            needle = needle.strip()
            return not needle or needle in hay or json.dumps(needle, ensure_ascii=False)[1:-1] in hay \
                or json.dumps(needle)[1:-1] in hay

        hint_fmt = "set render.tool_format: hermes (tools, calls and results written as text)"
        for i, m in enumerate(traj.messages):
            where = f"trajectory {traj.id!r}, message {i} ({m.role})"
            if m.role == "assistant" and i in policy:
                body = policy[i]
                if not seen(m.text(), body):
                    hint = ("the template drops an assistant turn's content when it has tool calls; " + hint_fmt
                            + ", or remove that content") if m.tool_calls else "check the template"
                    raise RenderError(f"{where}: its content does not appear in the rendered turn: {hint}")
                for c in m.tool_calls or []:
                    keys = list(c.arguments) if isinstance(c.arguments, dict) else []
                    missing = [w for w in [c.name] + keys if not seen(w, body)]
                    if missing:
                        raise RenderError(f"{where}: tool call {c.name!r} is not rendered ({', '.join(map(repr, missing))} "
                                          f"missing from the turn): {hint_fmt}")
            elif m.role == "tool" and not seen(m.text(), text):
                raise RenderError(f"{where}: the tool result does not appear in the rendered text: set "
                                  "render.tool_role: user (results rendered as user turns)")
        absent = [t.name for t in traj.tools if t.name not in text]
        if absent and any(m.role == "assistant" for m in traj.messages):
            raise RenderError(f"trajectory {traj.id!r}: tools {absent} do not appear in the rendered prompt, so the "
                              f"model would never see them: {hint_fmt}")

    def observation_text(self, history: list[Message], tools: list[ToolSpec], n_prev: int) -> str:
        """Text to append after an assistant turn: what the template puts after its end-of-turn,
        the new messages, and the next generation prompt. ``history[:n_prev]`` ends with that turn.

        With ``non_prefix: split`` a template that rewrites the earlier turn is tolerated here: the
        rollout keeps the tokens the model actually saw, and the observation is cut from the new
        rendering after the same number of end-of-turn strings.
        """
        msgs, t = self.template_inputs(history, tools)
        prev, _ = self.template_inputs(history[:n_prev], tools)
        before = self.render_text(prev, t, add_generation_prompt=False)
        after = self.generation_prompt_text(msgs, t)
        if self.closer_appended:  # the sampled turn already ends with the next message's opener
            self._prefix_check(before, after, f"message {n_prev} (observation)")
            rest = after[len(before):]
            closer = next((e for e in self.eots if rest.startswith(e)), "")
            return rest[len(closer):]
        cut = self._last_eot_end(before)
        if cut < 0:
            raise RenderError(f"end-of-turn {self.eot!r} not found after assistant message {n_prev - 1}")
        try:
            self._prefix_check(before[:cut], after, f"message {n_prev} (observation)")
        except NonPrefixError:
            if self.config.non_prefix != "split":
                raise
            k = len(self._eot_re.findall(before))
            found = list(self._eot_re.finditer(after))
            if len(found) < k:
                raise
            return after[found[k - 1].end():]
        return after[cut:]

    def prompt_text(self, messages: list[Message], tools: list[ToolSpec]) -> str:
        return self.generation_prompt_text(*self.template_inputs(messages, tools))

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
                weight += [1.0 if self.config.train_on == "all_tokens" else 0.0] * len(tids)
        return self._token_trajectory(traj, ids, source, turn, weight)

    def render_split(self, traj: Trajectory, include_untrained: bool = False) -> list[TokenTrajectory]:
        """One sample per assistant turn, each its own generation prompt + the turn through eot.

        The prefix (everything before the turn, earlier assistant turns included, as the template
        renders them at that point) is ``SOURCE_PROMPT`` with weight 0; only the turn itself is
        policy. ``turn`` is the turn's index in the conversation for every token of the sample.
        Turns with weight 0 (``train_on``) are left out unless ``include_untrained``.
        """
        if self.config.train_on == "all_tokens":  # the split repeats each prefix: its tokens would count n times
            raise RenderError("train_on: all_tokens needs a template that keeps earlier turns unchanged "
                              "(render.non_prefix: split repeats every prefix)")
        assistant_idx = [i for i, m in enumerate(traj.messages) if m.role == "assistant"]
        last_assistant = assistant_idx[-1] if assistant_idx else -1
        samples: list[TokenTrajectory] = []
        policies: dict[int, str] = {}
        seen_text = ""
        for k, i in enumerate(assistant_idx):
            prompt, policy = self._turn(traj, i, reanchor=True)
            policies[i] = policy
            seen_text += prompt + policy
            w = self._turn_weight(traj, i, last_assistant)
            if w == 0.0 and not include_untrained:
                continue
            # (the template rewrites history here: only this turn's own prefix can be placed)
            p_ids, a_ids = self.encode(prompt) + self.encode(self.turn_prefix(traj.messages[i])), self.encode(policy)
            samples.append(self._token_trajectory(
                traj, p_ids + a_ids, [SOURCE_PROMPT] * len(p_ids) + [SOURCE_POLICY] * len(a_ids),
                [k] * (len(p_ids) + len(a_ids)), [0.0] * len(p_ids) + [w] * len(a_ids),
                meta={"split_turn": k, "message_index": i},
            ))
        if traj.messages and traj.messages[-1].role != "assistant":
            seen_text += self.render_text(*self.template_inputs(traj.messages, traj.tools), add_generation_prompt=False)
        self.verify(traj, policies, seen_text)
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
        and with ``non_prefix: error`` a ``NonPrefixError``. Never a silently mis-masked sequence.
        A folded record (context folding) renders as its rows, each context it was sampled in
        (``folding.expand_folds``)."""
        if is_folded(traj) and "fold_row" not in traj.metadata:
            return [s for row in expand_folds(traj) for s in self.render_samples(row, include_untrained)]
        try:
            return [self.render(traj)]
        except NonPrefixError:
            if self.config.non_prefix != "split":
                raise
        return self.render_split(traj, include_untrained=include_untrained)


def _fold_system(dicts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """System messages folded into the next user message (for templates that refuse the role)."""
    out: list[dict[str, Any]] = []
    pending: list[str] = []
    for d in dicts:
        if d["role"] == "system":
            pending.append(d["content"])
            continue
        if pending and d["role"] == "user":
            d = {**d, "content": "\n\n".join(pending + [d["content"]])}
            pending = []
        out.append(d)
    if pending:
        raise RenderError("the template refuses system messages and no user message follows the system prompt to "
                          "fold it into; add a user turn or pass a template that accepts a system role")
    return out


def _merge_user_side(dicts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive user messages merged into one (for templates that require strict alternation)."""
    out: list[dict[str, Any]] = []
    for d in dicts:
        if out and d["role"] == "user" and out[-1]["role"] == "user":
            out[-1] = {**out[-1], "content": f"{out[-1]['content']}\n\n{d['content']}"}
        else:
            out.append(d)
    return out


def render_trajectory(traj: Trajectory, tokenizer: Any, config: RenderConfig | None = None) -> TokenTrajectory:
    return ChatRenderer(tokenizer, config).render(traj)
