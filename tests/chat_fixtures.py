"""Shared test data for the chat tests: twenty template families, each with a tiny tokenizer that
carries the family's special tokens, one tool conversation, and per-family functions that write
the text each template should produce for an assistant turn — written from the family's format,
independently of the renderer, so the tests compare two separate implementations.

``FAMILIES`` holds the first seven (test_chat_render.py, test_doctor.py); ``NEW_FAMILIES`` thirteen more
written from real templates (test_families.py; test_template_fixtures.py checks every Family field
against its template). Family → quirks → what trajtune must do:

===========  =====================================  ==========================================================
family       quirks (real template)                 trajtune must
===========  =====================================  ==========================================================
chatml       Qwen2.5: Hermes <tool_call>,           render as is (generation markers agree)
             {% generation %} markers
qwen3        Qwen3: <think> kept only after the     split per turn (not prefix-stable); reasoning as a field
             last user query
llama3       Llama 3.1: eot <|eot_id|> ≠ eos; one   train <|eot_id|>; warn on parallel calls / dropped content
             call per turn; content dropped
mistral      Mistral v3: 9-char call ids, tools     adapt call ids; split
             in the last user turn
gemma        Gemma 3: system folded, alternation,   train <end_of_turn>; pythonic parser
             ```tool_code``` calls
phi3         Phi-3: <|end|> ≠ eos, ReAct calls      train <|end|>; react parser
deepseek     DeepSeek V3: calls in ```json blocks,  reasoning cannot be trained: declare it
             text before </think> cut
gpt_oss      GPT-OSS harmony: `thinking` field;     reasoning as `thinking` (source-detected); train <|call|> on
             <|call|> ends a call turn, <|return|>  call turns, <|return|> on answers; one call per turn; split
             an answer; developer message; one      (analysis dropped once an answer follows, <|return|> turns
             call per turn; content+thinking on a   into <|end|>); never send content and reasoning on a call
             call turn raises                       turn
harmony      harmony-style: as gpt_oss, calls as    as gpt_oss; the harmony parser reads the recipient after the
             <|channel|>commentary to=functions.f   channel and the <|constrain|> content type
             <|constrain|>json<|message|>{…}
command_r7b  Cohere 2: <|END_RESPONSE|> before the  train through <|END_OF_TURN_TOKEN|>, not <|END_RESPONSE|>;
             stop token <|END_OF_TURN_TOKEN|>;      cut the turn at it (the template always appends the next
             add_generation_prompt ignored; call    chatbot header); cohere parser; call-turn content is lost
             ids renumbered "0", "1"…
qwen35       Qwen3.5: XML <function=…><parameter=…> xml parser; the generation prompt already opens <think>:
             calls; content string or parts;        policy tokens start inside it; split
             generation prompt ends with <think>\n
glm45        GLM-4.5: no end-of-turn string: the    train the next role token as the turn's end (<|observation|>
             next role token ends a turn;           after calls, <|user|> after answers) and append it to the
             <arg_key>/<arg_value> calls            last turn; glm45 parser; split
lfm2         LFM2: tool list in <|tool_list_start|> the template drops tool_calls: trajtune passes the tools to the
             …; tool_calls never read               template and writes each call into the content in LFM2's own
                                                    <|tool_call_start|>[f(a="x")]<|tool_call_end|> form (tool_format
                                                    auto resolves to lfm2); the `lfm2` parser reads it back
gemma4       Gemma 4: <|tool_call>call:f{k:v}       gemma4 parser; train <|tool_response> (what the model stops on
             <tool_call|>, <|"|>strings<|"|>; the   after a call) on call turns, <turn|> on answers; the answer
             result and the answer continue the     follows the result with no generation prompt; split
             call's turn; thought on call turns
nemotron     Llama-3.3-Nemotron: <TOOLCALL>[…];     nemotron parser; reasoning cannot be trained: declare it;
             every turn cut at </think>;            /think, /no_think go in the system prompt
             enable_thinking kwarg ignored
smolvlm      SmolVLM/Idefics3: content read only    send content as text parts; fallback tool format
             as parts (a string renders empty)
gemma2       Gemma 1/2: system and tool roles       fold system into the first user turn and tool results into
             refused, strict alternation; reasoning user turns, and say so in the doctor report; fallback tools;
             words only in a comment                reasoning detection must ignore comments
llama2       Llama 2: tool role refused (strict     fold tool results into user turns; train " </s>"; fallback
             alternation), system folded by the     tools
             template, " </s>", bos on every turn
deepseek_r1  R1 distill: arguments must be a JSON   refused with the reason: the generation prompt opens <think>
             string; no tool list; the 2nd call     but rendered turns never contain it (reasoning is cut out),
             turn loses its markers; generation     so the turn the model writes cannot be recovered
             prompt opens <think>
smollm2      SmolLM2 (GGUF): ChatML without tools,  fallback tool format in the system prompt and content
             default system prompt injected
===========  =====================================  ==========================================================
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from trajtune.schema import Message, ToolCall, ToolSpec, Trajectory

TEMPLATES = Path(__file__).parent / "fixtures" / "templates"


@dataclass(frozen=True)
class Family:
    """One template family: its tokens, and what its template does that the renderer must handle.

    The fields after ``added`` describe the template (checked by test_template_fixtures.py) and so
    say what trajtune must do with it; their defaults describe a plain ChatML-like template.
    """

    name: str
    special: tuple[str, ...]  # special tokens (bos/eos/pad included)
    bos: str | None
    eos: str
    pad: str
    eot: str  # what closes an assistant turn (a final answer, where it differs by turn type)
    parser: str | None  # the parser for the template's own call format; None: it has none
    prefix_stable: bool  # over the two-user-turn conversation below
    added: tuple[str, ...] = field(default=())
    native_tools: bool = True  # the template has a call format (rendered, or read from content: LFM2)
    tools_in_prompt: bool = True  # the template writes the tool list into the prompt itself
    calls_in_content: bool = False  # tool_calls are never read: calls must be written into the content
    fallback: str | None = None  # the tool format to use when the template has none (native_tools False)
    eot_call: str | None = None  # what closes a tool-call turn, where it differs from eot
    eot_by_next_turn: bool = False  # nothing closes a turn: the next message's role token (eot/eot_call) does
    end_of_response: str | None = None  # a string ending the answer BEFORE the stop token eot (not a stop)
    trailer: str = ""  # what the template writes after the last message even without a generation prompt
    system_role: str = "ok"  # "ok" | "refused" (raise_exception: fold it into the first user turn)
    tool_role: str = "ok"  # "ok" | "refused" (raise_exception: send tool results as a user turn)
    alternation: bool = False  # strict user/assistant alternation (raise_exception otherwise)
    content: str = "string"  # content read as "string", "parts" only (text parts), or "both"
    args_as_string: bool = False  # call arguments must be a JSON string (a dict raises or misrenders)
    reasoning_field: str | None = None  # the message field the template reads reasoning from, if any
    one_call_per_turn: bool = False  # a second call in one turn is dropped (or refused)
    call_ids: str = "any"  # "any", or "mistral": 9 alphanumeric characters (others raise)
    renderer: str = ""  # what trajtune must do with this template (the table above)

    @property
    def template(self) -> str:
        return (TEMPLATES / f"{self.name}.jinja").read_text()


DS = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<｜tool▁calls▁begin｜>",
      "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>",
      "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>",
      "<｜pad｜>")

FAMILIES: dict[str, Family] = {f.name: f for f in [
    Family("chatml", ("<|endoftext|>", "<|im_start|>", "<|im_end|>"), None, "<|im_end|>", "<|endoftext|>",
           "<|im_end|>", "hermes", True, ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")),
    Family("qwen3", ("<|endoftext|>", "<|im_start|>", "<|im_end|>"), None, "<|im_end|>", "<|endoftext|>",
           "<|im_end|>", "hermes", False,
           ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"),
           reasoning_field="reasoning_content"),
    Family("llama3", ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                      "<|eot_id|>", "<|eom_id|>", "<|python_tag|>", "<|finetune_right_pad_id|>"),
           "<|begin_of_text|>", "<|end_of_text|>", "<|finetune_right_pad_id|>", "<|eot_id|>", "llama3_json", True,
           one_call_per_turn=True),
    Family("mistral", ("<s>", "</s>", "<unk>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                       "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"),
           "<s>", "</s>", "<unk>", "</s>", "mistral", False, alternation=True, call_ids="mistral"),
    Family("gemma", ("<bos>", "<eos>", "<pad>", "<start_of_turn>", "<end_of_turn>"), "<bos>", "<eos>", "<pad>",
           "<end_of_turn>", "pythonic", True, alternation=True),
    Family("phi3", ("<s>", "<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"), "<s>",
           "<|endoftext|>", "<|endoftext|>", "<|end|>", "react", True),
    Family("deepseek", DS, DS[0], DS[1], DS[-1], DS[1], "deepseek", True),
]}

HARMONY = ("<|startoftext|>", "<|endoftext|>", "<|return|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>",
           "<|constrain|>", "<|call|>")
COHERE = ("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>", "<PAD>", "<|START_OF_TURN_TOKEN|>", "<|SYSTEM_TOKEN|>",
          "<|USER_TOKEN|>", "<|CHATBOT_TOKEN|>", "<|START_THINKING|>", "<|END_THINKING|>", "<|START_ACTION|>",
          "<|END_ACTION|>", "<|START_RESPONSE|>", "<|END_RESPONSE|>", "<|START_TOOL_RESULT|>", "<|END_TOOL_RESULT|>")
GLM = ("<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>")
LFM = ("<|startoftext|>", "<|im_end|>", "<|pad|>", "<|im_start|>", "<|tool_list_start|>", "<|tool_list_end|>",
       "<|tool_call_start|>", "<|tool_call_end|>", "<|tool_response_start|>", "<|tool_response_end|>")
GEMMA4 = ("<bos>", "<eos>", "<pad>", "<|turn>", "<turn|>", "<|tool>", "<tool|>", "<|tool_call>", "<tool_call|>",
          "<|tool_response>", "<tool_response|>", '<|"|>', "<|channel>", "<channel|>")
LLAMA3 = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
          "<|finetune_right_pad_id|>")
IDEFICS = ("<|im_start|>", "<end_of_utterance>", "<|im_end|>", "<|endoftext|>", "<image>",
           "<fake_token_around_image>", "<global-img>")
HERMES_TAGS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
THINK = ("<think>", "</think>")

# The families added from real templates (tested in test_families.py); FAMILIES keeps the tests
# parametrized over the first seven as they were.
NEW_FAMILIES: dict[str, Family] = {f.name: f for f in [
    Family("gpt_oss", HARMONY, HARMONY[0], "<|return|>", "<|endoftext|>", "<|return|>", "harmony", False,
           eot_call="<|call|>", reasoning_field="thinking", one_call_per_turn=True,
           renderer="pass reasoning as `thinking`; train <|call|> on call turns, <|return|> on answers; split"),
    Family("harmony", HARMONY, HARMONY[0], "<|return|>", "<|endoftext|>", "<|return|>", "harmony", False,
           eot_call="<|call|>", reasoning_field="thinking", one_call_per_turn=True,
           renderer="as gpt_oss; calls written `<|channel|>commentary to=functions.NAME <|constrain|>json`"),
    Family("command_r7b", COHERE, COHERE[0], COHERE[1], "<PAD>", "<|END_OF_TURN_TOKEN|>", "cohere", True,
           end_of_response="<|END_RESPONSE|>", trailer="<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
           reasoning_field="reasoning_content",
           renderer="train through <|END_OF_TURN_TOKEN|>, not <|END_RESPONSE|>; cut the always-added header"),
    Family("qwen35", ("<|endoftext|>", "<|im_start|>", "<|im_end|>"), None, "<|im_end|>", "<|endoftext|>",
           "<|im_end|>", "xml", False, HERMES_TAGS + THINK, content="both", reasoning_field="reasoning_content",
           renderer="parse with `xml`; the generation prompt opens <think>: policy starts inside it; split"),
    Family("glm45", GLM, None, "<|endoftext|>", "<|endoftext|>", "<|user|>", "glm45", False,
           HERMES_TAGS + THINK + ("<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"),
           eot_call="<|observation|>", eot_by_next_turn=True, content="both", reasoning_field="reasoning_content",
           renderer="train the next role token (<|observation|> / <|user|>) as the turn's end; add it on the last"),
    Family("lfm2", LFM, LFM[0], "<|im_end|>", "<|pad|>", "<|im_end|>", "lfm2", True, calls_in_content=True,
           renderer="template drops tool_calls: write <|tool_call_start|>[f(a=1)]<|tool_call_end|> into content"),
    Family("gemma4", GEMMA4, "<bos>", "<eos>", "<pad>", "<turn|>", "gemma4", False, eot_call="<|tool_response>",
           content="both", reasoning_field="reasoning_content",
           renderer="parse with `gemma4`; train <|tool_response> on call turns, <turn|> on answers; split"),
    Family("nemotron", LLAMA3, LLAMA3[0], "<|eot_id|>", "<|finetune_right_pad_id|>", "<|eot_id|>", "nemotron",
           True, renderer="parse with `nemotron`; reasoning cannot be trained (cut at </think>): declare it"),
    Family("smolvlm", IDEFICS, IDEFICS[0], "<end_of_utterance>", "<|im_end|>", "<end_of_utterance>", None, True,
           native_tools=False, tools_in_prompt=False, fallback="hermes", content="parts",
           renderer="pass content as text parts (a string renders empty); fallback tool format"),
    Family("gemma2", ("<bos>", "<eos>", "<pad>", "<start_of_turn>", "<end_of_turn>"), "<bos>", "<eos>", "<pad>",
           "<end_of_turn>", None, True, native_tools=False, tools_in_prompt=False, fallback="hermes",
           system_role="refused", tool_role="refused", alternation=True,
           renderer="fold system into the first user turn, tool results into user turns; fallback tools"),
    Family("llama2", ("<s>", "</s>", "<unk>"), "<s>", "</s>", "<unk>", "</s>", None, True, native_tools=False,
           tools_in_prompt=False, fallback="hermes", tool_role="refused", alternation=True,
           renderer="fold tool results into user turns (the template folds system itself); fallback tools"),
    Family("deepseek_r1", DS, DS[0], DS[1], DS[-1], DS[1], "deepseek", False, THINK, args_as_string=True,
           tools_in_prompt=False,
           renderer="arguments as a JSON string; end a call turn at its first eos; refuse a 2nd call turn"),
    Family("smollm2", ("<|endoftext|>", "<|im_start|>", "<|im_end|>"), "<|im_start|>", "<|im_end|>", "<|im_end|>",
           "<|im_end|>", None, True, native_tools=False, tools_in_prompt=False, fallback="hermes",
           renderer="no tool support: fallback tool format in system prompt and content; tool turns kept"),
]}
ALL_FAMILIES: dict[str, Family] = {**FAMILIES, **NEW_FAMILIES}

CORPUS = [
    "The weather in Zürich is sunny, 21 °C. Bring an umbrella tomorrow!",
    '{"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}',
    "You are a careful assistant. Use the tools when they help. Thought: Action: Action Input: Observation:",
    "def f(a=1, b='x'): return [true, false, null] # tool_code tool_output json function parameters",
    "Set a reminder: bring an umbrella. Done. Thanks! What is the weather like? I have it. Let me check.",
]


@lru_cache(maxsize=None)
def tokenizer_for(name: str) -> Any:
    """A byte-level BPE (lossless for any text) trained on a few strings, plus the family's tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    fam = ALL_FAMILIES[name]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=list(fam.special),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer=trainer)
    others = [s for s in fam.special if s not in (fam.bos, fam.eos, fam.pad)]
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=fam.bos, eos_token=fam.eos, pad_token=fam.pad,
                                   additional_special_tokens=others, clean_up_tokenization_spaces=False)
    if fam.added:
        fast.add_tokens(list(fam.added))
    fast.chat_template = fam.template
    return fast


TOOLS = [
    ToolSpec(name="get_weather", description="Current weather for a city.",
             parameters={"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                         "required": ["city"]}),
    ToolSpec(name="create_reminder", description="Store a reminder.",
             parameters={"type": "object", "properties": {"text": {"type": "string"},
                                                          "tags": {"type": "array"}, "at": {"type": "object"}}}),
]

CALL_1 = ToolCall(id="call_000000", name="get_weather", arguments={"city": "Zürich", "unit": "celsius"})
CALL_2 = ToolCall(id="call_000001", name="create_reminder",
                  arguments={"text": 'bring an "umbrella" ☂', "tags": ["weather", "déjà vu"], "at": {"hour": 8},
                             "urgent": True})


def conversation(two_users: bool = True, content_with_call: bool = False) -> Trajectory:
    """A tool conversation; with ``two_users`` a second user turn follows the first answer.

    ``content_with_call`` gives the first call turn content too (some templates drop that).
    """
    msgs = [
        Message(role="system", content="You are a careful assistant."),
        Message(role="user", content="What is the weather in Zürich?"),
        Message(role="assistant", content="Let me check." if content_with_call else None,
                reasoning_content="The user wants the weather.", tool_calls=[CALL_1.model_copy()]),
        Message(role="tool", tool_call_id="call_000000", content='{"temp": 21, "sky": "sunny"}'),
        Message(role="assistant", content="It is 21 °C and sunny in Zürich.", reasoning_content="I have it."),
    ]
    if two_users:
        msgs += [
            Message(role="user", content='Thanks! Remind me to bring an "umbrella".'),
            Message(role="assistant", reasoning_content="Store it.", tool_calls=[CALL_2.model_copy()]),
            Message(role="tool", tool_call_id="call_000001", content="ok"),
            Message(role="assistant", content="Done.", reasoning_content="Stored."),
        ]
    return Trajectory(id="conv-1", messages=msgs, tools=TOOLS, reward=1.0)


def _j(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False)


def _hermes_calls(content: str, calls: list[ToolCall]) -> str:
    out = ""
    for k, c in enumerate(calls):
        if k or content:
            out += "\n"
        out += '<tool_call>\n{"name": "' + c.name + '", "arguments": ' + _j(c.arguments) + "}\n</tool_call>"
    return out


def expect_chatml(m: Message) -> str:
    c = m.text()
    return c + _hermes_calls(c, m.tool_calls or []) + "<|im_end|>"


def expect_qwen3(m: Message) -> str:
    # The turn being generated is the last message and follows the last user query: think block kept.
    c = m.text()
    return "<think>\n" + (m.reasoning_content or "") + "\n</think>\n\n" + c + _hermes_calls(c, m.tool_calls or []) \
        + "<|im_end|>"


def expect_llama3(m: Message) -> str:
    if m.tool_calls:
        (c,) = m.tool_calls
        return '{"name": "' + c.name + '", "parameters": ' + _j(c.arguments) + "}<|eot_id|>"
    return m.text().strip() + "<|eot_id|>"


def expect_mistral(m: Message, ids: dict[str, str]) -> str:
    if m.tool_calls:
        parts = [_j({"name": c.name, "arguments": c.arguments})[:-1] + ', "id": "' + ids[c.id] + '"}'
                 for c in m.tool_calls]
        return "[TOOL_CALLS] [" + ", ".join(parts) + "]</s>"
    return " " + m.text().strip() + "</s>"


def expect_gemma(m: Message) -> str:
    c = m.text().strip()
    out = c
    if m.tool_calls:
        calls = ", ".join(f"{t.name}(" + ", ".join(f"{k}={_j(v)}" for k, v in t.arguments.items()) + ")"
                          for t in m.tool_calls)
        out += ("\n" if c else "") + "```tool_code\n[" + calls + "]\n```"
    return out + "<end_of_turn>"


def expect_phi3(m: Message) -> str:
    c = m.text()
    out = c
    for k, t in enumerate(m.tool_calls or []):
        out += ("\n" if c or k else "") + "Action: " + t.name + "\nAction Input: " + _j(t.arguments)
    return out + "<|end|>"


def expect_deepseek(m: Message) -> str:
    # Reasoning goes inline as <think>…</think>\n\n and the template keeps only what follows </think>.
    c = m.text()
    if m.reasoning_content is not None:
        c = "\n\n" + c
    if m.tool_calls:
        c += "<｜tool▁calls▁begin｜>" + "".join(
            "<｜tool▁call▁begin｜>function<｜tool▁sep｜>" + t.name + "\n```json\n" + _j(t.arguments)
            + "\n```<｜tool▁call▁end｜>" for t in m.tool_calls) + "<｜tool▁calls▁end｜>"
    return c + "<｜end▁of▁sentence｜>"


EXPECT: dict[str, Callable[..., str]] = {
    "chatml": expect_chatml, "qwen3": expect_qwen3, "llama3": expect_llama3, "mistral": expect_mistral,
    "gemma": expect_gemma, "phi3": expect_phi3, "deepseek": expect_deepseek,
}


# -- the new families -------------------------------------------------------------------------
# Each EXPECT below writes what the model generates after the template's generation prompt,
# through the string that ends the turn, as the template renders that turn when it is the last
# message (so a turn after the last user query keeps its reasoning). Families without a native
# call format have no call EXPECT: the renderer's fallback format is its own choice.


def cohere_ids(traj: Trajectory) -> dict[str, str]:
    """Command R7B renumbers call ids as ordinals over the whole conversation."""
    calls = [c.id for m in traj.messages for c in m.tool_calls or []]
    return {cid: str(k) for k, cid in enumerate(calls)}


def _py(v: Any) -> str:
    """A Python literal for a call argument (LFM2 writes calls as Python: True, None)."""
    if isinstance(v, bool) or v is None:
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_py(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(_j(k) + ": " + _py(x) for k, x in v.items()) + "}"
    return _j(v)


def _no_native_calls(name: str, m: Message) -> None:
    if m.tool_calls:
        raise ValueError(f"{name} has no native call format: the renderer writes calls in its fallback format")


def expect_gpt_oss(m: Message) -> str:
    # The generation prompt is "<|start|>assistant"; an analysis message (reasoning, or the content
    # of a call turn) comes first, then the call (first one only) or the final answer.
    analysis = m.reasoning_content if m.reasoning_content is not None or not m.tool_calls else m.text()
    out = "<|channel|>analysis<|message|>" + analysis + "<|end|><|start|>assistant" if analysis else ""
    if m.tool_calls:
        c = m.tool_calls[0]
        return out + " to=functions." + c.name + "<|channel|>commentary json<|message|>" + _j(c.arguments) + "<|call|>"
    return out + "<|channel|>final<|message|>" + m.text() + "<|return|>"


def expect_harmony(m: Message) -> str:
    # As gpt_oss, with the call's recipient after its channel and the content type behind <|constrain|>.
    analysis = m.reasoning_content if m.reasoning_content is not None or not m.tool_calls else m.text()
    out = "<|channel|>analysis<|message|>" + analysis + "<|end|><|start|>assistant" if analysis else ""
    if m.tool_calls:
        c = m.tool_calls[0]
        return (out + "<|channel|>commentary to=functions." + c.name + " <|constrain|>json<|message|>" + _j(c.arguments)
                + "<|call|>")
    return out + "<|channel|>final<|message|>" + m.text() + "<|return|>"


def expect_command_r7b(m: Message, ids: dict[str, str]) -> str:
    if m.tool_calls:
        items = ['    {"tool_call_id": "' + ids[c.id] + '", "tool_name": "' + c.name + '", "parameters": '
                 + _j(c.arguments) + "}" for c in m.tool_calls]
        return ("<|START_THINKING|>" + (m.reasoning_content or "") + "<|END_THINKING|><|START_ACTION|>[\n"
                + ",\n".join(items) + "\n]<|END_ACTION|><|END_OF_TURN_TOKEN|>")
    return "<|START_RESPONSE|>" + m.text() + "<|END_RESPONSE|><|END_OF_TURN_TOKEN|>"


def expect_qwen35(m: Message) -> str:
    # The generation prompt already holds "<think>\n".
    c = m.text().strip()
    out = (m.reasoning_content or "").strip() + "\n</think>\n\n" + c
    for k, t in enumerate(m.tool_calls or []):
        out += ("\n\n" if c else "") if k == 0 else "\n"
        out += "<tool_call>\n<function=" + t.name + ">\n"
        for a, v in t.arguments.items():
            out += "<parameter=" + a + ">\n" + (v if isinstance(v, str) else _j(v)) + "\n</parameter>\n"
        out += "</function>\n</tool_call>"
    return out + "<|im_end|>"


def expect_glm45(m: Message) -> str:
    # Nothing closes the turn in the template: the next message's role token does.
    r = (m.reasoning_content or "").strip()
    out = "\n<think>" + r + "</think>"
    if m.text().strip():
        out += "\n" + m.text().strip()
    for t in m.tool_calls or []:
        out += "\n<tool_call>" + t.name + "\n" + "".join(
            "<arg_key>" + a + "</arg_key>\n<arg_value>" + (v if isinstance(v, str) else _j(v)) + "</arg_value>\n"
            for a, v in t.arguments.items()) + "</tool_call>"
    return out + ("<|observation|>" if m.tool_calls else "<|user|>")


def lfm2_content(m: Message) -> str:
    """The content LFM2's template needs: the call list as the model writes it, then any text."""
    if not m.tool_calls:
        return m.text()
    calls = ", ".join(t.name + "(" + ", ".join(f"{a}={_py(v)}" for a, v in t.arguments.items()) + ")"
                      for t in m.tool_calls)
    return "<|tool_call_start|>[" + calls + "]<|tool_call_end|>" + m.text()


def expect_lfm2(m: Message) -> str:
    return lfm2_content(m) + "<|im_end|>"


def _gemma4_value(v: Any) -> str:
    """A value as Gemma 4's format_argument writes it: <|"|>string<|"|>, sorted bare keys, no spaces."""
    if isinstance(v, str):
        return '<|"|>' + v + '<|"|>'
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, dict):
        return "{" + ",".join(k + ":" + _gemma4_value(v[k]) for k in sorted(v)) + "}"
    if isinstance(v, list):
        return "[" + ",".join(_gemma4_value(x) for x in v) + "]"
    return str(v)


def expect_gemma4(m: Message) -> str:
    # A call turn: its thought (the turn follows the last user query), the calls, any text, then
    # the <|tool_response> the model stops on. An answer: its text and <turn|>.
    if not m.tool_calls:
        return m.text().strip() + "<turn|>"
    thought = "<|channel>thought\n" + m.reasoning_content + "\n<channel|>" if m.reasoning_content else ""
    calls = "".join("<|tool_call>call:" + c.name + _gemma4_value(c.arguments) + "<tool_call|>" for c in m.tool_calls)
    return thought + calls + m.text().strip() + "<|tool_response>"


def expect_nemotron(m: Message) -> str:
    out = m.text()
    if m.tool_calls:
        out += "<TOOLCALL>[" + ", ".join('{"name": "' + t.name + '", "arguments": ' + _j(t.arguments) + "}"
                                         for t in m.tool_calls) + "]</TOOLCALL>"
    return out + "<|eot_id|>"


def expect_smolvlm(m: Message) -> str:
    _no_native_calls("smolvlm", m)
    return " " + m.text() + "<end_of_utterance>"


def expect_gemma2(m: Message) -> str:
    _no_native_calls("gemma2", m)
    return m.text().strip() + "<end_of_turn>"


def expect_llama2(m: Message) -> str:
    _no_native_calls("llama2", m)
    return " " + m.text().strip() + " </s>"


def expect_deepseek_r1(m: Message) -> str:
    # After "<｜Assistant｜>" (a call turn) or after "<｜tool▁outputs▁end｜>" (an answer to tool output).
    if m.tool_calls:
        return "<｜tool▁calls▁begin｜>" + "\n".join(
            "<｜tool▁call▁begin｜>function<｜tool▁sep｜>" + t.name + "\n```json\n" + _j(t.arguments)
            + "\n```<｜tool▁call▁end｜>" for t in m.tool_calls) + "<｜tool▁calls▁end｜><｜end▁of▁sentence｜>"
    return m.text() + "<｜end▁of▁sentence｜>"


def expect_smollm2(m: Message) -> str:
    _no_native_calls("smollm2", m)
    return m.text() + "<|im_end|>"


EXPECT.update({
    "gpt_oss": expect_gpt_oss, "harmony": expect_harmony, "command_r7b": expect_command_r7b, "qwen35": expect_qwen35, "glm45": expect_glm45,
    "lfm2": expect_lfm2, "gemma4": expect_gemma4, "nemotron": expect_nemotron, "smolvlm": expect_smolvlm, "gemma2": expect_gemma2,
    "llama2": expect_llama2, "deepseek_r1": expect_deepseek_r1, "smollm2": expect_smollm2,
})


def native_messages(traj: Trajectory, fam: Family) -> list[dict[str, Any]]:
    """The conversation in the shape ``fam``'s template needs, written here from the Family fields
    (independently of the renderer): reasoning under the field it reads, arguments as a string
    where required, content as text parts where required, calls in the content for LFM2, and a
    turn without content as "" (transformers drops None-valued keys, and a missing content
    raises in the LFM2, Nemotron, SmolLM2 and DeepSeek-R1 templates). Roles are left as they
    are: folding refused roles is :func:`fold_roles`'s job."""
    out: list[dict[str, Any]] = []
    for m in traj.messages:
        text = lfm2_content(m) if fam.calls_in_content else m.text()
        content: Any = [{"type": "text", "text": text}] if fam.content == "parts" else text
        d: dict[str, Any] = {"role": m.role, "content": content}
        if m.tool_calls and not fam.calls_in_content:
            d["tool_calls"] = [{"id": _call_id(c.id, fam), "type": "function", "function": {
                "name": c.name, "arguments": _j(c.arguments) if fam.args_as_string else c.arguments}}
                for c in m.tool_calls]
        if m.tool_call_id is not None:
            d["tool_call_id"] = _call_id(m.tool_call_id, fam)
        if fam.reasoning_field and m.reasoning_content is not None:
            d[fam.reasoning_field] = m.reasoning_content
        out.append(d)
    return out


def _call_id(cid: str, fam: Family) -> str:
    """Mistral refuses ids that are not 9 alphanumeric characters: ``call_000001`` → ``call00001``."""
    return re.sub(r"[^A-Za-z0-9]", "", cid)[-9:].rjust(9, "0") if fam.call_ids == "mistral" else cid


def fold_roles(msgs: list[dict[str, Any]], system: bool = True, tools: bool = True) -> list[dict[str, Any]]:
    """The shape a template that refuses ``system`` or ``tool`` messages can render: the system
    prompt before the first user message (blank line between, as Gemma 3 does), and each run of
    tool results as one user turn of ``<tool_response>`` blocks (as Qwen / Hermes do)."""
    out: list[dict[str, Any]] = []
    prompt = ""
    for d in msgs:
        d = dict(d)
        if d["role"] == "system" and system:
            prompt = d["content"]
            continue
        if d["role"] == "tool" and tools:
            block = "<tool_response>\n" + d["content"] + "\n</tool_response>"
            if out and out[-1].get("folded"):
                out[-1]["content"] += "\n" + block
                continue
            d = {"role": "user", "content": block, "folded": True}
        elif d["role"] == "user" and prompt:
            d["content"] = prompt + "\n\n" + d["content"]
            prompt = ""
        out.append(d)
    return [{k: v for k, v in d.items() if k != "folded"} for d in out]


def policy_texts(tok: Any, samples: list[Any]) -> list[str]:
    """The decoded policy tokens of each assistant turn, in turn order, over one or more samples."""
    from trajtune.chat.render import SOURCE_POLICY

    turns: dict[int, list[int]] = {}
    for s in samples:
        for i, src, t in zip(s.ids, s.source, s.turn):
            if src == SOURCE_POLICY:
                turns.setdefault(t, []).append(i)
    return [tok.decode(turns[k], skip_special_tokens=False) for k in sorted(turns)]


def rollout_text(renderer: Any, traj: Trajectory, turns: list[str]) -> str:
    """The text a rollout builds for ``traj``: the first prompt, each turn as the model wrote it
    (``turns``), and the observation text the renderer appends after each turn but the last."""
    a_idx = [i for i, m in enumerate(traj.messages) if m.role == "assistant"]
    text = renderer.prompt_text(traj.messages[: a_idx[0]], traj.tools)
    for k, i in enumerate(a_idx):
        text += turns[k]
        if k + 1 < len(a_idx):
            text += renderer.observation_text(traj.messages[: a_idx[k + 1]], traj.tools, i + 1)
    return text
