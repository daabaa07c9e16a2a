"""Template conformance checks: will this chat template train an agent correctly?

Why: the most reported agent-training failure in other frameworks is a chat template that
silently mis-masks — it rewrites earlier turns, drops tool calls or the system prompt, never
trains the end-of-turn token, or renders calls in a form the rollout parser cannot read back.
``check_template`` renders a probe tool conversation through the template and reports each of
those properties; ``trajtune doctor`` prints it and training commands call it at start-up to
refuse a template that fails.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from trajtune.chat.parsers import available_parsers, parse_tool_calls
from trajtune.chat.render import (
    SOURCE_POLICY,
    ChatRenderer,
    NonPrefixError,
    RenderConfig,
    RenderError,
    TokenTrajectory,
)
from trajtune.chat.templates import strip_jinja_comments
from trajtune.schema import Message, ToolCall, ToolSpec, Trajectory

Status = Literal["pass", "warn", "fail", "skip"]


@dataclass
class Check:
    """One conformance property. ``fail`` blocks training; ``warn`` is worth reading."""

    name: str
    status: Status
    detail: str


@dataclass
class DoctorReport:
    """The outcome of ``check_template``; ``ok`` is False when any check failed."""

    checks: list[Check] = field(default_factory=list)
    end_of_turn: str | None = None
    end_of_turns: list[str] = field(default_factory=list)
    parser: str | None = None
    tool_format: str | None = None
    adaptations: list[str] = field(default_factory=list)
    prefix_stable: bool | None = None
    non_prefix: str = "error"

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    @property
    def warnings(self) -> list[Check]:
        return [c for c in self.checks if c.status == "warn"]

    def get(self, name: str) -> Check | None:
        return next((c for c in self.checks if c.name == name), None)

    def add(self, name: str, status: Status, detail: str) -> None:
        self.checks.append(Check(name, status, detail))

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "end_of_turn": self.end_of_turn, "end_of_turns": self.end_of_turns,
                "parser": self.parser, "tool_format": self.tool_format, "adaptations": self.adaptations,
                "prefix_stable": self.prefix_stable, "non_prefix": self.non_prefix,
                "checks": [asdict(c) for c in self.checks]}

    def format_text(self) -> str:
        marks = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "skip": "skip"}
        width = max((len(c.name) for c in self.checks), default=10)
        lines = [f"{marks[c.status]}  {c.name.ljust(width)}  {c.detail}" for c in self.checks]
        n_fail, n_warn = len(self.failures), len(self.warnings)
        verdict = "OK: the template can be trained on" if self.ok else \
            f"NOT OK: {n_fail} failing check(s); training would refuse this template"
        lines.append(f"\n{verdict} ({n_warn} warning(s)); tool format {self.tool_format!r}, end-of-turn "
                     f"{' / '.join(map(repr, self.end_of_turns or [self.end_of_turn]))}, parser {self.parser!r}")
        return "\n".join(lines)


# -- the probe conversation ---------------------------------------------------------------------

SYSTEM_PROMPT = "You are a careful home assistant."
PROBE_TOOLS = [
    ToolSpec(name="get_weather", description="Current weather for a city.",
             parameters={"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                         "required": ["city"]}),
    ToolSpec(name="create_reminder", description="Store a reminder for later.",
             parameters={"type": "object", "properties": {"text": {"type": "string"}, "tags": {"type": "array"}}}),
]


def probe_trajectory(content_with_call: bool = True) -> Trajectory:
    """Two user turns, two tool calls (unicode, nested quotes, lists, nested objects), reasoning on
    every assistant turn: the situations where real templates break."""
    c1 = ToolCall(id="call_000000", name="get_weather", arguments={"city": "Zürich", "unit": "celsius"})
    c2 = ToolCall(id="call_000001", name="create_reminder",
                  arguments={"text": 'bring an "umbrella" ☂', "tags": ["rain", "déjà vu"], "at": {"hour": 8}})
    msgs = [
        Message(role="system", content=SYSTEM_PROMPT),
        Message(role="user", content="What is the weather in Zürich?"),
        Message(role="assistant", content="Let me check." if content_with_call else None,
                reasoning_content="The user wants the weather; call get_weather.", tool_calls=[c1]),
        Message(role="tool", tool_call_id=c1.id, content='{"temp": 21, "sky": "rain"}'),
        Message(role="assistant", content="It is 21 °C and raining in Zürich.",
                reasoning_content="The tool answered."),
        Message(role="user", content="Remind me to bring an umbrella."),
        Message(role="assistant", reasoning_content="Store the reminder.", tool_calls=[c2]),
        Message(role="tool", tool_call_id=c2.id, content="ok"),
        Message(role="assistant", content="Done: reminder stored.", reasoning_content="All set."),
    ]
    return Trajectory(id="doctor-probe", messages=msgs, tools=PROBE_TOOLS)


def _parallel_probe() -> Trajectory:
    a = ToolCall(id="call_000000", name="get_weather", arguments={"city": "Oslo"})
    b = ToolCall(id="call_000001", name="get_weather", arguments={"city": "Lima"})
    return Trajectory(id="doctor-parallel", tools=PROBE_TOOLS, messages=[
        Message(role="user", content="Weather in Oslo and Lima?"),
        Message(role="assistant", tool_calls=[a, b]),
        Message(role="tool", tool_call_id=a.id, content="cold"),
        Message(role="tool", tool_call_id=b.id, content="warm"),
        Message(role="assistant", content="Oslo is cold, Lima warm."),
    ])


# -- checks -------------------------------------------------------------------------------------

def _policy_turns(tok: Any, samples: list[TokenTrajectory]) -> dict[int, tuple[str, list[int], list[float]]]:
    """Assistant-turn index -> (decoded policy text, policy ids, policy weights)."""
    out: dict[int, tuple[list[int], list[float]]] = {}
    for s in samples:
        for i, src, t, w in zip(s.ids, s.source, s.turn, s.weight):
            if src == SOURCE_POLICY:
                ids, ws = out.setdefault(t, ([], []))
                ids.append(i)
                ws.append(w)
    return {t: (tok.decode(ids, skip_special_tokens=False), ids, ws) for t, (ids, ws) in out.items()}


def _mask_check(report: DoctorReport, renderer: ChatRenderer, traj: Trajectory, tt: TokenTrajectory) -> None:
    """Compare the template's own {% generation %} mask with trajtune's provenance."""
    if not re.search(r"\{%-?\s*generation\s*-?%\}", renderer.template):
        report.add("generation_markers", "skip", "no {% generation %} markers: return_assistant_tokens_mask is "
                   "unusable with this template (trajtune masks by delta rendering and does not need them)")
        return
    msgs, tools = renderer.template_inputs(traj.messages, traj.tools)
    try:
        out = renderer.tok.apply_chat_template(
            msgs, tools=tools, tokenize=True,
            return_dict=True, return_assistant_tokens_mask=True, chat_template=renderer.chat_template,
            **renderer.config.template_kwargs)
        mask = list(out["assistant_masks"])
        hf_ids = list(out["input_ids"])
    except Exception as e:  # a template/tokenizer that cannot produce the mask
        report.add("generation_markers", "warn", f"could not compute the assistant mask: {e}")
        return
    tok = renderer.tok

    def spans(ids: list[int], flags: list[bool]) -> list[str]:
        res, cur = [], []
        for i, f in zip(ids, flags):
            if f:
                cur.append(i)
            elif cur:
                res.append(tok.decode(cur, skip_special_tokens=False))
                cur = []
        if cur:
            res.append(tok.decode(cur, skip_special_tokens=False))
        return res

    ours = spans(tt.ids, [s == SOURCE_POLICY for s in tt.source])
    theirs = spans(hf_ids, [bool(m) for m in mask])
    n_turns = sum(1 for m in traj.messages if m.role == "assistant")
    if not any(mask):
        report.add("generation_markers", "warn", "the {% generation %} markers mark nothing")
    elif ours == theirs:
        report.add("generation_markers", "pass",
                   f"assistant mask from {{% generation %}} equals trajtune's provenance on all {n_turns} turns")
    else:
        diff = next(((a, b) for a, b in zip(ours, theirs) if a != b), (ours[len(theirs):] or [""], theirs[len(ours):] or [""]))
        report.add("generation_markers", "warn",
                   f"the template's assistant mask disagrees with provenance ({len(theirs)} marked spans vs "
                   f"{len(ours)} turns; first difference {str(diff[0])[-60:]!r} vs {str(diff[1])[-60:]!r}); trajtune "
                   "trains on provenance, but tools using return_assistant_tokens_mask would mis-mask")


def check_template(tokenizer: Any, chat_template: str | None = None, parser: str | None = None,
                   config: RenderConfig | None = None) -> DoctorReport:
    """Run every conformance check on ``tokenizer``'s template (or ``chat_template``).

    ``config`` is the render configuration training will use (tool format, end of turn, …); with
    ``non_prefix: split`` a template that rewrites history only warns (training splits turns), with
    ``error`` it fails. ``parser`` defaults to the one the renderer uses for its tool format.
    """
    config = config or RenderConfig()
    report = DoctorReport(non_prefix=config.non_prefix)
    try:
        renderer = ChatRenderer(tokenizer, config, chat_template=chat_template)
    except RenderError as e:
        report.add("template", "fail", str(e))
        return report
    report.add("template", "pass", f"{len(renderer.template)} characters; call ids: {renderer.id_style}; "
               f"reasoning: {renderer.reasoning}")
    _check_tool_format(report, renderer)
    _check_end_of_turn(report, renderer, config)
    _check_system_and_tools(report, renderer)
    report.parser = parser or renderer.parser
    if report.parser is None:
        report.add("parser", "warn", "no tool-call format recognised in the template; pass --parser NAME "
                   f"({', '.join(available_parsers())}) or set render.tool_format: hermes")
    else:
        how = "given" if parser else ("of the tool format" if renderer.format else "detected from the template")
        report.add("parser", "pass", f"{report.parser!r} ({how})")
    probe = probe_trajectory(content_with_call=False)
    split_renderer = _split_renderer(renderer, tokenizer, config, chat_template)
    samples = _check_render(report, renderer, split_renderer, probe)
    if samples is None:
        return report
    turns = _policy_turns(renderer.tok, samples)
    assistants = [m for m in probe.messages if m.role == "assistant"]
    _check_provenance(report, renderer, assistants, turns)
    _check_assistant_content(report, split_renderer)
    if report.prefix_stable:
        _check_tokenization(report, renderer, samples[0])
        _mask_check(report, renderer, probe, samples[0])
    else:
        report.add("generation_markers", "skip", "not prefix-stable: compared per sample only through provenance")
    _check_roundtrip(report, renderer, assistants, turns)
    _check_call_ids(report, renderer, probe)
    _check_parallel_calls(report, split_renderer)
    _check_thinking(report, renderer, assistants, turns)
    return report


def _split_renderer(renderer: ChatRenderer, tokenizer: Any, config: RenderConfig,
                    chat_template: str | None) -> ChatRenderer:
    if config.non_prefix == "split":
        return renderer
    return ChatRenderer(tokenizer, RenderConfig(**{**config.__dict__, "non_prefix": "split"}), chat_template)


def _check_tool_format(report: DoctorReport, r: ChatRenderer) -> None:
    report.tool_format = r.tool_format
    report.adaptations = list(r.profile.notes)
    detail = f"{r.tool_format}: {r.tool_format_reason}"
    if r.profile.notes:
        detail += "; adaptations: " + "; ".join(r.profile.notes)
    report.add("tool_format", "pass", detail)


def _check_end_of_turn(report: DoctorReport, r: ChatRenderer, config: RenderConfig) -> None:
    """Each end-of-turn string is one token (generation stops on it) and the model stops there."""
    report.end_of_turn = r.eot
    report.end_of_turns = list(r.eots)
    eos = getattr(r.tok, "eos_token", None)
    how = "set in config" if config.end_of_turn else ("the eos token" if r.eot == eos else
                                                      f"detected from the template (eos is {eos!r})")
    bad = {e: r.encode(e) for e in r.eots if len(r.encode(e)) != 1}
    if bad:
        e, ids = next(iter(bad.items()))
        report.add("end_of_turn", "fail", f"{e!r} is {len(ids)} tokens ({how}); generation cannot stop on it — add "
                   "it as a special token or set render.end_of_turn")
        return
    kinds = " / ".join(f"{e!r} (id {r.encode(e)[0]})" for e in r.eots)
    per_type = " (answer / tool call)" if len(r.eots) > 1 else ""
    report.add("end_of_turn", "pass", f"{kinds}{per_type} one token each, {how}")


def _check_system_and_tools(report: DoctorReport, r: ChatRenderer) -> None:
    probe = probe_trajectory()
    try:
        msgs, tools = r.template_inputs(probe.messages[:2], probe.tools)
        text = r.render_text(msgs, tools, add_generation_prompt=True)
    except RenderError as e:
        report.add("system_and_tools", "fail", str(e))
        return
    wanted = [SYSTEM_PROMPT] + [t.name for t in probe.tools] + [t.description for t in probe.tools]
    missing = [w for w in wanted if w not in text]
    if missing:
        report.add("system_and_tools", "fail", f"the rendered prompt lacks {missing}: the model would never see "
                   "them (render.tool_format: auto or hermes writes tools into the system turn)")
    else:
        report.add("system_and_tools", "pass", "system prompt, tool names and descriptions are rendered")


def _check_render(report: DoctorReport, r: ChatRenderer, split: ChatRenderer,
                  probe: Trajectory) -> list[TokenTrajectory] | None:
    """Prefix stability, then the samples training would use (None if the template cannot render)."""
    why = ""
    try:
        stable = r.is_prefix_stable(probe)
    except RenderError as e:
        report.add("render", "fail", str(e))
        return None
    if not stable:
        try:
            r.segment_texts(probe)
        except NonPrefixError as e:
            why = str(e).split(";")[0]
    report.prefix_stable = stable
    if stable:
        report.add("prefix_stability", "pass", "every rendering extends the previous one over a 2-user-turn "
                   "tool conversation: one sequence per trajectory")
    elif r.config.non_prefix == "split":
        report.add("prefix_stability", "warn", f"{why}; training splits each trajectory into one sample per "
                   "assistant turn (more compute, correct masks)")
    else:
        report.add("prefix_stability", "fail", f"{why}; set render.non_prefix: split or fix the template")
    try:
        samples = split.render_samples(probe, include_untrained=True)
    except RenderError as e:
        report.add("render", "fail", str(e))
        return None
    n = sum(m.role == "assistant" for m in probe.messages)
    report.add("render", "pass", f"{len(samples)} sample(s) for a {n}-turn conversation")
    return samples


def _check_provenance(report: DoctorReport, r: ChatRenderer, assistants: list[Message],
                      turns: dict[int, tuple[str, list[int], list[float]]]) -> None:
    """Each assistant turn's policy tokens hold its calls and end with a trained end-of-turn token."""
    eot_ids = {tuple(r.encode(e)) for e in r.eots}
    problems: list[str] = []
    for k, m in enumerate(assistants):
        if k not in turns:
            problems.append(f"turn {k} has no policy tokens")
            continue
        text_k, ids_k, ws = turns[k]
        closer = next((e for e in eot_ids if tuple(ids_k[-len(e):]) == e), None)
        if closer is None:
            problems.append(f"turn {k} does not end with an end-of-turn token")
        elif not all(w > 0 for w in ws[-len(closer):]):
            problems.append(f"turn {k}'s end-of-turn token is not trained")
        for c in m.tool_calls or []:
            if c.name not in text_k:
                problems.append(f"turn {k}'s call {c.name!r} is not in its policy tokens")
    if problems:
        report.add("provenance", "fail", "; ".join(problems))
    else:
        report.add("provenance", "pass", f"all {len(assistants)} assistant turns are policy tokens ending with a "
                   "trained end-of-turn token")


def _check_assistant_content(report: DoctorReport, split: ChatRenderer) -> None:
    """A turn with both text and a call: some templates drop the text; such records are refused."""
    try:
        split.render_samples(probe_trajectory(content_with_call=True), include_untrained=True)
    except RenderError as e:
        why = "drops" if "content does not appear" in str(e) else f"refuses ({str(e.__cause__ or e)[:120]})"
        report.add("assistant_content", "warn", f"the template {why} an assistant turn's text beside tool calls: "
                   "records with both are refused (render.tool_format: hermes keeps them)")
        return
    report.add("assistant_content", "pass", "every assistant turn's content is rendered, also beside tool calls")


def _check_tokenization(report: DoctorReport, r: ChatRenderer, tt: TokenTrajectory) -> None:
    """Segment-wise encoding vs encoding the whole text at once."""
    whole = r.encode(r.tok.decode(tt.ids, skip_special_tokens=False))
    if whole == tt.ids:
        report.add("tokenization", "pass", "segment-wise tokens equal tokenizing the whole conversation")
    else:
        report.add("tokenization", "warn", "tokens merge across a segment boundary: the training sequence "
                   "differs from tokenizing the whole text (it matches what generation produces)")


def _strip_closer(r: ChatRenderer, body: str) -> str:
    cut = max((body.rfind(e) for e in r.eots if e in body), default=-1)
    return body[:cut] if cut >= 0 else body


def _check_roundtrip(report: DoctorReport, r: ChatRenderer, assistants: list[Message],
                     turns: dict[int, tuple[str, list[int], list[float]]]) -> None:
    """parse(render(call)) == call, with the parser rollouts and evaluation will use."""
    if report.parser is None:
        report.add("tool_call_roundtrip", "skip", "no parser")
        return
    bad: list[str] = []
    for k, m in enumerate(assistants):
        if not m.tool_calls or k not in turns:
            continue
        parsed = parse_tool_calls(_strip_closer(r, turns[k][0]), report.parser, reasoning=True)
        got = [(c.name, c.arguments) for c in parsed.tool_calls]
        want = [(c.name, c.arguments) for c in m.tool_calls]
        if got != want or parsed.errors:
            bad.append(f"turn {k}: parsed {got} with errors {parsed.errors}, expected {want}")
    if bad:
        report.add("tool_call_roundtrip", "fail", "; ".join(bad))
    else:
        report.add("tool_call_roundtrip", "pass", f"parse(render(call)) == call with parser {report.parser!r}")


def _check_call_ids(report: DoctorReport, r: ChatRenderer, probe: Trajectory) -> None:
    """The id a call gets must be the id its result refers to."""
    if r.id_style == "keep" or r.format is not None:
        return
    msgs, tools = r.template_inputs(probe.messages, probe.tools)
    full = r.render_text(msgs, tools, False)
    ids = [d["tool_call_id"] for d in msgs if "tool_call_id" in d]
    ok = all(full.count(i) >= 2 for i in ids)
    report.add("call_ids", "pass" if ok else "fail", f"ids adapted to the template's {r.id_style} form "
               f"({', '.join(ids)})" + ("" if ok else "; a call and its result do not share the id"))


def _check_parallel_calls(report: DoctorReport, split: ChatRenderer) -> None:
    try:
        split.render_samples(_parallel_probe(), include_untrained=True)
        report.add("parallel_calls", "pass", "two calls in one turn render")
    except RenderError as e:
        cause = str(e.__cause__ or e)[:160]
        report.add("parallel_calls", "warn", f"two calls in one turn do not render ({cause}); "
                   "data with parallel calls will be rejected")


def _check_thinking(report: DoctorReport, r: ChatRenderer, assistants: list[Message],
                    turns: dict[int, tuple[str, list[int], list[float]]]) -> None:
    """Reasoning of the trained (last) turn reaches its policy tokens?"""
    last = len(assistants) - 1
    reason = assistants[last].reasoning_content or ""
    if r.reasoning == "drop":
        code = strip_jinja_comments(r.template).lower()
        report.add("thinking", "warn" if "think" in code else "skip",
                   "the template has no reasoning field / <think> handling: reasoning in the data is not trained")
    elif last in turns and reason in turns[last][0]:
        field_name = f" as `{r.reasoning_field}`" if r.reasoning == "field" else ""
        report.add("thinking", "pass", f"reasoning ({r.reasoning}{field_name}) is rendered in the trained turn")
    else:
        report.add("thinking", "warn", f"reasoning passed as {r.reasoning!r} is not rendered in the "
                   "trained turn: the model would learn to answer without thinking")


def report_json(report: DoctorReport) -> str:
    return json.dumps(report.to_dict(), ensure_ascii=False, indent=2)
