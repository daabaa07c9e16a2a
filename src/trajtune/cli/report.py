"""``trajtune report``: one self-contained HTML page for a run (trajtune.report)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from trajtune.progress import console


def report_cmd(
    run_dir: Path = typer.Argument(..., help="A run's output_dir (sft, rl, rft, dpo), an `eval --out` directory, "
                                             "or a demo directory."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Where to write the page (default: "
                                                                 "RUN_DIR/report.html)."),
    max_episodes: int = typer.Option(200, "--max-episodes", help="Episodes embedded in the viewer, evenly "
                                                                        "spread over each source."),
    tokens: bool = typer.Option(True, "--tokens/--no-tokens", help="Render each episode's tokens with the run's "
                                                                   "tokenizer (provenance, weights, truncation)."),
) -> None:
    """Write an HTML report: config, metric curves, eval tables and a trajectory viewer.

    The page is one file with no network use (inline CSS/JS/SVG); open it from disk. The viewer
    filters episodes by source, task, outcome, termination and step; click an episode for its
    messages, tool calls, tool results and turn rewards; tick "token view" to see its tokens
    coloured by provenance (prompt, policy, env) with weights, advantages and where truncation cut.
    Training runs and `trajtune eval --out` write it themselves when they finish (report: false /
    --no-report turns that off).

    Example: trajtune report runs/rl-home

    Example: trajtune report runs/demo/eval-dir --out /tmp/eval.html --max-episodes 50
    """
    # lazy: the CLI's start-up loads only the command modules, not what they run
    from trajtune.errors import require_at_least
    from trajtune.report import write_report

    require_at_least(("--max-episodes", max_episodes, 1))
    path = write_report(run_dir, out, max_episodes=max_episodes, tokens=tokens)
    console.print(f"report: {path}", soft_wrap=True)
