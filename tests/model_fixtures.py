"""Stand-in models for checking objective arithmetic exactly, and helpers that change a model on purpose."""

from __future__ import annotations

import torch


class FixedLogits(torch.nn.Module):
    """A 'model' returning given logits (a trainable parameter), whatever the input."""

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.logits = torch.nn.Parameter(logits)

    def forward(self, input_ids, attention_mask=None, use_cache=False):
        return type("O", (), {"logits": self.logits})()


def randomize_lora_b(model, seed: int, scale: float = 0.1) -> None:
    """Give every LoRA B matrix random values (PEFT starts them at 0), so the adapter changes the model."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * scale)


def save_adapter(model, base, path):
    """``model``'s LoRA adapter saved at ``path`` as a LoRA run's checkpoint is: with the base's tokenizer,
    and ``base_model_name_or_path`` naming ``base`` (PEFT records the directory it was built from)."""
    import json

    from transformers import AutoTokenizer

    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(base).save_pretrained(path)
    cfg = json.loads((path / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = str(base)
    (path / "adapter_config.json").write_text(json.dumps(cfg))
    return cfg


def perturbed_copy(src, dst, scale: float):
    """A copy of the HF model directory ``src`` at ``dst`` with Gaussian noise of ``scale`` added to every
    weight (seeded): a deliberately damaged model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    m = AutoModelForCausalLM.from_pretrained(src)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    m.save_pretrained(dst)
    AutoTokenizer.from_pretrained(src).save_pretrained(dst)
    return dst
