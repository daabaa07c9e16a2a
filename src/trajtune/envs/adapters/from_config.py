"""Environments named in a YAML config or on the command line, not only registered ones.

Why: the adapters (a Python tool class, a gym-style game, an MCP tool server, any Environment
class) were usable only from Python; a config could name only a registered built-in. Now
``env:`` (and ``--env``) also takes:

- ``module:Class`` or ``module:factory`` (``env.kwargs`` are its arguments) returning an Environment;
- ``{python_tools: module:ToolClass, kwargs: {tasks: [...], reward_fn: module:fn, ...}}``;
- ``{gym: ID}``: a gymnasium id (gymnasium installed) or ``module:Class`` of a gym-style game;
- ``{mcp: {command: [python, server.py], tasks: [...], reward_fn: module:fn, ...}}``: an MCP
  server over stdio.

``config.EnvSpec`` turns the short forms into a registered factory name here (``python_tools``,
``gym``, ``mcp``) plus plain, JSON-able kwargs, so run.json and config.yaml record them and Ray
workers rebuild them. Callables (reward, success, prompt) are ``module:function`` strings;
tasks are a list of mappings or a JSONL file (``tasks_file``) with ``id``, ``prompt`` and any
other data; a task without ``split`` is offered in both splits. A bad reference names the module
or attribute and the import error.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from trajtune.envs.adapters.gym_text import GymTextEnv
from trajtune.envs.adapters.mcp_tools import MCPClient, MCPError, MCPToolsEnv
from trajtune.envs.adapters.python_tools import PythonToolsEnv
from trajtune.envs.adapters.server_pool import ServerPool
from trajtune.envs.base import Environment, Task
from trajtune.errors import EnvError


def resolve_ref(ref: str, what: str) -> Any:
    """``package.module:attr`` (attr may be dotted) → the object."""
    if not isinstance(ref, str) or ":" not in ref:
        raise EnvError(f"{what}: expected module:name (e.g. mypackage.tools:Bank), got {ref!r}")
    mod_name, _, attr = ref.partition(":")
    try:
        obj: Any = importlib.import_module(mod_name)
    except Exception as e:  # noqa: BLE001 - ImportError, or the module's own error at import
        raise EnvError(f"{what} {ref!r}: cannot import module {mod_name!r}: {type(e).__name__}: {e}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise EnvError(f"{what} {ref!r}: module {mod_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def make_from_ref(ref: str, **kwargs: Any) -> Environment:
    """``module:Class`` / ``module:factory`` called with ``kwargs``; it must give an Environment."""
    target = resolve_ref(ref, "env")
    if not callable(target):
        raise EnvError(f"env {ref!r} is not a class or function")
    try:
        env = target(**kwargs)
    except TypeError as e:
        raise EnvError(f"env {ref!r}: {e}") from None
    if not isinstance(env, Environment):
        raise EnvError(f"env {ref!r} returned {type(env).__name__}, not a trajtune Environment (subclass "
                       "trajtune.envs.Environment, or use python_tools / gym / mcp for other objects)")
    return env


def _fn(ref: str | None, what: str) -> Callable[..., Any] | None:
    if ref is None:
        return None
    fn = resolve_ref(ref, what)
    if not callable(fn):
        raise EnvError(f"{what} {ref!r} is not callable")
    return fn


def load_tasks(tasks: Sequence[dict[str, Any]] | None, tasks_file: str | None,
               where: str) -> Callable[[str, int, int], list[Task]]:
    """Tasks from a list or a JSONL file, as ``tasks(split, n, seed)``."""
    rows: list[dict[str, Any]] = []
    if tasks_file is not None:
        p = Path(tasks_file)
        if not p.exists():
            raise EnvError(f"{where}.tasks_file: {p} does not exist")
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise EnvError(f"{p}:{i}: not JSON ({e.msg}); each line is a task like "
                                   '{"id": "t1", "prompt": "...", "split": "test"}') from None
    rows += list(tasks or [])
    out: list[tuple[str | None, Task]] = []
    for i, r in enumerate(rows):
        if not isinstance(r, dict) or "prompt" not in r:
            raise EnvError(f"{where}: task {i + 1} must be a mapping with a prompt (and optionally id, split, "
                           f"data), got {r!r}")
        data = {k: v for k, v in r.items() if k not in ("id", "split", "seed")}
        out.append((r.get("split"), Task(id=str(r.get("id", f"task-{i + 1}")), seed=int(r.get("seed", i)),
                                         data=data)))
    if not out:
        raise EnvError(f"{where}: no tasks; give tasks: [{{id: t1, prompt: ...}}] or tasks_file: tasks.jsonl")

    def pick(split: str, n: int, seed: int = 0) -> list[Task]:
        return [Task(id=t.id, seed=t.seed, split=split, data=t.data)
                for s, t in out if s in (None, split)][:n]

    return pick


def python_tools(toolbox: str, tasks: list[dict[str, Any]] | None = None, tasks_file: str | None = None,
                 reward_fn: str | None = None, success_fn: str | None = None, prompt: str | None = None,
                 system_prompt: str | None = None, max_turns: int = 8, name: str | None = None,
                 deterministic: bool = False) -> Environment:
    """A Python class whose public methods are the tools (``PythonToolsEnv``), from a config."""
    cls = resolve_ref(toolbox, "python_tools")
    return PythonToolsEnv(cls, tasks=load_tasks(tasks, tasks_file, "python_tools"),
                          reward_fn=_fn(reward_fn, "python_tools.reward_fn"),
                          success_fn=_fn(success_fn, "python_tools.success_fn"), prompt=prompt,
                          system_prompt=system_prompt, max_turns=max_turns,
                          name=name or toolbox.rpartition(":")[2], deterministic=deterministic)


def gym(id: str, instructions: str = "", action_mode: str = "text", max_turns: int = 20, name: str | None = None,
        kwargs: dict[str, Any] | None = None) -> Environment:  # noqa: A002 - the gymnasium term
    """A gymnasium id, or a ``module:Class`` with gymnasium's reset/step, as a text environment."""
    args = dict(kwargs or {})
    if ":" in id:
        game = resolve_ref(id, "gym")
        make: Callable[[], Any] = lambda: game(**args)  # noqa: E731
    else:
        try:
            import gymnasium
        except ImportError:
            raise EnvError(f"gym: {id!r} is a gymnasium id, and gymnasium is not installed (pip install gymnasium); "
                           "or give module:Class of a gym-style game") from None
        make = lambda: gymnasium.make(id, **args)  # noqa: E731
    try:
        return GymTextEnv(make, name=name or id.rpartition(":")[2], instructions=instructions,
                          action_mode=action_mode, max_turns=max_turns)
    except ValueError as e:
        raise EnvError(f"gym {id!r}: {e}") from None


_SERVERS = ServerPool()


def mcp(command: list[str], tasks: list[dict[str, Any]] | None = None, tasks_file: str | None = None,
        reward_fn: str | None = None, success_fn: str | None = None, reset_tool: str | None = None,
        system_prompt: str | None = None, name: str = "mcp", max_turns: int = 8, env: dict[str, str] | None = None,
        call_timeout_s: float = 30.0) -> Environment:
    """The tools of an MCP server over stdio (``MCPToolsEnv``), from a config. Servers are pooled:
    give ``reset_tool`` when the server keeps state between episodes."""
    if not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command):
        raise EnvError(f"mcp.command must be a list of strings, e.g. [python, server.py], got {command!r}")
    key = json.dumps([command, env or {}])
    try:
        client = _SERVERS.borrow(key, lambda: MCPClient(command, env=env, call_timeout_s=call_timeout_s))
    except MCPError as e:
        raise EnvError(f"mcp: {e}") from None
    kwargs: dict[str, Any] = {}
    if system_prompt is not None:
        kwargs["system_prompt"] = system_prompt

    picker = load_tasks(tasks, tasks_file, "mcp")

    class PooledMCPEnv(MCPToolsEnv):
        def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
            return picker(split, n, seed)

        def close(self) -> None:  # the server goes back to the pool, not down
            pass

        def __del__(self) -> None:
            _SERVERS.give_back(key, self.client)

    return PooledMCPEnv(command, tasks=(), reward_fn=_fn(reward_fn, "mcp.reward_fn"),
                     success_fn=_fn(success_fn, "mcp.success_fn"), reset_tool=reset_tool, name=name,
                     max_turns=max_turns, client=client, **kwargs)
