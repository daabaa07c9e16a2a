"""``trajtune export``: a LoRA adapter merged into a plain Hugging Face model (trajtune.models.export)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from trajtune.progress import console


def export_cmd(
    model: Annotated[str, typer.Option("--model", "-m", help="A LoRA adapter directory (adapter_config.json), or a "
                                                             "finished run whose final/ is one.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output directory: an HF model dir with export.json.")],
    dtype: Annotated[Optional[str], typer.Option("--dtype", help="Dtype of the saved weights: float32, bfloat16 or "
                                                                 "float16 (default: the base's).")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace --out if it exists.")] = False,
) -> None:
    """Merge a LoRA adapter into its base and save a plain Hugging Face model (no PEFT needed to load it).

    The base is the adapter_config.json's base_model_name_or_path, resolved like any --model (an alias such as smollm2-135m, a GGUF conversion, a directory or a hub id). The adapter is folded into the weights (PEFT merge_and_unload) and the result written with save_pretrained, the tokenizer (the adapter's, else the base's) and export.json (source adapter, base, dtype, trajtune version); --out is written atomically. A DualTune model (dualtune.json) switches adapters per token and cannot be exported as one model. See docs/merging.md.

    Example: trajtune export --model runs/sft/final --out runs/sft-merged

    Example: trajtune export --model runs/rl --out exported/rl-bf16 --dtype bfloat16 --overwrite
    """
    # lazy: the CLI's start-up loads only the command modules, not what they run
    from trajtune.models.export import export_adapter

    def notify(message: str) -> None:
        console.print(message, soft_wrap=True, markup=False)

    result = export_adapter(model, out, dtype=dtype, overwrite=overwrite, notify=notify)
    s = result.summary
    console.print(f"base: {s['base']['name']}  dtype: {s['dtype']}  tokenizer from: {s['tokenizer_from']}",
                  soft_wrap=True, markup=False)
    console.print(f"exported model: {result.out}", soft_wrap=True, markup=False)


def register(app: Any) -> None:
    app.command("export")(export_cmd)
