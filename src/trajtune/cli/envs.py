"""``trajtune envs ...``: describe the registered environments."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

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
    env_arg: Annotated[list[str] | None, typer.Option(
        "--env-arg", help="Environment option key=value (repeatable), as in train and eval.")] = None,
) -> None:
    """Describe one environment: its options, tools, reward terms, install line (plug-ins on an extra), an
    example task and the expert's solution.

    Example: trajtune envs show sokoban --seed 3
    Example: trajtune envs show spec --env-arg path=calendar
    """
    # lazy: the CLI's start-up loads only the command modules, not what they run
    from trajtune.cli.eval_cmd import _env_kwargs
    from trajtune.envs import make_env

    env = make_env(name, **_env_kwargs(env_arg))  # an unknown name is an EnvError naming the known ones
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


@envs_app.command("generate")
def generate_command(
    specs: Annotated[list[Path] | None, typer.Argument(
        help="Tool spec files: OpenAPI 3 (JSON or YAML), a JSON list of tools (OpenAI tools or bare "
             "{name, description, parameters}), or an MCP tools/list answer ({\"tools\": [...]}).")] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory to write environment.json into.")] = Path("env"),
    mcp: Annotated[str | None, typer.Option(
        help="Read the tools of a live MCP stdio server instead, started with this command line.")] = None,
    name: Annotated[str | None, typer.Option(help="The environment's name (default: the first spec's).")] = None,
    check: Annotated[int, typer.Option(help="Sample tasks the self-check solves with the expert (0: none).")] = 20,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing environment.json in --out.")] = False,
) -> None:
    """Generate a verifiable environment from tool specs: a simulated backend with state (records the tools
    create, read, change and delete), tasks with a starting state and goals, a verifier on the final state,
    and a scripted expert for SFT data.

    What each tool does is inferred from the spec (HTTP method and path, the tool's verb, MCP's readOnlyHint)
    and written to environment.json for you to read and edit; `x-trajtune: {op, resource, id}` on a tool
    overrides it. Use the result with --env spec --env-arg path=DIR (or env: {name: spec, kwargs: {path: DIR}}).

    Example: trajtune envs generate api.openapi.yaml --out envs/api
    Example: trajtune envs generate --mcp "python my_server.py" --out envs/mine
    Example: trajtune data generate --env spec --env-arg path=envs/api --n 200 -o data/api.jsonl
    """
    import shlex

    from trajtune.envs.spec_env import WORLD_FILE, self_check
    from trajtune.envs.spec_read import read_mcp_server, read_spec
    from trajtune.envs.spec_world import build_world
    from trajtune.schema import atomic_write_text

    if bool(specs) == bool(mcp):
        raise UsageError("give spec files or --mcp COMMAND (one of the two)")
    target = out / WORLD_FILE
    if target.exists() and not overwrite:
        raise UsageError(f"{target} already exists; pass --overwrite to replace it, or choose another --out")
    if mcp:
        tools, sources = read_mcp_server(shlex.split(mcp)), [f"mcp: {mcp}"]
    else:
        tools = [t for s in specs or [] for t in read_spec(s)]
        sources = [str(s) for s in specs or []]
    default_name = "mcp" if mcp else (specs or [Path("spec")])[0].name.split(".")[0]
    world = build_world(tools, name or default_name, sources)
    report = self_check(world, check) if check > 0 else None
    if report is not None and report["expert_solved"] < report["tasks"]:
        shown = "\n  ".join(report["failures"])
        raise UsageError(f"the generated world fails its self-check: the expert solved {report['expert_solved']} of "
                         f"{report['tasks']} sample tasks:\n  {shown}\nfix what environment.json infers with "
                         "x-trajtune: {op, resource, id} on the tools named there")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(target, json.dumps(world, indent=1, ensure_ascii=False))
    _print_world(world, report, target)


def _print_world(world: dict[str, Any], report: dict[str, Any] | None, target: Path) -> None:
    typer.echo(f"{world['name']}: {len(world['tools'])} tools, {len(world['resources'])} resources → {target}")
    for t in world["tools"]:
        idp = f" by {t['id_param']}" if t.get("id_param") else ""
        typer.echo(f"  {t['name']:<24} {t['op']:<7} {t['resource']}{idp}")
    for res, info in world["resources"].items():
        typer.echo(f"  resource {res}: fields {', '.join(info['fields'])}; named by {info.get('descriptor') or '(id)'}")
    if report is not None:
        typer.echo(f"self-check on {report['tasks']} tasks: the expert solves {report['expert_solved']} "
                   f"({report['mean_expert_turns']} turns on average); ending at once solves {report['idle_solved']}")
    typer.echo(f"next: trajtune envs show spec --env-arg path={target.parent}   (or --env spec --env-arg "
               f"path={target.parent} in data generate, train, eval)")
