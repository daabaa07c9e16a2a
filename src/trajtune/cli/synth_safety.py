"""``trajtune data synth-safety``: refusal and benign-completion trajectories for safety fine-tuning.

A plain function so ``cli/main.py`` can attach it with ``data_app.command("synth-safety")(...)``;
the logic lives in ``trajtune.safety.synth``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from trajtune.errors import EnvError, OutputError, UsageError, require_at_least
from trajtune.schema import AtomicJsonlWriter


def synth_safety(
    out: Annotated[Path, typer.Option("-o", "--out", help="Output JSONL file (IR trajectories).")],
    n: Annotated[int, typer.Option("--n", help="Trajectories to write: half refusals of harmful requests, "
                                                      "half tool-using completions of their benign twins.")] = 200,
    seed: Annotated[int, typer.Option(help="Seed of the task generator.")] = 0,
    split: Annotated[str, typer.Option(help="Task split: train (default) or test (kept for evaluation).")] = "train",
    categories: Annotated[Optional[str], typer.Option(
        "--categories", help="Harm categories to draw from, comma-separated (default: all; docs/safety.md).")] = None,
    worlds: Annotated[Optional[str], typer.Option(
        "--worlds", help="Tool worlds to draw from, comma-separated: messaging, files, home, bank, social.")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace OUT if it exists.")] = False,
) -> None:
    """Write safety SFT data: refusals for harmful tool requests and completions for their benign look-alikes,
    from the `safety` environment's verified expert (mix it with capability data: docs/safety.md).

    Example: trajtune data synth-safety --n 400 -o data/safety.jsonl --seed 0

    Example: trajtune data mix data/home.jsonl:0.8 data/safety.jsonl:0.2 -o data/mixed.jsonl
    """
    # lazy: the CLI's start-up loads only the command modules, not what they run
    from trajtune.safety.synth import synth_safety as synth

    require_at_least(("--n", n, 1), ("--seed", seed, 0))
    if split not in ("train", "test"):
        raise UsageError(f"--split must be train or test, got {split!r}")
    if out.is_dir():
        raise OutputError(f"cannot write {out}: it is a directory; name a file inside it")
    if out.exists() and not overwrite:
        raise OutputError(f"{out} exists; pass --overwrite to replace it")

    def names(text: str | None) -> list[str] | None:
        return [x.strip() for x in text.split(",") if x.strip()] if text else None

    try:
        trajs = synth(n, seed=seed, split=split, categories=names(categories), worlds=names(worlds))
        harmful = 0
        with AtomicJsonlWriter(out, overwrite=overwrite) as writer:
            for traj in trajs:
                harmful += bool(traj.metadata["safety"]["harmful"])
                writer.write(traj)
    except ValueError as e:  # an unknown category or world
        raise EnvError(str(e)) from None
    typer.echo(f"wrote {writer.count} safety trajectories to {out} ({harmful} refusals, {writer.count - harmful} "
               "benign completions)")
