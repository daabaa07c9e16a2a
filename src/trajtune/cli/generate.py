"""``trajtune data generate``: expert trajectories from a built-in environment, in the IR.

A plain function so the ``data`` command group can attach it with
``data_app.command("generate")(generate)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from trajtune.cli.eval_cmd import _env_kwargs
from trajtune.errors import OutputError, UsageError, require_at_least


def generate(
    env: Annotated[str, typer.Option("--env", help="Environment: a name (`trajtune envs list`), module:Class, an inline YAML mapping such as "
                                                "'{gym: mymod:Game}' / '{mcp: {command: [python, srv.py], tasks_file: t.jsonl}}' / "
                                                "'{python_tools: mymod:Tools, kwargs: {...}}', or a YAML file with one (docs/envs.md).")],
    out: Annotated[Path, typer.Option("-o", "--out", help="Output JSONL file (IR trajectories).")],
    n: Annotated[int, typer.Option("--n", help="Number of tasks (one expert trajectory each; at least 1).")] = 100,
    split: Annotated[str, typer.Option(help="Task split: train or test (their task seeds never overlap).")] = "train",
    seed: Annotated[int, typer.Option(help="Seed of the task generator (0 or more).")] = 0,
    overwrite: Annotated[bool, typer.Option(help="Replace OUT if it exists.")] = False,
    only_success: Annotated[bool, typer.Option(help="Keep only trajectories whose outcome is a success.")] = False,
    env_arg: Annotated[Optional[list[str]], typer.Option(
        "--env-arg", help="Environment argument key=value (repeatable), e.g. single_turn=true.")] = None,
    policy: Annotated[Optional[str], typer.Option(
        "--policy", help="Who acts: the environment's scripted expert (default), or openai:URL, an "
                         "OpenAI-compatible endpoint (a teacher model, `trajtune serve`, vLLM).")] = None,
    policy_model: Annotated[str, typer.Option(
        "--policy-model", help="With --policy openai:URL: the model name sent to the endpoint.")] = "default",
    temperature: Annotated[float, typer.Option(
        "--temperature", help="With --policy openai:URL: sampling temperature (0 or more).")] = 0.0,
) -> None:
    """Write trajectories for N tasks of an environment (atomic write): the scripted expert's, or a
    teacher model's through an OpenAI-compatible endpoint (distillation data).

    Example: trajtune data generate --env workspace --n 200 -o data/workspace.jsonl

    Example: trajtune data generate --env fncall --n 2000 --env-arg single_turn=true -o data/fncall.jsonl

    Example: trajtune data generate --env home --n 100 --policy openai:http://127.0.0.1:8000/v1 --only-success -o teacher.jsonl
    """
    # a value out of range is one `error:` line like every other mistake, not typer's usage box
    require_at_least(("--n", n, 1), ("--seed", seed, 0), ("--temperature", temperature, 0))
    # lazy: imports torch, which the CLI's start-up (`trajtune --help`) must not load
    from trajtune.config import env_from_cli
    from trajtune.envs import make_env

    spec = env_from_cli(env, _env_kwargs(env_arg))
    env, kwargs = spec.name, spec.kwargs
    probe = make_env(env, **kwargs)  # an unknown name or argument is an EnvError naming the known ones
    if split not in ("train", "test"):
        raise UsageError(f"--split must be train or test, got {split!r}")
    if out.exists() and not overwrite:
        raise OutputError(f"{out} exists; pass --overwrite to replace it")
    tasks = probe.tasks(split, n, seed)
    teacher = None
    if policy is not None:
        # lazy: the CLI's start-up loads only the command modules, not what they run
        from trajtune.envs.adapters.openai_policy import endpoint_policy

        teacher = endpoint_policy(policy, policy_model, temperature, option="--policy")
    # lazy: the CLI's start-up loads only the command modules, not what they run
    from trajtune.envs.expert_data import write_expert_data

    stats = write_expert_data(env, kwargs, tasks, out, overwrite=overwrite, only_success=only_success,
                              teacher=teacher, teacher_name=policy or "")
    typer.echo(stats.line(out, "teacher" if teacher is not None else "expert"))

