"""`trajtune doctor`: check a model's chat template before training on it."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from trajtune.chat.parsers import available_parsers


def doctor_cmd(
    model: str = typer.Option(..., "--model", help="Hugging Face model id or local directory with a tokenizer."),
    template: Optional[Path] = typer.Option(None, "--template", help="Jinja chat template file to use instead of "
                                            "the tokenizer's own."),
    parser: Optional[str] = typer.Option(None, "--parser", help="Tool-call parser (default: detected from the "
                                         "template): " + ", ".join(available_parsers())),
    non_prefix: str = typer.Option("error", "--non-prefix", help="How training will treat templates that rewrite "
                                   "earlier turns: 'error' (fail) or 'split' (warn; one sample per turn)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Check that a chat template renders agent conversations in a trainable way.

    Renders a multi-turn tool conversation and reports prefix stability, generation-marker coverage, assistant mask vs provenance, tool-call round trip, end-of-turn token, system prompt and tools, thinking handling. Exits 1 if a check fails; bad input exits with the code of its error kind (see `trajtune --help`).

    Example: trajtune doctor --model Qwen/Qwen2.5-0.5B-Instruct --json
    """
    from trajtune.chat.doctor import check_template, report_json
    from trajtune.chat.render import RenderConfig
    from trajtune.errors import DataError, ModelLoadError, UsageError, require_input

    if non_prefix not in ("error", "split"):
        raise UsageError(f"--non-prefix must be 'error' or 'split', got {non_prefix!r}")
    if parser is not None and parser not in available_parsers():
        raise UsageError(f"unknown parser {parser!r}; available: {', '.join(available_parsers())}")
    chat_template = None
    if template is not None:
        try:
            chat_template = require_input(template, "--template").read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise DataError(f"cannot read --template {template}: {getattr(e, 'strerror', None) or e}") from None
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model)
    except Exception as e:  # missing path, no network, not a tokenizer: a user error, not a traceback
        raise ModelLoadError(f"cannot load a tokenizer from --model {model!r}: {type(e).__name__}: {e} (hint: pass a "
                             "local directory containing tokenizer.json / tokenizer_config.json, or a Hugging Face "
                             "id; it needs network access or a cached copy)") from None
    report = check_template(tok, chat_template=chat_template, parser=parser,
                            config=RenderConfig(non_prefix=non_prefix))  # type: ignore[arg-type]
    typer.echo(report_json(report) if as_json else report.format_text())
    raise typer.Exit(0 if report.ok else 1)
