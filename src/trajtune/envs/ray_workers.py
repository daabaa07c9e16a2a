"""Environments that live in Ray actors (``rollout.ray``; the optional ``ray`` extra).

Why: an environment can be heavier than the policy's share of a rollout (a code sandbox, a game
engine, a browser, an MCP server), or need other machines. Here each rollout worker is a Ray
actor holding many environment instances; the learner process keeps generating (the model stays
where it is) and every ``reset``/``step``/``success`` goes to the actor that holds the episode.
``RemoteEnv`` is an ``Environment`` whose methods are remote calls, so the agent loop, the step
runner (concurrency, timeouts, error observations) and every algorithm use it unchanged, and a
deterministic environment gives exactly the episodes it gives in-process.

A worker that dies (the node, the cluster, an out-of-memory kill) is not an environment error: it
raises ``WorkerLost`` naming the worker and how to resume, instead of turning into observations
the policy would be trained on. Exceptions the environment itself raises come back as themselves.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

from trajtune.envs.base import Environment, ResetResult, StepResult, Task
from trajtune.envs.registry import make_env
from trajtune.envs.runner import step_batch
from trajtune.errors import ConfigError, EnvError, WorkerLost
from trajtune.schema import Message, ToolSpec, Trajectory

#: Seconds an actor call may take beyond the step timeout before the worker counts as lost.
GRACE_S = 120.0


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError("rollout.ray needs Ray: pip install 'trajtune[ray]'") from None
    return ray


class _EnvWorker:
    """The actor: environment instances by handle, created on first use from (name, kwargs)."""

    def __init__(self, name: str, kwargs: dict[str, Any]):
        self.name, self.kwargs = name, kwargs
        self.envs: dict[int, Environment] = {}
        self.lock = threading.Lock()

    def describe(self) -> dict[str, Any]:
        env = make_env(self.name, **self.kwargs)
        return {"name": env.name, "description": env.description, "max_turns": env.max_turns,
                "deterministic": env.deterministic}

    def _env(self, h: int) -> Environment:
        with self.lock:
            if h not in self.envs:
                self.envs[h] = make_env(self.name, **self.kwargs)
            return self.envs[h]

    def reset(self, h: int, task: Task) -> ResetResult:
        return self._env(h).reset(task)

    def reach(self, h: int, task: Task, prefix: list[Message]) -> tuple[list[Message], list[ToolSpec], bool]:
        return self._env(h).reach(task, prefix)

    def step(self, h: int, action: Message, timeout_s: float) -> StepResult:
        # the runner's guard inside the actor, so a hung step answers "timeout" and frees the worker
        return step_batch([self._env(h)], [action], timeout_s=timeout_s, max_workers=1)[0]

    def call(self, h: int, method: str, *args: Any) -> Any:
        return getattr(self._env(h), method)(*args)

    def drop(self, h: int) -> None:
        with self.lock:
            self.envs.pop(h, None)

    def live(self) -> int:
        return len(self.envs)


class RayEnvPool:
    """``num_workers`` actors on a Ray cluster (``address``; default: a local one started here),
    each holding environments ``make_env(name, **kwargs)``; ``factory()`` hands out ``RemoteEnv``s
    round-robin over the workers."""

    def __init__(self, name: str, kwargs: dict[str, Any] | None = None, *, num_workers: int = 2,
                 address: str | None = None, cpus_per_worker: float = 1.0, step_timeout_s: float = 30.0,
                 concurrency: int = 16):
        ray = _ray()
        self.name, self.kwargs = name, dict(kwargs or {})
        self.address = address or "a local Ray cluster"
        self.step_timeout_s = step_timeout_s
        if not ray.is_initialized():
            try:
                ray.init(address=address, include_dashboard=False, log_to_driver=False,
                         configure_logging=False, **({} if address else {"num_cpus": max(1, num_workers)}))
            except Exception as e:  # noqa: BLE001 - a cluster that cannot be joined is the user's setup
                raise EnvError(f"rollout.ray: cannot start or join Ray at {self.address}: {e}") from None
        actor = ray.remote(num_cpus=cpus_per_worker, max_concurrency=concurrency)(_EnvWorker)
        self.workers = [actor.remote(name, self.kwargs) for _ in range(num_workers)]
        infos = [self.get(w.describe.remote(), i, "starting") for i, w in enumerate(self.workers)]
        self.info = infos[0]
        self._handles = itertools.count()
        self._lock = threading.Lock()

    def get(self, ref: Any, worker: int, what: str, timeout: float | None = None) -> Any:
        """``ray.get`` with a dead worker or cluster turned into ``WorkerLost`` and the environment's
        own exceptions re-raised as themselves."""
        ray = _ray()
        try:
            return ray.get(ref, timeout=timeout)
        except ray.exceptions.RayTaskError as e:  # the environment raised: its own exception, as in-process
            raise e.as_instanceof_cause() from None
        except (ray.exceptions.RayError, ConnectionError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise WorkerLost(
                f"Ray rollout worker {worker} of {len(self.workers)} ({self.address}) was lost while {what}: "
                f"{type(e).__name__}: {first}. This step's episodes are lost; the checkpoints already written are "
                "complete: resume the run with --resume once the cluster is healthy") from None

    def factory(self) -> RemoteEnv:
        with self._lock:
            h = next(self._handles)
        return RemoteEnv(self, h % len(self.workers), h)

    def live_envs(self) -> int:
        return sum(self.get(w.live.remote(), i, "counting") for i, w in enumerate(self.workers))

    def shutdown(self) -> None:
        ray = _ray()
        for w in self.workers:
            ray.kill(w)
        self.workers = []


class RemoteEnv(Environment):
    """One episode's environment, held by a Ray worker; every method is a call to it."""

    def __init__(self, pool: RayEnvPool, worker: int, handle: int):
        self.pool, self.worker, self.handle = pool, worker, handle
        self.name = pool.info["name"]
        self.description = pool.info["description"]
        self.max_turns = pool.info["max_turns"]
        self.deterministic = pool.info["deterministic"]

    def _call(self, what: str, ref: Any, timeout: float | None = None) -> Any:
        return self.pool.get(ref, self.worker, what, timeout)

    @property
    def _actor(self) -> Any:
        return self.pool.workers[self.worker]

    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        return self._call("generating tasks", self._actor.call.remote(self.handle, "tasks", split, n, seed))

    def reset(self, task: Task) -> ResetResult:
        return self._call(f"resetting task {task.id}", self._actor.reset.remote(self.handle, task))

    def reach(self, task: Task, prefix: list[Message]) -> tuple[list[Message], list[ToolSpec], bool]:
        return self._call(f"reaching a state of task {task.id}", self._actor.reach.remote(self.handle, task, prefix))

    def step(self, action: Message) -> StepResult:
        t = self.pool.step_timeout_s
        return self._call("stepping", self._actor.step.remote(self.handle, action, t), timeout=t + GRACE_S)

    def success(self) -> bool:
        return bool(self._call("checking success", self._actor.call.remote(self.handle, "success")))

    def expert(self, task: Task) -> Trajectory:
        return self._call("running the expert", self._actor.call.remote(self.handle, "expert", task))

    def render(self) -> str:
        return str(self._call("rendering", self._actor.call.remote(self.handle, "render")))

    def __del__(self) -> None:  # the worker forgets the episode's state (fire and forget)
        try:
            if self.pool.workers:
                self._actor.drop.remote(self.handle)
        except Exception:  # noqa: BLE001 - interpreter shutdown, or a cluster already gone
            pass


def env_factory(name: str, kwargs: dict[str, Any], ray: Any = None, step_timeout_s: float = 30.0) -> Any:
    """What rollouts build environments with: in-process ``make_env``, or ``RemoteEnv``s on a pool
    of Ray workers when ``ray`` (a ``rollout.ray`` section) is given."""
    if ray is None:
        return lambda: make_env(name, **kwargs)
    pool = RayEnvPool(name, kwargs, num_workers=ray.num_workers, address=ray.address,
                      cpus_per_worker=ray.cpus_per_worker, step_timeout_s=step_timeout_s)
    return pool.factory
