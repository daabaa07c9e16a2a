"""Running tool servers shared by the episodes of one process.

Starting an MCP server costs about half a second and a process, so an episode borrows a running one
and gives it back when it is done: a run starts as many servers as episodes run at once, not one
per episode, and none outlives the process. A server that died is never handed out again, and one
that has served ``max_uses`` episodes is stopped (a server that keeps every episode's state in
memory, as τ²-bench's do, would otherwise grow without bound).
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable
from typing import Any


class ServerPool:
    """Clients by key (what started them); a client needs ``close()`` and may have ``running``."""

    def __init__(self, max_uses: int | None = None) -> None:
        if max_uses is not None and max_uses < 1:
            raise ValueError(f"max_uses must be at least 1, got {max_uses}")
        self.max_uses = max_uses
        self.free: dict[str, list[Any]] = {}
        self.all: list[Any] = []
        self.uses: dict[int, int] = {}
        self.lock = threading.Lock()
        atexit.register(self.close)

    def borrow(self, key: str, start: Callable[[], Any]) -> Any:
        """A free running client for ``key``, or a new one from ``start()``."""
        dead: list[Any] = []
        client = None
        with self.lock:
            free = self.free.get(key, [])
            while free and client is None:
                c = free.pop()
                if getattr(c, "running", True):
                    client = c
                else:
                    dead.append(c)
                    self._forget(c)
        for c in dead:
            _close(c)
        if client is not None:
            return client
        client = start()
        with self.lock:
            self.all.append(client)
        return client

    def give_back(self, key: str, client: Any) -> None:
        """Return a client after an episode; a dead or worn-out one is stopped instead."""
        if client is None:
            return
        with self.lock:
            n = self.uses[id(client)] = self.uses.get(id(client), 0) + 1
            retire = not getattr(client, "running", True) or (self.max_uses is not None and n >= self.max_uses)
            if retire:
                self._forget(client)
            else:
                self.free.setdefault(key, []).append(client)
        if retire:
            _close(client)

    def _forget(self, client: Any) -> None:
        if client in self.all:
            self.all.remove(client)
        self.uses.pop(id(client), None)

    def close(self) -> None:
        with self.lock:
            clients, self.all, self.free, self.uses = self.all, [], {}, {}
        for c in clients:
            _close(c)


def _close(client: Any) -> None:
    try:
        client.close()
    except Exception:  # noqa: BLE001 - a server that is going away anyway
        pass
