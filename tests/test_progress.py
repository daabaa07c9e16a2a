"""Progress when stderr is not a terminal: plain lines at a steady interval, with known numbers."""

from __future__ import annotations

import pytest

from trajtune import progress
from trajtune.progress import _LogLines, bar


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def lines_of(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return [x for x in capsys.readouterr().err.splitlines() if x.strip()]


def test_log_lines_every_interval_with_rate_and_eta(capsys: pytest.CaptureFixture[str]) -> None:
    clock = Clock()
    log = _LogLines("rollouts", 40, interval=30.0, clock=clock)
    for _ in range(10):  # 10 items in 20 s: under one interval, nothing yet
        clock.t += 2.0
        log.advance()
    assert lines_of(capsys) == []
    for _ in range(5):  # 15 items at 30 s: one line; 0.5 items/s, 25 left → eta 50 s
        clock.t += 2.0
        log.advance(loss=0.25)
    assert lines_of(capsys) == ["rollouts: 15/40 (38%) 2.0 s each, elapsed 0:30, eta 0:50  loss=0.25"]
    for _ in range(25):  # the rest: one more line at 60 s (30 items), and the final count at the end
        clock.t += 2.0
        log.advance()
    log.finish()
    out = lines_of(capsys)
    assert out == ["rollouts: 30/40 (75%) 2.0 s each, elapsed 1:00, eta 0:20  loss=0.25",
                   "rollouts: 40/40 (100%) 2.0 s each, elapsed 1:20, eta 0:00  loss=0.25"]


def test_fast_rates_and_unknown_totals() -> None:
    clock = Clock()
    log = _LogLines("tokens", 0, interval=1.0, clock=clock)
    clock.t += 4.0
    log.done = 10
    assert log.line() == "tokens: 10 done, elapsed 0:04"
    log = _LogLines("steps", 1000, interval=1.0, clock=clock)
    clock.t += 4000.0
    log.done = 500
    assert log.line() == "steps: 500/1000 (50%) 8.0 s each, elapsed 1:06:40, eta 1:06:40"
    log2 = _LogLines("fast", 100, interval=1.0, clock=clock)
    clock.t += 2.0
    log2.done = 50
    assert log2.line() == "fast: 50/100 (50%) 25.00/s, elapsed 0:02, eta 0:02"


def test_bar_prints_lines_when_stderr_is_a_log(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(progress.console, "_force_terminal", False)
    assert not progress.console.is_terminal  # pytest's captured stderr is a file, as a log is
    monkeypatch.setenv("TRAJTUNE_PROGRESS_INTERVAL", "0")  # a line per advance
    with bar("eval", 3) as advance:
        for _ in range(3):
            advance(success=0.5)
    out = lines_of(capsys)
    assert [x.split(" (")[0] for x in out] == ["eval: 1/3", "eval: 2/3", "eval: 3/3"]
    assert all(x.endswith("success=0.5") for x in out)
    with bar("quiet", 3, enabled=False) as advance:
        advance()
    assert lines_of(capsys) == []


def test_bad_interval_setting_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAJTUNE_PROGRESS_INTERVAL", "soon")
    assert progress._interval() == progress.LOG_INTERVAL_S
    monkeypatch.setenv("TRAJTUNE_PROGRESS_INTERVAL", "5")
    assert progress._interval() == 5.0
