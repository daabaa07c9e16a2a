"""``trajtune envs ...``: describe the registered environments."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from trajtune.errors import UsageError

envs_app = typer.Typer(
    help="List and describe environments.\n\nExample: trajtune envs show workspace",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _first_line(text: str) -> str:
    return (text or "").strip().splitlines()[0] if (text or "").strip() else ""


@envs_app.command("list")
def list_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list instead of a table.")] = False,
) -> None:
    """List the registered environments with a one-line description.

    Example: trajtune envs list
    """
    # lazy: the CLI's start-up loads only the command modules, not what they run
    from trajtune.envs import list_envs

    rows = []
    for name, factory in list_envs().items():
        desc = getattr(factory, "description", "") or _first_line(getattr(factory, "__doc__", "") or "")
        rows.append({"name": name, "description": _first_line(desc), "max_turns": getattr(factory, "max_turns", None)})
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    width = max((len(r["name"]) for r in rows), default=4)
    for r in rows:
        typer.echo(f"{r['name']:<{width}}  {r['description']}")


@envs_app.command("show")
def show_command(
    name: Annotated[str, typer.Argument(help="Environment name (see `trajtune envs list`).")],
    split: Annotated[str, typer.Option(help="Split of the example task: train or test.")] = "train",
    seed: Annotated[int, typer.Option(help="Seed of the example task.")] = 0,
) -> None:
    """Describe one environment: its options, tools, reward terms, install line (plug-ins on an extra), an
    example task and the expert's solution.

    Example: trajtune envs show sokoban --seed 3
    """
    # lazy: the CLI's start-up loads only the command modules, not what they run
    from trajtune.envs import make_env

    env = make_env(name)  # an unknown name is an EnvError naming the known ones
    if split not in ("train", "test"):
        raise UsageError(f"--split must be train or test, got {split!r}")
    typer.echo(f"{name}: {env.description or _first_line(type(env).__doc__ or '')}")
    typer.echo(f"max_turns: {env.max_turns}")
    if splits := (env.splits() if hasattr(env, "splits") else None):  # a benchmark's fixed task set
        typer.echo("tasks: " + ", ".join(f"{k} {v}" for k, v in splits.items()))
        if split not in splits:  # a benchmark has only a test split: show one of its tasks
            split = next(iter(splits))
    # getattr: a duck-typed plug-in need not subclass Environment, where both are declared
    if install := getattr(env, "install", ""):  # a plug-in on an optional extra says how to get it
        typer.echo(f"install: {install}")
    if terms := getattr(env, "reward_terms", ()):  # what reward.terms can weigh (info.NAME)
        typer.echo("reward terms: " + ", ".join(terms) + "  (weigh them in reward.terms as info.NAME)")
    options = _options(name)
    typer.echo("options (--env-arg KEY=VALUE, or env.kwargs in a config):" + ("" if options else " none"))
    for line in options:
        typer.echo(f"  {line}")
    task = env.tasks(split, 1, seed)[0]
    reset = env.reset(task)
    typer.echo("tools:")
    for t in reset.tools:
        props = t.parameters.get("properties", {})
        req = set(t.parameters.get("required", []))
        args = ", ".join(f"{k}{'' if k in req else '?'}: {v.get('type', 'any')}" for k, v in props.items())
        typer.echo(f"  {t.name}({args}) - {t.description}")
    typer.echo(f"example task {task.id}:")
    for m in reset.messages:
        if m.role != "system":
            typer.echo(f"  [{m.role}] {m.text()}")
    try:
        traj = env.expert(task)
    except NotImplementedError:
        typer.echo("expert: none")
        return
    typer.echo(f"expert ({len([m for m in traj.messages if m.role == 'assistant'])} turns, "
               f"success={traj.outcome.success if traj.outcome else None}, reward={traj.reward}):")
    for m in traj.messages[len(reset.messages):]:
        if m.tool_calls:
            for c in m.tool_calls:
                typer.echo(f"  [call] {c.name}({json.dumps(c.arguments or {}, ensure_ascii=False)})")
        else:
            text = m.text().replace("\n", "\n         ")
            typer.echo(f"  [{m.role}] {text}")
    typer.echo("final state:")
    typer.echo("  " + env.render().replace("\n", "\n  "))


def _options(name: str) -> list[str]:
    """``key = default`` (``key`` alone when required) for each keyword the environment's factory takes."""
    import inspect

    from trajtune.envs.registry import list_envs

    factory = list_envs().get(name)
    model = getattr(factory, "options_model", None)  # options validated by a pydantic model (e.g. fncall)
    if model is not None:
        shown = []
        for k, f in model.model_fields.items():
            value = f.get_default(call_default_factory=True)  # a default_factory's value, not "PydanticUndefined"
            shown.append(f"{k} = {value!r}  ({f.description})" if f.description else f"{k} = {value!r}")
        return shown
    try:
        params = inspect.signature(factory).parameters.values() if factory is not None else []
    except (TypeError, ValueError):  # no signature to read (a builtin)
        return []
    shown = []
    for p in params:
        if p.kind == p.VAR_KEYWORD:
            shown.append("any keyword the environment documents (see its description)")
            continue
        if p.kind == p.VAR_POSITIONAL or p.name == "self":
            continue
        shown.append(p.name if p.default is p.empty else f"{p.name} = {p.default!r}")
    return shown
