"""``trajtune data generate``: expert trajectories from a built-in environment, in the IR.

A plain function so the ``data`` command group can attach it with
``data_app.command("generate")(generate)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer


def generate(
    env: Annotated[str, typer.Option("--env", help="Environment name (see `trajtune envs list`).")],
    out: Annotated[Path, typer.Option("-o", "--out", help="Output JSONL file (IR trajectories).")],
    n: Annotated[int, typer.Option("--n", min=1, help="Number of tasks (one expert trajectory each).")] = 100,
    split: Annotated[str, typer.Option(help="Task split: train or test (their task seeds never overlap).")] = "train",
    seed: Annotated[int, typer.Option(min=0, help="Seed of the task generator.")] = 0,
    overwrite: Annotated[bool, typer.Option(help="Replace OUT if it exists.")] = False,
    only_success: Annotated[bool, typer.Option(help="Keep only trajectories whose outcome is a success.")] = False,
    env_arg: Annotated[Optional[list[str]], typer.Option(
        "--env-arg", help="Environment argument key=value (repeatable), e.g. single_turn=true.")] = None,
) -> None:
    """Write scripted-expert trajectories for N tasks of an environment (atomic write).

    Example: trajtune data generate --env workspace --n 200 -o data/workspace.jsonl

    Example: trajtune data generate --env fncall --n 2000 --env-arg single_turn=true -o data/fncall.jsonl
    """
    from trajtune.cli.eval_cmd import _env_kwargs
    from trajtune.envs import list_envs, make_env
    from trajtune.schema import AtomicJsonlWriter

    if env not in list_envs():
        typer.echo(f"error: unknown environment {env!r}; known: {', '.join(list_envs())}", err=True)
        raise typer.Exit(2)
    if split not in ("train", "test"):
        typer.echo(f"error: --split must be train or test, got {split!r}", err=True)
        raise typer.Exit(2)
    if out.exists() and not overwrite:
        typer.echo(f"error: {out} exists; pass --overwrite to replace it", err=True)
        raise typer.Exit(1)
    try:
        kwargs = _env_kwargs(env_arg)
        first = make_env(env, **kwargs)
    except (TypeError, ValueError) as e:  # an argument the environment does not take, or a bad value
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    tasks = first.tasks(split, n, seed)
    kept = successes = 0
    terminations: dict[str, int] = {}
    try:
        with AtomicJsonlWriter(out, overwrite=overwrite) as writer:
            for task in tasks:
                try:
                    traj = make_env(env, **kwargs).expert(task)
                except NotImplementedError as e:
                    typer.echo(f"error: {e}", err=True)
                    raise typer.Exit(1) from None
                ok = bool(traj.outcome and traj.outcome.success)
                successes += ok
                term = (traj.outcome.termination if traj.outcome else None) or "unknown"
                terminations[term] = terminations.get(term, 0) + 1
                if only_success and not ok:
                    continue
                writer.write(traj)
                kept += 1
    except FileExistsError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    terms = ", ".join(f"{k}={v}" for k, v in sorted(terminations.items()))
    typer.echo(f"wrote {kept} trajectories to {out} ({successes}/{len(tasks)} expert successes; {terms})")
