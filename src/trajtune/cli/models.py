"""``trajtune models ...``: the named real models, and converting GGUF files ahead of time."""

from __future__ import annotations

import json
from typing import Annotated

import typer

models_app = typer.Typer(
    help="List the named models (aliases) and prepare GGUF models for training.\n\n"
         "Any command's --model (or a config's model:) also takes an alias or a .gguf file.\n\n"
         "Example: trajtune models prepare smollm2-135m",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _size(n: object) -> str:
    from trajtune.models.gguf import human_size

    return human_size(n) if isinstance(n, int) else "-"


@models_app.command("list")
def list_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list instead of a table.")] = False,
) -> None:
    """List the model aliases (installed or not) and the GGUF files already converted, with their paths.

    The cache is $TRAJTUNE_CACHE, else ~/.cache/trajtune.

    Example: trajtune models list
    """
    from trajtune.models.resolve import list_models

    rows = list_models()
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        typer.echo(f"{r['name']}  {r['description']}" + (f" (licence: {r['licence']})" if r["licence"] else ""))
        if not r["installed"]:
            typer.echo(f"  installed: no; install with: {r['install']}")
            continue
        typer.echo(f"  gguf:   {r['gguf'] or 'assembled from its parts on first use'}  {_size(r['gguf_bytes'])}")
        hf = f"{r['hf_dir']}  {_size(r['hf_bytes'])}" if r["hf_dir"] else \
            f"not prepared (run: trajtune models prepare {r['name']})"
        typer.echo(f"  hf dir: {hf}")


@models_app.command("prepare")
def prepare_command(
    name: Annotated[str, typer.Argument(help="A model alias (see `trajtune models list`) or a .gguf file.")],
) -> None:
    """Convert an alias's GGUF or a .gguf file once into a cached Hugging Face directory; print the directory.

    Training and evaluation convert on first use anyway; this does it ahead of time (about a minute
    on CPU for a 135M model). A second call finds the cached directory and returns at once.

    Example: trajtune models prepare smollm2-135m
    Example: trajtune models prepare ./my-model.Q4_K_M.gguf
    """
    from trajtune.models.resolve import resolve_model

    converted = []

    def notify(message: str) -> None:
        converted.append(message)
        typer.echo(message, err=True)

    src = resolve_model(name, notify=notify)  # a ModelLoadError: `error: ...` and its exit code (4)
    if src.kind not in ("alias", "gguf"):
        typer.echo(f"{name} is a {'directory' if src.kind == 'dir' else 'hub id'}: it loads as is, nothing to prepare")
        return
    typer.echo(f"{'prepared' if converted else 'already prepared'}: {src.path}")
