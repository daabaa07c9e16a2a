"""Entry point of the `trajtune` command. Each command group lives in its own module."""

from __future__ import annotations

import typer

from trajtune import __version__
from trajtune.cli import run as _run
from trajtune.cli.data import data_app
from trajtune.cli.doctor import doctor_cmd
from trajtune.cli.envs import envs_app
from trajtune.cli.generate import generate
from trajtune.cli.models import models_app

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


_run.register(app)
app.command("doctor")(doctor_cmd)
data_app.command("generate")(generate)
app.add_typer(data_app, name="data",
              help="Validate, convert, inspect, mix, split, dedup and generate trajectory data.")
app.add_typer(envs_app, name="envs")
app.add_typer(models_app, name="models")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
