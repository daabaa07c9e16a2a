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
    from trajtune.envs import make_env
    from trajtune.errors import EnvError, OutputError, UsageError
    from trajtune.schema import AtomicJsonlWriter

    kwargs = _env_kwargs(env_arg)
    probe = make_env(env, **kwargs)  # an unknown name or argument is an EnvError naming the known ones
    if split not in ("train", "test"):
        raise UsageError(f"--split must be train or test, got {split!r}")
    if out.exists() and not overwrite:
        raise OutputError(f"{out} exists; pass --overwrite to replace it")
    tasks = probe.tasks(split, n, seed)
    kept = successes = 0
    terminations: dict[str, int] = {}
    with AtomicJsonlWriter(out, overwrite=overwrite) as writer:
        for task in tasks:
            try:
                traj = make_env(env, **kwargs).expert(task)
            except NotImplementedError as e:
                raise EnvError(f"environment {env!r} has no scripted expert: {e}") from None
            ok = bool(traj.outcome and traj.outcome.success)
            successes += ok
            term = (traj.outcome.termination if traj.outcome else None) or "unknown"
            terminations[term] = terminations.get(term, 0) + 1
            if only_success and not ok:
                continue
            writer.write(traj)
            kept += 1
    terms = ", ".join(f"{k}={v}" for k, v in sorted(terminations.items()))
    typer.echo(f"wrote {kept} trajectories to {out} ({successes}/{len(tasks)} expert successes; {terms})")
