"""Progress for long work: a live bar (rich) on a terminal, and plain lines at a steady interval
when stderr is a log file, nohup or CI, so a long stage never looks hung there."""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

console = Console(stderr=True)

#: seconds between two log lines when stderr is not a terminal (``TRAJTUNE_PROGRESS_INTERVAL``)
LOG_INTERVAL_S = 30.0


def _fields(fields: dict[str, Any]) -> str:
    return "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in fields.items())


def _duration(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def _interval() -> float:
    raw = os.environ.get("TRAJTUNE_PROGRESS_INTERVAL")
    try:
        return max(0.0, float(raw)) if raw else LOG_INTERVAL_S
    except ValueError:
        return LOG_INTERVAL_S


class _LogLines:
    """``done/total``, rate, elapsed and ETA as one plain line every ``interval`` seconds and at the end."""

    def __init__(self, description: str, total: int, interval: float, clock: Callable[[], float] = time.monotonic):
        self.description, self.total, self.interval, self.clock = description, total, interval, clock
        self.start = self.last = clock()
        self.done, self.info, self.printed_at = 0, "", -1

    def line(self) -> str:
        elapsed = self.clock() - self.start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        eta = _duration((self.total - self.done) / rate) if rate > 0 and self.total >= self.done else "?"
        unit = f"{rate:.2f}/s" if rate >= 1 or rate == 0 else f"{1 / rate:.1f} s each"
        info = f"  {self.info}" if self.info else ""
        return (f"{self.description}: {self.done}/{self.total} ({self.done / self.total:.0%}) {unit}, "
                f"elapsed {_duration(elapsed)}, eta {eta}{info}" if self.total else
                f"{self.description}: {self.done} done, elapsed {_duration(elapsed)}{info}")

    def advance(self, n: int = 1, **fields: Any) -> None:
        self.done += n
        if fields:
            self.info = _fields(fields)
        now = self.clock()
        if now - self.last >= self.interval:
            self.emit()
            self.last = now

    def emit(self) -> None:
        console.print(self.line(), highlight=False, markup=False, soft_wrap=True)
        self.printed_at = self.done

    def finish(self) -> None:
        """The final count, when earlier lines were printed (work shorter than one interval prints
        nothing: its stage's own result line follows at once)."""
        if self.printed_at >= 0 and self.printed_at != self.done:
            self.emit()


@contextmanager
def bar(description: str, total: int, enabled: bool = True) -> Iterator[Callable[..., None]]:
    """Yields ``advance(n=1, **fields)``; fields (e.g. loss=0.3) are shown beside the bar (or the line)."""
    if not enabled:
        yield lambda n=1, **kw: None
        return
    if not console.is_terminal:
        lines = _LogLines(description, total, _interval())
        yield lines.advance
        lines.finish()
        return
    progress = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
        console=console, transient=False,
    )
    with progress:
        task = progress.add_task(description, total=total, info="")

        def advance(n: int = 1, **fields: Any) -> None:
            progress.update(task, advance=n, info=_fields(fields))

        yield advance


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MB (ru_maxrss is in KiB on Linux)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


class StageClock:
    """Wall time and peak memory of each stage of a multi-stage job (the real demo, a recipe), as
    their summaries report them: ``with clock("sft"): ...`` then ``clock.times["sft"]``."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}
        self.peak: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.time()
        yield
        self.times[name] = round(time.time() - start, 1)
        self.peak[name] = peak_rss_mb()  # the process's peak so far: the stage that raised it shows
