"""Tiny float64 decoders (Qwen2, Llama, Qwen3, GPT-2) and token trajectories on them, for tests that
compare two ways of computing the same loss and gradients within 1e-9 (shared prefixes, the
chunked LM head).

Their RMSNorm computes in float32 (transformers upcasts half-precision inputs that way), which would
round every gradient through it to float32 and hide the comparison under ~1e-7 of summation-order
noise; ``float64_norms`` swaps it for the same formula in the input's dtype, so the whole model is
float64 and 1e-9 is meaningful."""

from __future__ import annotations

import torch

from trajtune.tokens import SOURCE_ENV, SOURCE_POLICY, SOURCE_PROMPT, TokenTrajectory

V = 101


def _rmsnorm_in_input_dtype(self, h):
    return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def float64_norms(monkeypatch) -> None:
    from transformers.models.llama import modeling_llama
    from transformers.models.qwen2 import modeling_qwen2
    from transformers.models.qwen3 import modeling_qwen3

    monkeypatch.setattr(modeling_qwen2.Qwen2RMSNorm, "forward", _rmsnorm_in_input_dtype)
    monkeypatch.setattr(modeling_qwen3.Qwen3RMSNorm, "forward", _rmsnorm_in_input_dtype)
    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", _rmsnorm_in_input_dtype)


def make_model(kind: str = "qwen2", **cfg):
    from transformers import (LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                              Qwen3ForCausalLM)

    shape = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=256, **cfg)
    torch.manual_seed(0)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**shape))
    elif kind == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=8, **shape))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(tie_word_embeddings=True, **shape))
    return model.double().train()


def lora(model, targets: tuple[str, ...] = ("q_proj", "v_proj")):
    from peft import LoraConfig, get_peft_model

    m = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=list(targets),
                                         task_type="CAUSAL_LM"))
    torch.manual_seed(1)
    for n, p in m.named_parameters():  # B starts at 0: give the adapter a non-zero effect
        if "lora_B" in n:
            p.data.normal_(0, 0.1)
    return m.train()


def checkpointing(model):
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def rand_ids(g, n):
    return torch.randint(3, V, (n,), generator=g).tolist()


def episode(ids_src: list[tuple[list[int], int]], adv: float, group: str = "", seed: int = 0) -> TokenTrajectory:
    ids = [i for part, _ in ids_src for i in part]
    src = [s for part, s in ids_src for _ in part]
    g = torch.Generator().manual_seed(seed)
    lp = [float(-torch.rand(1, generator=g)) if s == SOURCE_POLICY else 0.0 for s in src]
    return TokenTrajectory(ids=ids, source=src, turn=[0] * len(ids), weight=[1.0] * len(ids), logprobs=lp,
                           advantages=[adv if s == SOURCE_POLICY else 0.0 for s in src], group=group)


def grpo_group(g, prompt_len=40, lengths=(5, 11, 3, 17), group="g0", offset=0):
    prompt = rand_ids(g, prompt_len)
    return [episode([(prompt, SOURCE_PROMPT), (rand_ids(g, n), SOURCE_POLICY)], (-1) ** k * (0.5 + k), group,
                    seed=offset + k) for k, n in enumerate(lengths)]


def multi_turn(g):
    """Episodes of one task: a shared prompt, first action and observation, then they diverge (the
    common prefix ends inside the second turn, after policy tokens)."""
    prompt, act, obs = rand_ids(g, 24), rand_ids(g, 6), rand_ids(g, 8)
    out = []
    for k, (n_act, n_obs, n_last) in enumerate([(4, 7, 3), (9, 2, 6), (2, 5, 12)]):
        shared_start = [3, 4, 5]  # the second action starts alike in every episode
        out.append(episode([(prompt, SOURCE_PROMPT), (act, SOURCE_POLICY), (obs, SOURCE_ENV),
                            (shared_start + rand_ids(g, n_act), SOURCE_POLICY), (rand_ids(g, n_obs), SOURCE_ENV),
                            (rand_ids(g, n_last), SOURCE_POLICY)], 0.3 * (k - 1), "mt", seed=10 + k))
    return out


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=256, bos_token_id=0,
                                      eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)).double().train()
