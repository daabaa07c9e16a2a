"""Write a tiny Llama GGUF file the way llama.cpp's converter does, so the GGUF path is tested fast.

The model is a 2-layer Llama (hidden size 32) with a byte-level BPE tokenizer trained on a few
sentences and the tiny model's ChatML tool template. The writer follows llama.cpp's layout
(tensor names, Q/K row permutation, tokenizer metadata) independently of trajtune's converter,
which only reads GGUF files through transformers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

TEXTS = ["Turn on the lamp in the attic.", "Open the blinds in the kitchen, then go to the cellar.",
         '{"name": "move", "arguments": {"room": "hall"}}', "Hello, my name is Ada and I count 1 2 3."] * 4


def tiny_llama(seed: int = 0) -> tuple[Any, Any]:
    """(model, tokenizer): a fresh 2-layer Llama and the tiny byte-level BPE tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from trajtune.models.tiny import build_tokenizer

    tok = build_tokenizer(TEXTS, vocab_size=300)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True,
                         bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # norms of ones would hide a swapped norm tensor
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model, tok


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp stores Q and K rows interleaved per rotary half (``convert_hf_to_gguf.py``)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_LAYER_TENSORS = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def _tensors(model: Any) -> dict[str, np.ndarray]:
    cfg = model.config
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    out = {"token_embd.weight": sd["model.embed_tokens.weight"], "output_norm.weight": sd["model.norm.weight"]}
    for i in range(cfg.num_hidden_layers):
        for hf, gg in _LAYER_TENSORS.items():
            w = sd[f"model.layers.{i}.{hf}.weight"]
            if gg == "attn_q":
                w = _permute(w, cfg.num_attention_heads)
            elif gg == "attn_k":
                w = _permute(w, cfg.num_key_value_heads)
            out[f"blk.{i}.{gg}.weight"] = w
    return out


def write_tiny_gguf(path: Path, model: Any, tok: Any, name: str = "tiny llama") -> Path:
    """Write ``model`` + ``tok`` as an F32 GGUF file at ``path``."""
    import gguf

    cfg = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    _add_tokenizer(w, tok)
    for tname, arr in _tensors(model).items():
        w.add_tensor(tname, np.ascontiguousarray(arr, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _add_tokenizer(w: Any, tok: Any) -> None:
    import gguf

    spec = json.loads(tok.backend_tokenizer.to_str())
    vocab = {t: i for t, i in spec["model"]["vocab"].items()}
    added = {a["content"]: (a["id"], a["special"]) for a in spec["added_tokens"]}
    tokens = [""] * len(tok)
    types = [gguf.TokenType.NORMAL] * len(tok)
    for t, i in vocab.items():
        tokens[i] = t
    for t, (i, special) in added.items():
        tokens[i] = t
        types[i] = gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED
    merges = [" ".join(m) if isinstance(m, list) else m for m in spec["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([int(t) for t in types])
    w.add_token_merges(merges)
    w.add_eos_token_id(tok.eos_token_id)
    w.add_pad_token_id(tok.pad_token_id)
    w.add_chat_template(tok.chat_template)
