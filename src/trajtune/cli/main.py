"""Entry point of the `trajtune` command. Each command group lives in its own module."""

from __future__ import annotations

import typer

from trajtune import __version__

app = typer.Typer(
    name="trajtune",
    help="Fine-tune open language models into better agents.\n\nExample: trajtune demo --out runs/demo",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """trajtune: fine-tune open language models into better agents."""


@app.command()
def version() -> None:
    """Print the trajtune version.

    Example: trajtune version
    """
    typer.echo(__version__)


from trajtune.cli.data import data_app  # noqa: E402

app.add_typer(data_app, name="data", help="Validate, convert, inspect, mix, split and dedup trajectory data.")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
