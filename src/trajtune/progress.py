"""Live progress bars (rich) for long work; silent when not attached to a terminal-like console."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

console = Console(stderr=True)


@contextmanager
def bar(description: str, total: int, enabled: bool = True) -> Iterator[Callable[..., None]]:
    """Yields ``advance(n=1, **fields)``; fields (e.g. loss=0.3) are shown beside the bar."""
    if not enabled:
        yield lambda n=1, **kw: None
        return
    progress = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
        console=console, transient=False,
    )
    with progress:
        task = progress.add_task(description, total=total, info="")

        def advance(n: int = 1, **fields: Any) -> None:
            info = "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in fields.items())
            progress.update(task, advance=n, info=info)

        yield advance
