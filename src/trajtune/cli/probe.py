"""``trajtune probe …``: safety and retention probes of a fine-tuned model (docs/probes.md).

The result JSON goes to stdout (and to ``--out FILE`` when given, atomically); warnings and
progress go to stderr. The logic lives in ``trajtune.safety``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from trajtune.errors import OutputError, UsageError, require_at_least
from trajtune.schema import atomic_write_text

probe_app = typer.Typer(
    help="Safety and retention probes: canary extraction (privacy), forgetting.\n\n"
         "Example: trajtune probe privacy --model runs/sft/final --canaries canaries.json",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

OutOpt = Annotated[Optional[Path], typer.Option("--out", "-o", help="Also write the result JSON to this file.")]
OverwriteOpt = Annotated[bool, typer.Option("--overwrite", help="Replace an existing --out file.")]
DeviceOpt = Annotated[str, typer.Option(help="Where the model runs: auto (GPU if there is one), cpu, cuda, ...")]


def _check_out(out: Path | None, overwrite: bool) -> None:
    if out is None:
        return
    if out.is_dir():
        raise OutputError(f"cannot write {out}: it is a directory; name a file inside it")
    if out.exists() and not overwrite:
        raise OutputError(f"{out} exists; pass --overwrite to replace it")


def _emit(result: dict[str, Any], out: Path | None) -> None:
    text = json.dumps(result, indent=1, ensure_ascii=False)
    if out is not None:
        atomic_write_text(out, text + "\n")
    typer.echo(text)


@probe_app.command("privacy")
def privacy(
    model: Annotated[str, typer.Option("--model", "-m", help="The fine-tuned model: alias, path, HF id or LoRA "
                                                             "adapter directory.")],
    canaries: Annotated[Path, typer.Option("--canaries", help="The sidecar `trajtune data plant-canaries` wrote.")],
    batch_size: Annotated[int, typer.Option(help="Prompts generated together.")] = 16,
    device: DeviceOpt = "auto",
    out: OutOpt = None,
    overwrite: OverwriteOpt = False,
) -> None:
    """Canary extraction rate k/n: prompt with each canary's prefix, in the context it was planted in,
    and count greedy completions that reproduce the secret exactly.

    Example: trajtune probe privacy --model runs/sft/final --canaries data/canaries.json --out privacy.json
    """
    # lazy: the CLI's start-up loads only the command modules, not what they run
    from trajtune.models.loading import load_model, load_tokenizer, to_device
    from trajtune.safety.canaries import extraction_rate, load_sidecar

    require_at_least(("--batch-size", batch_size, 1))
    _check_out(out, overwrite)
    doc = load_sidecar(canaries)
    tok = load_tokenizer(model)
    m = to_device(load_model(model, trainable=False), device)
    result = {"model": model, "canaries_file": str(canaries), **extraction_rate(m, tok, doc, batch_size=batch_size)}
    typer.echo(f"extraction rate: {result['extracted']}/{result['n']} = {result['extraction_rate']:.3f}", err=True)
    _emit(result, out)


@probe_app.command("forgetting")
def forgetting(
    base: Annotated[str, typer.Option("--base", "-b", help="The model before fine-tuning.")],
    model: Annotated[str, typer.Option("--model", "-m", help="The fine-tuned model (a full model or a LoRA "
                                                             "adapter directory).")],
    text: Annotated[Optional[Path], typer.Option(
        "--text", help="General text to score (paragraphs separated by blank lines); default: a built-in sample of "
                       "~50 short paragraphs.")] = None,
    env: Annotated[Optional[str], typer.Option("--env", "-e", help="Capability task set: an environment whose "
                                                                   "held-out tasks both models are evaluated on.")] = None,
    n: Annotated[int, typer.Option("--n", help="Held-out tasks of --env.")] = 20,
    seed: Annotated[int, typer.Option(help="Task seed.")] = 0,
    max_length: Annotated[int, typer.Option(help="Tokens per paragraph scored (longer ones are cut).")] = 512,
    max_new_tokens: Annotated[int, typer.Option(help="Token limit per assistant turn in --env episodes.")] = 256,
    device: DeviceOpt = "auto",
    out: OutOpt = None,
    overwrite: OverwriteOpt = False,
) -> None:
    """Forgetting: Δ held-out text loss (NLL per token) and Δ task success, fine-tuned minus base, both
    measured with the same settings. Δloss > 0 or Δsuccess < 0 is forgetting.

    Example: trajtune probe forgetting --base smollm2-135m --model runs/sft/final --env home --n 20
    """
    # lazy: imports torch, which the CLI's start-up (`trajtune --help`) must not load
    from trajtune.safety.forgetting import forgetting_report

    require_at_least(("--n", n, 1), ("--max-length", max_length, 2))
    _check_out(out, overwrite)
    result = forgetting_report(base, model, text=text, env=env, tasks=n, seed=seed, max_length=max_length,
                               max_new_tokens=max_new_tokens, device=device)
    t = result["text"]
    line = f"Δloss = {t['delta_loss']:+.4f} nats/token (base {t['base_loss']:.4f}, model {t['model_loss']:.4f})"
    if "capability" in result:
        c = result["capability"]
        line += f"; Δsuccess = {c['delta_success']:+.3f} (base {c['base_success']:.3f}, model {c['model_success']:.3f})"
    typer.echo(line, err=True)
    if "warning" in t:
        typer.echo(f"warning: {t['warning']}", err=True)
    _emit(result, out)
