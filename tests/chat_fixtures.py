"""Shared test data for the chat tests: seven template families, each with a tiny tokenizer that
carries the family's special tokens, one tool conversation, and per-family functions that write
the text each template should produce for an assistant turn — written from the family's format,
independently of the renderer, so the tests compare two separate implementations.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from trajtune.schema import Message, ToolCall, ToolSpec, Trajectory

TEMPLATES = Path(__file__).parent / "fixtures" / "templates"


@dataclass(frozen=True)
class Family:
    name: str
    special: tuple[str, ...]  # special tokens (bos/eos/pad included)
    bos: str | None
    eos: str
    pad: str
    eot: str  # what closes an assistant turn
    parser: str
    prefix_stable: bool  # over the two-user-turn conversation below
    added: tuple[str, ...] = field(default=())

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
           ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")),
    Family("llama3", ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                      "<|eot_id|>", "<|eom_id|>", "<|python_tag|>", "<|finetune_right_pad_id|>"),
           "<|begin_of_text|>", "<|end_of_text|>", "<|finetune_right_pad_id|>", "<|eot_id|>", "llama3_json", True),
    Family("mistral", ("<s>", "</s>", "<unk>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                       "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"),
           "<s>", "</s>", "<unk>", "</s>", "mistral", False),
    Family("gemma", ("<bos>", "<eos>", "<pad>", "<start_of_turn>", "<end_of_turn>"), "<bos>", "<eos>", "<pad>",
           "<end_of_turn>", "pythonic", True),
    Family("phi3", ("<s>", "<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"), "<s>",
           "<|endoftext|>", "<|endoftext|>", "<|end|>", "react", True),
    Family("deepseek", DS, DS[0], DS[1], DS[-1], DS[1], "deepseek", True),
]}

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

    fam = FAMILIES[name]
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
