"""MCP tool servers as environments, through the official ``mcp`` SDK (the ``mcp`` extra).

``MCPClient`` starts a server from a command over stdio and gives a *synchronous* facade
(``list_tools``, ``call_tool``, ``close``) over the SDK's async client: a private event loop
runs in a daemon thread and holds the session open, so environments (which are synchronous,
and stepped from worker threads by ``step_batch``) can call tools without touching asyncio.

``MCPToolsEnv`` exposes the server's tools as ToolSpecs (their ``inputSchema`` is already JSON
Schema) and forwards calls. One server process serves all episodes of an environment instance;
servers with per-episode state can offer a reset tool (``reset_tool=...``) that is called on
every ``reset``. Success and reward are user functions of the client and the task, so they can
query the server's state through its own tools.

Works with mcp 1.x and 2.x (only the stable client API is used: ``stdio_client``,
``ClientSession.initialize/list_tools/call_tool``).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from trajtune.envs.base import Environment, ResetResult, StepResult, Task
from trajtune.envs.tools import tool_message
from trajtune.schema import Message, ToolSpec


class MCPError(RuntimeError):
    """The MCP server could not be started or stopped answering."""


def _import_mcp() -> Any:
    try:
        import mcp  # noqa: F401
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ImportError("MCP support needs the official SDK: pip install 'trajtune[mcp]'") from e
    return ClientSession, StdioServerParameters, stdio_client


def _field(obj: Any, *names: str, default: Any = None) -> Any:
    """Read a field under its mcp 2.x (snake_case) or 1.x (camelCase) name."""
    for n in names:
        if hasattr(obj, n):
            return getattr(obj, n)
    return default


def content_to_text(blocks: Sequence[Any]) -> str:
    """Flatten MCP content blocks to text; non-text blocks become a short placeholder."""
    parts = []
    for b in blocks or []:
        kind = getattr(b, "type", None)
        if kind == "text":
            parts.append(b.text)
        elif kind == "resource":
            res = getattr(b, "resource", None)
            parts.append(getattr(res, "text", None) or f"[resource {getattr(res, 'uri', '')}]")
        else:
            parts.append(f"[{kind or 'content'}]")
    return "\n".join(parts)


class MCPClient:
    """A synchronous client for one MCP server started over stdio (see module docstring)."""

    def __init__(self, command: Sequence[str], *, env: dict[str, str] | None = None, cwd: str | None = None,
                 start_timeout_s: float = 30.0, call_timeout_s: float = 30.0):
        if not command:
            raise ValueError("MCPClient needs a command, e.g. ['python', 'server.py']")
        self.command = list(command)
        self.env = env
        self.cwd = cwd
        self.call_timeout_s = call_timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session: Any = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="trajtune-mcp")
        self._thread.start()
        if not self._ready.wait(start_timeout_s):
            self.close()
            raise MCPError(f"MCP server {self.command} did not start within {start_timeout_s:g}s")
        if self._error is not None:
            raise MCPError(f"could not start MCP server {self.command}: {self._error}") from self._error

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as e:  # noqa: BLE001 - reported to the constructor / callers
            self._error = self._error or e
        finally:
            self._ready.set()

    async def _main(self) -> None:
        ClientSession, StdioServerParameters, stdio_client = _import_mcp()
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        params = StdioServerParameters(command=self.command[0], args=self.command[1:], env=self.env, cwd=self.cwd)
        with open(os.devnull, "w") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    self._session = session
                    self._ready.set()
                    await self._stop.wait()

    def _submit(self, coro_fn: Callable[[], Any], timeout_s: float | None = None) -> Any:
        if self._session is None or self._loop is None or not self._thread.is_alive():
            raise MCPError("the MCP session is not running" + (f" ({self._error})" if self._error else ""))
        fut = asyncio.run_coroutine_threadsafe(coro_fn(), self._loop)
        try:
            return fut.result(timeout_s or self.call_timeout_s)
        except FutureTimeout:
            fut.cancel()
            raise MCPError(f"MCP call timed out after {timeout_s or self.call_timeout_s:g}s") from None

    def list_tools(self) -> list[ToolSpec]:
        result = self._submit(lambda: self._session.list_tools())
        specs = []
        for t in result.tools:
            schema = _field(t, "input_schema", "inputSchema", default=None) or {"type": "object", "properties": {}}
            raw = t.model_dump(mode="json", exclude_none=True) if hasattr(t, "model_dump") else None
            specs.append(ToolSpec(name=t.name, description=t.description or "", parameters=dict(schema), raw=raw,
                                  extra={"mcp": {"server": self.command[0]}}))
        return specs

    def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> tuple[str, bool]:
        """Call a tool; return (text, is_error). Transport failures raise MCPError."""
        result = self._submit(lambda: self._session.call_tool(name, arguments or {}))
        text = content_to_text(_field(result, "content", default=[]))
        structured = _field(result, "structured_content", "structuredContent", default=None)
        if not text and structured is not None:
            text = json.dumps(structured, ensure_ascii=False, sort_keys=True)
        return text, bool(_field(result, "is_error", "isError", default=False))

    @property
    def running(self) -> bool:
        """Whether the session is up (False once the server died or ``close`` was called)."""
        return self._session is not None and self._thread.is_alive()

    def close(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)

    def __enter__(self) -> "MCPClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class MCPToolsEnv(Environment):
    """The tools of an MCP server as an environment (see module docstring)."""

    def __init__(self, command: Sequence[str], *, tasks: Sequence[Task] = (),
                 prompt: Callable[[Task], str] | None = None, system_prompt: str = "Use the tools to complete the task, then reply with a short answer.",
                 reward_fn: Callable[[MCPClient, Task], float] | None = None,
                 success_fn: Callable[[MCPClient, Task], bool] | None = None,
                 reset_tool: str | None = None, name: str = "mcp", max_turns: int = 8,
                 env: dict[str, str] | None = None, call_timeout_s: float = 30.0, client: MCPClient | None = None):
        # ``client``: a running server to use instead of starting one (a pool of them, from_config.py)
        self.client = client or MCPClient(command, env=env, call_timeout_s=call_timeout_s)
        self.name = name
        self.max_turns = max_turns
        self._tasks = list(tasks)
        self._prompt = prompt
        self.system_prompt = system_prompt
        self.reward_fn = reward_fn
        self.success_fn = success_fn
        self.reset_tool = reset_tool
        self.tools = [t for t in self.client.list_tools() if t.name != reset_tool]
        self.task: Task | None = None
        self.log: list[str] = []
        self.description = f"MCP server: {' '.join(command)}"

    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        return [t for t in self._tasks if t.split == split][:n]

    def reset(self, task: Task) -> ResetResult:
        self.task = task
        self.log = []
        if self.reset_tool:
            _, is_error = self.client.call_tool(self.reset_tool, dict(task.data.get("reset_args", {})))
            if is_error:
                raise MCPError(f"reset tool {self.reset_tool!r} failed")
        text = self._prompt(task) if self._prompt else str(task.data.get("prompt", ""))
        return ResetResult(messages=[Message(role="system", content=self.system_prompt, origin="system"),
                                     Message(role="user", content=text, origin="user")], tools=list(self.tools))

    def step(self, action: Message) -> StepResult:
        if not action.tool_calls:
            reward = float(self.reward_fn(self.client, self.task)) if (self.reward_fn and self.task) else 0.0
            return StepResult(observations=[], reward=reward, done=True)
        obs = []
        known = {t.name for t in self.tools}
        for c in action.tool_calls:
            if c.name not in known:
                text = f"Error: unknown tool {c.name!r}; available tools: {', '.join(sorted(known))}"
            else:
                out, is_error = self.client.call_tool(c.name, c.arguments or {})
                text = f"Error: {out}" if is_error and not out.startswith("Error") else out
            self.log.append(f"{c.name}({json.dumps(c.arguments or {}, sort_keys=True)}) -> {text[:120]}")
            obs.append(tool_message(c.id, c.name, text))
        return StepResult(observations=obs, reward=0.0, done=False)

    def success(self) -> bool:
        return bool(self.success_fn and self.task and self.success_fn(self.client, self.task))

    def render(self) -> str:
        return "\n".join([f"[{self.name}] task={self.task.id if self.task else '-'}"] + [f"  {x}" for x in self.log[-10:]])

    def close(self) -> None:
        self.client.close()
