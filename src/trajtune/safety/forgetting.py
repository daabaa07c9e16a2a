"""Forgetting probe: how much general ability fine-tuning cost, measured the same way on both models.

Two numbers, each fine-tuned minus base under identical settings:

- **Δloss**: mean per-token negative log-likelihood on held-out general text (a small text sample
  shipped with trajtune, or ``--text FILE``). Positive = the fine-tuned model predicts ordinary
  text worse than its base did: it forgot.
- **Δsuccess**: success rate on a small capability task set (an environment's held-out tasks,
  through the same harness as ``trajtune eval``). Negative = it lost a skill the base had.

The same model as base and fine-tuned gives exactly 0 for both: the measurement is deterministic
(greedy decoding, fixed text, fixed task seed).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from trajtune.errors import DataError, require_input
from trajtune.eval.harness import EvalSettings
from trajtune.eval.run import run_eval
from trajtune.models.loading import load_model, load_tokenizer, to_device

GENERAL_TEXT = "general_text.txt"


def split_paragraphs(text: str) -> list[str]:
    """Paragraphs separated by blank lines; lines inside one paragraph joined by spaces."""
    paras = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        p = " ".join(line.strip() for line in block.strip().splitlines() if line.strip())
        if p:
            paras.append(p)
    return paras


def load_general_text(path: str | Path | None = None) -> tuple[list[str], str]:
    """The paragraphs of ``path`` (or of the built-in sample) and a name for the report."""
    if path is None:
        text = resources.files("trajtune").joinpath("data", GENERAL_TEXT).read_text(encoding="utf-8")
        source = f"builtin:{GENERAL_TEXT}"
    else:
        p = require_input(path)
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, IsADirectoryError) as e:
            raise DataError(f"{p}: not a UTF-8 text file ({e})") from None
        source = str(p)
    paras = split_paragraphs(text)
    if not paras:
        raise DataError(f"{source}: no text (paragraphs are separated by blank lines)")
    return paras, source


def text_nll(model: Any, tokenizer: Any, paragraphs: list[str], *, max_length: int = 512,
             batch_size: int = 8) -> tuple[float, int]:
    """Mean per-token NLL (nats) of ``paragraphs`` under ``model`` and the number of tokens scored.

    Each paragraph is scored on its own (truncated to ``max_length`` tokens); every token after the
    first is predicted from the ones before it. Token-weighted: long paragraphs count more."""
    import torch

    device = next(model.parameters()).device
    seqs = [list(tokenizer(p, add_special_tokens=False)["input_ids"])[:max_length] for p in paragraphs]
    seqs = [s for s in seqs if len(s) >= 2]
    if not seqs:
        raise DataError("the text has no paragraph of two or more tokens to score")
    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for b0 in range(0, len(seqs), batch_size):
                chunk = seqs[b0:b0 + batch_size]
                width = max(len(s) for s in chunk)
                ids = torch.zeros((len(chunk), width), dtype=torch.long)
                mask = torch.zeros((len(chunk), width), dtype=torch.long)
                for r, s in enumerate(chunk):  # right padding: positions stay 0..len-1
                    ids[r, :len(s)] = torch.tensor(s)
                    mask[r, :len(s)] = 1
                ids, mask = ids.to(device), mask.to(device)
                logits = model(input_ids=ids, attention_mask=mask).logits.float()
                logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
                keep = mask[:, 1:].bool()
                total += float(-(logp[keep]).double().sum())
                count += int(keep.sum())
    finally:
        model.train(was_training)
    return total / count, count


def _load(name: str, device: str) -> tuple[Any, Any]:
    tok = load_tokenizer(name)
    return to_device(load_model(name, trainable=False), device), tok


def text_forgetting(base: str, model: str, *, text: str | Path | None = None, max_length: int = 512,
                    device: str = "auto") -> dict[str, Any]:
    """Held-out text loss of ``base`` and ``model`` (names or paths) and their difference."""
    paras, source = load_general_text(text)
    losses = {}
    tokens = 0
    vocabs = []
    for role, name in (("base", base), ("model", model)):
        m, tok = _load(name, device)
        losses[role], tokens = text_nll(m, tok, paras, max_length=max_length)
        vocabs.append(tok.get_vocab())
        del m
    out = {"source": source, "paragraphs": len(paras), "tokens": tokens, "base_loss": losses["base"],
           "model_loss": losses["model"], "delta_loss": losses["model"] - losses["base"]}
    if vocabs[0] != vocabs[1]:  # per-token losses over different tokenizations are not comparable
        out["warning"] = ("the two models have different tokenizers, so their per-token losses count different "
                          "tokens; compare Δloss only between a model and its own base")
    return out


def capability_forgetting(base: str, model: str, *, env: str, tasks: int, seed: int = 0,
                          env_kwargs: dict[str, Any] | None = None, max_new_tokens: int = 256,
                          device: str = "auto", quiet: bool = True) -> dict[str, Any]:
    """Greedy success of ``base`` and ``model`` on the same ``tasks`` held-out tasks of ``env``."""
    success = {}
    for role, name in (("base", base), ("model", model)):
        settings = EvalSettings(model=name, env=env, env_kwargs=dict(env_kwargs or {}), tasks=tasks, seed=seed,
                                temperature=0.0, max_new_tokens=max_new_tokens, device=device)
        results = run_eval(settings, quiet=quiet)
        success[role] = float(results["metrics"].get("success") or 0.0)
    return {"env": env, "tasks": tasks, "seed": seed, "base_success": success["base"],
            "model_success": success["model"], "delta_success": success["model"] - success["base"]}


def forgetting_report(base: str, model: str, *, text: str | Path | None = None, env: str | None = None,
                      tasks: int = 20, seed: int = 0, env_kwargs: dict[str, Any] | None = None,
                      max_length: int = 512, max_new_tokens: int = 256, device: str = "auto",
                      quiet: bool = True) -> dict[str, Any]:
    """The whole probe: Δloss always, Δsuccess when ``env`` is given."""
    out: dict[str, Any] = {"probe": "forgetting", "base": base, "model": model,
                           "text": text_forgetting(base, model, text=text, max_length=max_length, device=device)}
    if env is not None:
        out["capability"] = capability_forgetting(base, model, env=env, tasks=tasks, seed=seed,
                                                  env_kwargs=env_kwargs, max_new_tokens=max_new_tokens,
                                                  device=device, quiet=quiet)
    return out
