"""Pieces the tiny-model benchmarks share: a fresh tiny model trained by SFT on expert episodes,
and the ``--set KEY=VALUE`` overrides of a benchmark's settings.

Imported by name from scripts in ``benchmarks/`` (Python puts a script's own directory on the path;
``benchmarks/`` is not a package).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def apply_sets(ap: argparse.ArgumentParser, items: list[str], settings: dict[str, Any]) -> str:
    """Apply ``KEY=VALUE`` items (JSON values) to ``settings``; an unknown key is a usage error.
    Returns the ``--set ...`` text that reruns them (one ``--set`` takes them all: a second one would
    replace the first)."""
    for item in items:
        key, _, raw = item.partition("=")
        if key not in settings:
            ap.error(f"unknown setting {key!r}; known: {', '.join(settings)}")
        settings[key] = json.loads(raw)
    return ("--set " + " ".join(items)) if items else ""


def tiny_sft(out: Path, experts: list[Any], *, seed: int, vocab_size: int, preset: str, steps: int, lr: float,
             batch_size: int, max_length: int, tokenizer_episodes: int, **train: Any) -> Path:
    """Write ``experts`` to ``out/data/train.jsonl``, build a fresh tiny model whose tokenizer is
    learned from the first ``tokenizer_episodes`` of them, and train it by full-weight SFT into
    ``out/sft`` (``train``: further ``train.`` settings, e.g. checkpoints). Returns ``out/sft``."""
    from trajtune.algorithms.sft import SFTRunConfig
    from trajtune.chat.render import message_to_template_dict, tools_to_template
    from trajtune.models.tiny import build_tokenizer, create_tiny_model
    from trajtune.schema import write_trajectories
    from trajtune.train import run_sft

    data = out / "data" / "train.jsonl"
    write_trajectories(data, experts)
    probe = build_tokenizer(["probe"], vocab_size=300)
    texts = [probe.apply_chat_template([message_to_template_dict(m) for m in t.messages],
                                       tools=tools_to_template(t.tools), tokenize=False)
             for t in experts[:tokenizer_episodes]]
    base = create_tiny_model(out / "base-model", texts, vocab_size=vocab_size, preset=preset, seed=seed)
    run_sft(SFTRunConfig.model_validate({
        "model": str(base), "output_dir": str(out / "sft"), "seed": seed,
        "data": {"path": str(data), "format": "ir", "max_length": max_length},
        "train": {"steps": steps, "lr": lr, "batch_size": batch_size, "micro_batch_size": batch_size,
                  "warmup_steps": steps // 20, **train},
        "report": False}))
    return out / "sft"
