"""Entry point of the `trajtune` command. Each command group lives in its own module.

The one error policy lives here (``TrajtuneGroup.invoke``): a ``trajtune.errors.UserError`` from any
command becomes ``error: <message>`` on stderr and its exit code; anything else is a bug and is
shown with its traceback (exit 1). ``--debug`` shows the traceback of user errors too.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Annotated, Any

import click
import typer
from typer.core import TyperGroup, TyperOption
from typer.exceptions import TyperException

from trajtune import __version__
from trajtune.cli import run as _run
from trajtune.cli.config_cmd import config_app
from trajtune.cli.data import data_app
from trajtune.cli.doctor import doctor_cmd
from trajtune.cli.envs import envs_app
from trajtune.cli.export_cmd import register as _register_export
from trajtune.cli.generate import generate
from trajtune.cli.synth_safety import synth_safety
from trajtune.cli.merge_cmd import register as _register_merge
from trajtune.cli.models import models_app
from trajtune.cli.probe import probe_app
from trajtune.cli.ping import ping_cmd
from trajtune.cli.report import report_cmd
from trajtune.cli.serve import serve_cmd
from trajtune.errors import EXIT_CODES, Interrupted, RankFailed, UserError, storage_error


def _exit_code_epilog() -> str:
    rows = "\n\n".join(f"{code}: {meaning}" for code, meaning in EXIT_CODES.items())
    return f"Exit codes (see docs/architecture.md):\n\n{rows}"


def report_error(e: BaseException, debug: bool) -> int:
    """Print ``e`` the way the error policy says and return the exit code."""
    if isinstance(e, KeyboardInterrupt):
        e = Interrupted("interrupted")
    e = storage_error(e) or e  # a full disk or a read-only folder is the user's to fix, not a bug
    if isinstance(e, UserError):
        if debug:
            traceback.print_exception(e, file=sys.stderr)
        click.echo(f"{e.label}: {e}" if e.label else str(e), err=True)
        return e.exit_code
    traceback.print_exception(e, file=sys.stderr)
    click.echo(f"trajtune {__version__}: internal error ({type(e).__name__}); this is a bug, please report it "
               "with the traceback above", err=True)
    return 1


# Control flow that typer/click handle themselves: exits, usage errors (typer vendors its own click,
# whose exceptions derive from TyperException), and a closed stdout (`trajtune ... | head`).
_PASS_THROUGH = (typer.Exit, typer.Abort, TyperException, click.exceptions.Exit, click.ClickException,
                 click.exceptions.Abort, SystemExit, BrokenPipeError)


_display_type = TyperOption.display_type_rich


def _flag_aware_display_type(self: TyperOption, ctx: click.Context) -> str | None:
    """Help shows an option's value type (<int>, <path>); a flag takes no value, so it shows none
    (typer prints <bool>, which reads as if `--resume true` were expected)."""
    return None if self.is_flag else _display_type(self, ctx)


TyperOption.display_type_rich = _flag_aware_display_type  # type: ignore[method-assign]


class TrajtuneGroup(TyperGroup):
    """The root command group; it applies the error policy to every sub-command."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except _PASS_THROUGH:
            raise
        except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001  (the one place that classifies errors)
            debug = bool(ctx.params.get("debug")) or os.environ.get("TRAJTUNE_DEBUG", "") not in ("", "0")
            code = report_error(e, debug)
            if isinstance(e, RankFailed):  # a peer is gone: the process group's threads can abort the
                sys.stdout.flush()         # interpreter's teardown (SIGABRT), so leave with the code now
                sys.stderr.flush()
                os._exit(code)
            raise typer.Exit(code) from None


app = typer.Typer(
    name="trajtune",
    cls=TrajtuneGroup,
    help="Fine-tune open language models into better agents.\n\nExample: trajtune demo --out runs/demo",
    epilog=_exit_code_epilog(),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for user errors too "
                                        "(also: TRAJTUNE_DEBUG=1).")] = False,
) -> None:
    """trajtune: fine-tune open language models into better agents."""


@app.command()
def version() -> None:
    """Print the trajtune version.

    Example: trajtune version
    """
    typer.echo(__version__)


_run.register(app)
app.command("doctor")(doctor_cmd)
app.command("serve")(serve_cmd)
app.command("report")(report_cmd)
app.command("ping")(ping_cmd)
_register_merge(app)
_register_export(app)
data_app.command("generate")(generate)
data_app.command("synth-safety")(synth_safety)
app.add_typer(data_app, name="data",
              help="Validate, convert, inspect, mix, split, dedup and generate trajectory data.")
app.add_typer(envs_app, name="envs")
app.add_typer(models_app, name="models")
app.add_typer(config_app, name="config")
app.add_typer(probe_app, name="probe")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
