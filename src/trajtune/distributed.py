"""Data-parallel training across processes (``accelerate launch -m trajtune.cli train ...``).

Every rank runs the same program on the same config: it builds the same step experience (sources
are functions of the step and the seed), keeps its share of the step's units (rank r takes units
r, r + W, ...), and the gradient sums and loss denominators are added across ranks before the
optimizer step, so one step equals the single-process step on the whole batch (up to float
rounding). Only rank 0 writes: the run directory, logs, checkpoints, the final model.

Ranks come from the launcher's environment (``RANK``, ``WORLD_SIZE``), so they are known before
any model is loaded; the process group is the one accelerate sets up (gloo on CPU, NCCL on GPUs).

A lost rank: every collective waits at most ``TRAJTUNE_DIST_TIMEOUT_S`` seconds (default
``DEFAULT_TIMEOUT_S``). When a peer process dies (its connection closes) or stops answering (the
timeout passes), the collective's error becomes ``RankFailed`` naming the lost rank, and the
learner adds the step and the checkpoint ``--resume`` continues from. Which rank was lost: the
peers on this host whose process is gone (process ids are exchanged at ``init``), else, with two
ranks, the other one.

Sharded training (``train.sharding: fsdp``, ``trajtune.sharding``) keeps this layout with one
difference: a forward pass of a sharded model is itself a collective (each layer gathers its
parameters from every rank), so every rank must run the same forward passes in the same order.
``sharded()`` tells the experience sources so: with it, rollouts and mining run whole on every
rank (``sampling_ranks``) instead of split, and the learner pads each rank's micro-batches to the
same count.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from trajtune.errors import ConfigError, RankFailed

#: Seconds a collective waits for the other ranks before the run stops with RankFailed. Long enough
#: for rank 0's own work between collectives (RFT/DPO mining, writing a checkpoint), which the others
#: wait for at a barrier.
DEFAULT_TIMEOUT_S = 1800.0
TIMEOUT_ENV = "TRAJTUNE_DIST_TIMEOUT_S"

_peers: list[tuple[str, int]] = []  # (host, pid) of every rank, exchanged at init
_sharded: list[bool] = [False]  # set by init(sharded=True): the weights are sharded across the ranks

def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def is_main() -> bool:
    return rank() == 0


def timeout_s() -> float:
    """The collective timeout in seconds: ``TRAJTUNE_DIST_TIMEOUT_S``, else ``DEFAULT_TIMEOUT_S``."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConfigError(f"{TIMEOUT_ENV}={raw!r}: must be a positive number of seconds")
    return value


def init(sharded: bool = False) -> None:
    """Join the launcher's process group, with the collective timeout (a no-op in a single process).
    ``sharded``: the run shards its weights across the ranks (``train.sharding: fsdp``; see ``sharded``)."""
    _sharded[0] = sharded and world_size() > 1
    if world_size() > 1:
        from datetime import timedelta

        from accelerate import PartialState

        PartialState(timeout=timedelta(seconds=timeout_s()))
        _peers[:] = all_gather((socket.gethostname(), os.getpid()))


def sharded() -> bool:
    """Whether the weights are sharded across several ranks, so that every forward pass is a collective
    and every rank must run the same ones (``init(sharded=True)`` with more than one process)."""
    return _sharded[0]


def sampling_ranks() -> tuple[int, int]:
    """(rank, world) over which rollouts are split: data-parallel ranks sample one share each and
    gather; with sharded weights each rank samples them all (identically: same seeds, same gathered
    weights), because a sharded forward needs every rank."""
    return (0, 1) if sharded() else (rank(), world_size())


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:  # a dead child the launcher has not reaped yet is a zombie
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True


def lost_ranks(wait_s: float = 2.0) -> list[int]:
    """The ranks this one has lost: peers on this host whose process is gone (looked for during up to
    ``wait_s`` seconds: a dying process takes a moment to go), else, with two ranks, the other one
    (dead on another host, or not answering); empty when it cannot be told."""
    me, host = rank(), socket.gethostname()
    deadline = time.monotonic() + wait_s
    gone: list[int] = []
    while _peers:
        gone = [r for r, (h, pid) in enumerate(_peers) if r != me and h == host and not _alive(pid)]
        if gone or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    if not gone and world_size() == 2:
        gone = [1 - me]
    return gone


def _rank_failed(err: BaseException, what: str) -> RankFailed:
    lost = lost_ranks()
    who = f"rank {', '.join(map(str, lost))}" if lost else "a rank (which one is not known here)"
    first = (str(err).splitlines() or [""])[0][:200]
    return RankFailed(f"{who} lost ({what}: {first})", lost)


def _call(collective: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Run one torch.distributed collective; its failure (a peer died, or the timeout passed) raises
    ``RankFailed`` naming the lost rank."""
    try:
        return collective(*args, **kwargs)
    except RuntimeError as e:  # what gloo and NCCL raise (DistBackendError is a RuntimeError)
        raise _rank_failed(e, getattr(collective, "__name__", "collective")) from None


#: Words of the errors gloo and NCCL raise when a peer is gone or silent (lower case).
_PEER_FAILURE = ("connection closed", "connection reset", "broken pipe", "timed out", "gloo", "nccl")


def is_peer_failure(err: BaseException) -> bool:
    """Whether ``err`` is a collective's failure (a peer died or stopped answering), not a bug."""
    import torch.distributed as tdist

    error_type = getattr(tdist, "DistError", None)
    return (error_type is not None and isinstance(err, error_type)) \
        or any(k in str(err).lower() for k in _PEER_FAILURE)


@contextmanager
def peer_failures(what: str) -> Iterator[None]:
    """Collectives that torch runs itself (a sharded model's parameter gathers in every forward,
    the gathers of a checkpoint) do not pass through ``_call``: inside this block, their failure
    becomes ``RankFailed`` naming the lost rank as well. Any other error passes unchanged."""
    try:
        yield
    except RuntimeError as e:
        if isinstance(e, RankFailed) or world_size() == 1 or not is_peer_failure(e):
            raise
        raise _rank_failed(e, what) from None


def describe_loss(err: RankFailed, step: int, checkpoint: int | None) -> RankFailed:
    """The one-line message for a rank lost during ``step``: who, when, and where ``--resume`` starts."""
    lost = err.lost
    who = f"rank {', '.join(map(str, lost))}" if lost else "a rank"
    where = (f"the last checkpoint is step {checkpoint}" if checkpoint is not None
             else "there is no checkpoint yet, so it starts again from step 0")
    return RankFailed(f"{who} lost at step {step}; resume with the same command and --resume: {where} "
                      f"(seen by rank {rank()})", lost)


def crash_for_test(step: int) -> None:
    """Test-only hook, not a feature: with ``TRAJTUNE_TEST_CRASH_RANK=R`` and
    ``TRAJTUNE_TEST_CRASH_STEP=S`` set, rank R exits at once (``os._exit``: no cleanup and no
    message, like a killed process) when it starts step S. Used by tests/test_distributed.py."""
    if os.environ.get("TRAJTUNE_TEST_CRASH_RANK") == str(rank()) \
            and os.environ.get("TRAJTUNE_TEST_CRASH_STEP") == str(step):
        os._exit(17)


def finish() -> None:
    """End a multi-process run cleanly: wait until every rank is done (rank 0 writes the artifacts
    last), then destroy the process group, so no rank exits while another still talks to it (a peer
    that disappears mid-teardown can make gloo abort the survivor)."""
    if world_size() > 1:
        import torch.distributed as tdist

        if tdist.is_available() and tdist.is_initialized():
            _call(tdist.barrier)
            tdist.destroy_process_group()


def exit_finished(code: int = 0) -> None:
    """End the process of a finished multi-process run at once (after ``finish``), skipping the
    interpreter's and the native libraries' teardown. Why: with every file written and the process
    group destroyed, a rank could still abort in teardown ("terminate called without an active
    exception", SIGABRT: a collective backend's thread torn down by a static destructor), and the
    launcher then reports the finished run as failed (seen in about 1 of 4 test-suite runs here)."""
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def barrier() -> None:
    if world_size() > 1:
        import torch.distributed as dist

        _call(dist.barrier)


def all_sum(values: list[float]) -> list[float]:
    """Element-wise sum over ranks (float64)."""
    return _all_reduce(values, "SUM")


def all_max(values: list[float]) -> list[float]:
    """Element-wise maximum over ranks (float64)."""
    return _all_reduce(values, "MAX")


def _all_reduce(values: list[float], op: str) -> list[float]:
    if world_size() == 1:
        return values
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64)
    _call(dist.all_reduce, t, op=getattr(dist.ReduceOp, op))
    return t.tolist()


def all_gather(obj: Any) -> list[Any]:
    if world_size() == 1:
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * world_size()
    _call(dist.all_gather_object, out, obj)
    return out


def sum_gradients(params: list[Any]) -> None:
    """Add every parameter's gradient across ranks, in one flat buffer (a rank that had no rows this
    step contributes zeros)."""
    if world_size() == 1:
        return
    import torch
    import torch.distributed as dist

    grads = []
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grads.append(p.grad)
    flat = torch.cat([g.reshape(-1) for g in grads])
    _call(dist.all_reduce, flat, op=dist.ReduceOp.SUM)
    i = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[i:i + n].view_as(g))
        i += n


def check_in_sync(params: list[Any], step: int) -> None:
    """Every rank must hold the same weights (they apply the same summed gradients); a rank whose
    experience differed would drift silently, so compare a checksum and stop if it did."""
    if world_size() == 1:
        return
    import torch

    with torch.no_grad():
        local = float(sum(p.detach().double().abs().sum() for p in params))
    sums = all_gather(local)
    if max(sums) - min(sums) > 1e-9 * max(1.0, abs(sums[0])):
        raise RuntimeError(f"step {step}: the ranks' weights differ (checksums {sums}); their step experience "
                           "was not identical — a bug, please report it")


def check_same_experience(digest: str, step: int) -> None:
    """With sharded weights every rank must build exactly the same step (it runs the same forward
    passes); compare a digest of it and stop if a rank's differs, rather than train on mismatched
    collectives."""
    if world_size() == 1:
        return
    digests = all_gather(digest)
    if len(set(digests)) > 1:
        raise RuntimeError(f"step {step}: the ranks built different experience (digests {digests}); sharded training "
                           "needs every rank to compute the same rollouts — a bug or a nondeterministic environment")
