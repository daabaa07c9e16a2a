"""`trajtune doctor`: check a model's chat template before training on it."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from trajtune.chat.parsers import available_parsers
from trajtune.cli.eval_cmd import render_overrides
from trajtune.errors import DataError, ModelLoadError, UsageError, require_input


def doctor_cmd(
    model: str = typer.Option(..., "--model", help="Model alias (see `trajtune models list`), .gguf file, Hugging Face id or local directory with a tokenizer."),
    template: Optional[Path] = typer.Option(None, "--template", help="Jinja chat template file to use instead of "
                                            "the tokenizer's own."),
    parser: Optional[str] = typer.Option(None, "--parser", help="Tool-call parser (default: detected from the "
                                         "template): " + ", ".join(available_parsers())),
    non_prefix: str = typer.Option("error", "--non-prefix", help="How training will treat templates that rewrite "
                                   "earlier turns: 'error' (fail) or 'split' (warn; one sample per turn)."),
    set_: Optional[list[str]] = typer.Option(None, "--set", help="Render option as training would set it: "
                                             "--set render.tool_format=hermes (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Check that a chat template renders agent conversations in a trainable way.

    Renders a multi-turn tool conversation and reports the tool format used (the template's own,
    or Hermes/Llama-3-JSON/pythonic text for templates without tool support) and why, the
    adaptations made (system prompt folded, tool results as user turns, ...), prefix stability,
    generation-marker coverage, assistant mask vs provenance, tool-call round trip, end-of-turn
    token per turn type, system prompt and tools, thinking handling. Exits 1 if a check fails;
    bad input exits with the code of its error kind (see `trajtune --help`).

    Example: trajtune doctor --model smollm2-135m

    Example: trajtune doctor --model Qwen/Qwen2.5-0.5B-Instruct --set render.tool_format=native --json
    """
    # lazy: imports torch, which the CLI's start-up (`trajtune --help`) must not load
    from trajtune.chat.doctor import check_template, report_json
    from trajtune.config import load_render
    from trajtune.models.loading import read_tokenizer
    from trajtune.models.resolve import resolve_model

    if non_prefix not in ("error", "split"):
        raise UsageError(f"--non-prefix must be 'error' or 'split', got {non_prefix!r}")
    options = render_overrides(set_)
    options.setdefault("non_prefix", non_prefix)
    config = load_render(options).to_render_config()
    if parser is not None and parser not in available_parsers():
        raise UsageError(f"unknown parser {parser!r}; available: {', '.join(available_parsers())}")
    chat_template = None
    if template is not None:
        try:
            chat_template = require_input(template, "--template").read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise DataError(f"cannot read --template {template}: {getattr(e, 'strerror', None) or e}") from None
    try:
        path = resolve_model(model).path
    except ModelLoadError as e:  # unknown alias, missing or corrupt GGUF, missing package: says its own fix
        raise ModelLoadError(f"cannot load a tokenizer from --model {model!r}: {e}") from None
    try:
        tok = read_tokenizer(path, user_errors=())
    except Exception as e:  # missing path, no network, not a tokenizer: a user error, not a traceback
        raise ModelLoadError(f"cannot load a tokenizer from --model {model!r}: {type(e).__name__}: {e} (hint: pass a "
                             "local directory containing tokenizer.json / tokenizer_config.json, or a Hugging Face "
                             "id; it needs network access or a cached copy)") from None
    report = check_template(tok, chat_template=chat_template, parser=parser, config=config)
    typer.echo(report_json(report) if as_json else report.format_text())
    raise typer.Exit(0 if report.ok else 1)
