"""A tiny tokenizer + causal LM made locally, so tests, CI and the demo never touch a hub.

The result is an ordinary Hugging Face directory (``config.json``, ``model.safetensors``,
``tokenizer.json``, ``tokenizer_config.json`` with a chat template), loaded through the very same
``from_pretrained`` path as a real model. The tokenizer is a byte-level BPE trained on the text
an environment produces, so the environment's entity names become single tokens: from-scratch
models learn to copy single tokens quickly but multi-token strings slowly.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

# ChatML with tools (one compact signature line per tool, to keep CPU sequences short), Hermes-style <tool_call> blocks and {% generation %} markers around what the
# assistant produces (its content, its calls and the end-of-turn token).
CHAT_TEMPLATE = (
    "{%- set ns = namespace(start=0, sys='') -%}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set ns.sys = messages[0]['content'] -%}{%- set ns.start = 1 -%}"
    "{%- endif -%}"
    "{%- if ns.sys or tools -%}"
    "{{- '<|im_start|>system\\n' + ns.sys -}}"
    "{%- if tools -%}"
    "{%- if ns.sys -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '# Tools\\n' -}}"
    "{%- for t in tools -%}{%- set f = t['function'] if t['function'] is defined else t -%}"
    "{{- f['name'] + '(' + ((f['parameters'] or {}).get('properties', {}) | list | join(', ')) + '): ' + (f['description'] or '') + '\\n' -}}"
    "{%- endfor -%}"
    "{{- 'Call a tool with <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>.' -}}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for m in messages[ns.start:] -%}"
    "{%- if m['role'] == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- generation -%}"
    "{%- if m['content'] -%}{{- m['content'] -}}{%- endif -%}"
    "{%- if m['tool_calls'] -%}"
    "{%- for c in m['tool_calls'] -%}"
    "{%- if m['content'] or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_call>' -}}"
    "{{- {'name': c['function']['name'], 'arguments': c['function']['arguments']} | tojson -}}"
    "{{- '</tool_call>' -}}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>' -}}"
    "{%- endgeneration -%}"
    "{{- '\\n' -}}"
    "{%- elif m['role'] == 'tool' -%}"
    "{{- '<|im_start|>tool\\n<tool_response>' + m['content'] + '</tool_response><|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + (m['content'] or '') + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

# Model shapes that train on 2 CPU cores in minutes.
PRESETS: dict[str, dict[str, int]] = {
    "nano": {"hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2},
    "micro": {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 4, "num_attention_heads": 4,
              "num_key_value_heads": 4},
    "small": {"hidden_size": 192, "intermediate_size": 576, "num_hidden_layers": 6, "num_attention_heads": 6,
              "num_key_value_heads": 2},
}


def build_tokenizer(texts: Iterable[str], vocab_size: int = 1024, pretokenizer: str = "words") -> Any:
    """Train a byte-level BPE tokenizer (lossless round trip) and wrap it for transformers.

    ``pretokenizer``: ``words`` is GPT-2's split (a word keeps its leading space); ``split`` makes
    every word, digit, punctuation run and whitespace run its own pre-token, so an entity is the
    same token in prose and inside JSON.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    if pretokenizer == "split":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(r"[A-Za-z]+|[0-9]|[^A-Za-z0-9\s]+|\s+"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    elif pretokenizer == "words":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        raise ValueError(f"pretokenizer must be 'words' or 'split', got {pretokenizer!r}")
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Special tokens must not be split during training; strip them from the corpus first.
    cleaned = []
    for t in texts:
        for s in SPECIAL_TOKENS + ADDED_TOKENS:
            t = t.replace(s, "\n")
        cleaned.append(t)
    tok.train_from_iterator(cleaned, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        additional_special_tokens=["<|im_start|>"],
        clean_up_tokenization_spaces=False,
    )
    fast.add_tokens(ADDED_TOKENS)
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


def build_model(tokenizer: Any, preset: str = "micro", seed: int = 0, max_position_embeddings: int = 1024,
                **overrides: Any) -> Any:
    """A freshly initialised Qwen2 causal LM sized by ``preset`` (see ``PRESETS``)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if preset not in PRESETS:
        raise ValueError(f"unknown tiny-model preset {preset!r}; choose one of {', '.join(PRESETS)}")
    shape = dict(PRESETS[preset], **overrides)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        rope_theta=10000.0,
        **shape,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    return model


def create_tiny_model(out_dir: str | Path, texts: Iterable[str], *, vocab_size: int = 1024, preset: str = "micro",
                      seed: int = 0, pretokenizer: str = "words", **overrides: Any) -> Path:
    """Build tokenizer + model and save them as one HF directory; returns the directory."""
    out = Path(out_dir)
    tok = build_tokenizer(texts, vocab_size=vocab_size, pretokenizer=pretokenizer)
    model = build_model(tok, preset=preset, seed=seed, **overrides)
    out.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(out)
    model.save_pretrained(out)
    return out

