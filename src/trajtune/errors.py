"""The one error policy: errors a user can fix are ``UserError``s, each kind with a fixed exit code.

The CLI prints a ``UserError`` as one line (``error: <message>``) and exits with its code; any other
exception is a bug and is shown with its traceback (``trajtune --debug`` shows tracebacks for user
errors too). Library code raises the most specific class below; the older classes that live next to
their code (``config.ConfigError``, ``schema.RecordError``, ``chat.render.RenderError``,
``models.loading.ModelLoadError``, ``train.RunDirError``) are subclasses of these, so one ``except
UserError`` catches them all. The table is documented in docs/architecture.md and in
``trajtune --help``; ``EXIT_CODES`` is its single source.

This module imports nothing from trajtune, so every layer may use it.
"""

from __future__ import annotations

import errno
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar


class UserError(Exception):
    """A condition the user can fix (bad option, bad input, existing output, ...): never a bug."""

    exit_code: ClassVar[int] = 2
    #: Shown before the message ("error: ..."); empty for an interruption, whose message says it.
    label: ClassVar[str] = "error"

    def __str__(self) -> str:
        # Avoid KeyError's quoting when a subclass also derives from KeyError.
        return str(self.args[0]) if self.args else ""


class UsageError(UserError, ValueError):
    """Invalid command-line options, or options that contradict each other."""

    exit_code = 2


class ConfigError(UserError, ValueError):
    """An invalid run configuration (YAML file or --set override)."""

    exit_code = 2


class DataError(UserError, ValueError):
    """Input data that cannot be read: a missing file, invalid JSON, a record that breaks a rule."""

    exit_code = 3


class InputNotFoundError(DataError, FileNotFoundError):
    """An input file or directory named by the user does not exist."""

    exit_code = 3


class ModelLoadError(UserError, ValueError):
    """A model or tokenizer that cannot be loaded from the given id or path."""

    exit_code = 4


class RenderError(UserError, ValueError):
    """A chat template that cannot render the data, or would train on the wrong tokens."""

    exit_code = 5


class EnvError(UserError, ValueError):
    """An unknown environment, or bad environment arguments."""

    exit_code = 6


class WorkerLost(EnvError):
    """A remote rollout worker (a Ray actor) or its cluster went away. Not an observation: the step
    runner re-raises it instead of showing the policy an error message to learn from."""


class OutputError(UserError, FileExistsError):
    """The output location's state forbids the command: an output file or directory exists."""

    exit_code = 7


class RunDirError(OutputError):
    """A run directory that cannot be used as asked: it exists, holds nothing to resume, or a resume
    would silently change the run's configuration."""


class StorageError(OutputError):
    """The disk or folder refuses a write or read the user can fix: full, read-only, no permission.
    Raised from the ``OSError`` where it happened (``storage_error``), so the message names the file."""


_STORAGE_HINTS = {
    errno.ENOSPC: "the disk is full: free space, or write somewhere else (--out / output_dir)",
    errno.EDQUOT: "the disk quota is used up: free space, or write somewhere else (--out / output_dir)",
    errno.EROFS: "the file system is read-only: write somewhere else (--out / output_dir)",
    errno.EACCES: "no permission: check the folder's permissions, or use another path",
    errno.EPERM: "not permitted: check the folder's permissions, or use another path",
}


def storage_hint(code: int | None) -> str | None:
    """What to do about an OS error number the user can fix (full, read-only, forbidden), or None."""
    return _STORAGE_HINTS.get(code) if code is not None else None


def storage_error(e: BaseException) -> StorageError | None:
    """The user-fixable form of an OS error (full disk, read-only or forbidden path), or None."""
    hint = storage_hint(e.errno) if isinstance(e, OSError) else None
    if hint is None:
        return None
    where = f"{e.filename}: " if e.filename else ""
    return StorageError(f"{where}{e.strerror or e}; {hint}")


class ServerError(UserError, RuntimeError):
    """A generation server (``rollout.server``) that cannot be used: unreachable, answering with an
    HTTP error, or unable to return what token-exact RL needs (token ids, log-probs, weight sync).
    The message names the URL and what failed. Also the in-process vLLM engine (``rollout.vllm``)
    when it returns turns trajtune did not ask for, or log-probs that are not the learner's."""

    exit_code = 8
class RankFailed(UserError, RuntimeError):
    """A process of a multi-process run died or stopped answering: a collective failed or timed out
    (``TRAJTUNE_DIST_TIMEOUT_S``). The surviving ranks stop with this instead of hanging; the message
    names the lost rank, the step and the checkpoint ``--resume`` continues from."""

    exit_code = 9

    def __init__(self, message: str, lost: Sequence[int] = ()):
        super().__init__(message)
        self.lost = list(lost)  # the lost ranks, when known


class Interrupted(UserError):
    """Ctrl-C: the command stopped; the message says what was kept and how to continue."""

    exit_code = 130
    label = ""  # the message itself starts with "interrupted"


#: exit code -> meaning, in the order documented. 0 and 1 are not errors of this family:
#: 1 is "the check you asked for failed" (data validate, doctor) and also what Python exits with on a bug.
EXIT_CODES: dict[int, str] = {
    0: "success",
    1: "a check failed (`data validate` found errors, `doctor` found a failing check), or an internal "
       "error (a bug: shown with a traceback)",
    UsageError.exit_code: "invalid option or configuration (UsageError, ConfigError)",
    DataError.exit_code: "input data missing or invalid (DataError, InputNotFoundError, RecordError)",
    ModelLoadError.exit_code: "model or tokenizer cannot be loaded (ModelLoadError)",
    RenderError.exit_code: "chat template cannot render or would mis-mask (RenderError)",
    EnvError.exit_code: "unknown environment or bad environment arguments (EnvError)",
    OutputError.exit_code: "output exists, nothing to resume, a resume would change the config, or the disk "
                           "refuses the write: full, read-only (OutputError, RunDirError, StorageError)",
    ServerError.exit_code: "a generation server is unreachable, fails, or cannot return token ids / log-probs; "
                           "vLLM's log-probs differ from the learner's (ServerError)",
    RankFailed.exit_code: "a process of a multi-process run died or stopped answering (RankFailed); the message "
                          "names the checkpoint --resume continues from",
    Interrupted.exit_code: "interrupted with Ctrl-C (Interrupted); the message says how to continue",
}


def require_input(path: str | Path, what: str | None = None) -> Path:
    """``path`` as a Path, or InputNotFoundError naming it: the same check, message and exit code in
    every command. ``what`` says where the path came from (e.g. ``"data.path"``)."""
    p = Path(path)
    if not p.exists():
        raise InputNotFoundError(f"{p}: no such file or directory" + (f" ({what})" if what else ""))
    return p


def require_at_least(*checks: tuple[str, float, float]) -> None:
    """Each ``(flag, value, least)`` with ``value < least`` is refused as one ``error:`` line (exit 2).
    Why not typer's ``min=``: that prints a usage box instead of the line every other mistake gets."""
    for flag, value, least in checks:
        if value < least:
            raise UsageError(f"{flag} must be at least {least:g}, not {value:g}")
