"""``trajtune config show|init``: every run-config key, and a commented starter file (trajtune.config_docs)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import click
import typer
from typer.core import TyperCommand

config_app = typer.Typer(help="Discover run configs: every key with its default and meaning, or a starter file.\n\n"
                              "Example: trajtune config show rl", no_args_is_help=True)


def _config_class(algorithm: str) -> type:
    from trajtune.algorithms.registry import algorithms
    from trajtune.errors import UsageError

    known = algorithms()
    if algorithm not in known:
        raise UsageError(f"unknown algorithm {algorithm!r}; known: {', '.join(sorted(known))}")
    return known[algorithm].config


class _AlgorithmArgHelp(TyperCommand):
    """Fills in the ALGORITHM argument's help from the algorithm registry when --help is shown (not at
    import: loading the registry imports every algorithm module, torch included)."""

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        from trajtune.algorithms.registry import algorithms

        for p in self.params:
            if p.name == "algorithm":
                p.help = f"The algorithm: {', '.join(sorted(algorithms()))}."
        super().format_help(ctx, formatter)


@config_app.command("show", cls=_AlgorithmArgHelp)
def show(
    algorithm: str = typer.Argument(..., help="An algorithm name (--help lists them)."),
    yaml_: bool = typer.Option(False, "--yaml", help="Print the commented YAML (what `config init` writes) "
                                                     "instead of the table."),
) -> None:
    """Print every key of an algorithm's run config: type, default and what it does.

    Example: trajtune config show rl

    Example: trajtune config show sft --yaml > my_sft.yaml
    """
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from trajtune.config_docs import commented_yaml, field_docs

    cls = _config_class(algorithm)
    if yaml_:
        typer.echo(commented_yaml(cls, algorithm), nl=False)
        return
    table = Table(title=f"{algorithm} run config (YAML keys; --set KEY=VALUE on the command line)", show_lines=False)
    for col in ("key", "type", "default", "description"):
        table.add_column(col, overflow="fold")
    for d in field_docs(cls):
        if d.key == "algorithm":
            default = algorithm
        elif d.required:
            default = "[bold red]required[/bold red]"
        elif d.section and not d.optional_section:
            default = ""
        elif d.optional_section:
            default = "off"
        else:
            from trajtune.config_docs import yaml_value

            default = escape(yaml_value(d.default))
        table.add_row(escape(d.key), escape(d.type if not d.section else "section"), default, escape(d.description))
    Console().print(table)


@config_app.command("init", cls=_AlgorithmArgHelp)
def init(
    algorithm: str = typer.Argument(..., help="An algorithm name (--help lists them)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="File to write (default: ALGORITHM.yaml); an "
                                                                 "existing file is refused unless --overwrite."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing file."),
) -> None:
    """Write a commented starter config: every key with its default and description.

    The keys marked REQUIRED hold starter values (model smollm2-135m, env home, ...) to edit; the
    file validates as written.

    Example: trajtune config init rl -o my_rl.yaml && trajtune train --config my_rl.yaml
    """
    from trajtune.config_docs import commented_yaml
    from trajtune.errors import OutputError
    from trajtune.progress import console
    from trajtune.schema import atomic_write_text

    cls = _config_class(algorithm)
    path = out or Path(f"{algorithm}.yaml")
    if path.exists() and not overwrite:
        raise OutputError(f"{path} exists; pass --overwrite to replace it or -o to write elsewhere")
    atomic_write_text(path, commented_yaml(cls, algorithm))
    console.print(f"wrote {path}: edit the REQUIRED keys, then `trajtune train --config {path}`", soft_wrap=True)
