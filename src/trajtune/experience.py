"""Experience sources: what the learner trains on at each step.

``DatasetSource`` serves rendered trajectories (SFT, RFT); ``RolloutSource`` samples fresh groups
from the current policy in an environment and applies the transforms the algorithm hands it (the
RL ones: ``algorithms.rl.rl_transforms``); ``OneStepAhead`` samples them one step ahead, in the
background; ``IterativeSource`` re-mines data from the policy every iteration (RFT, DPO). All are
deterministic functions of the step index. This module knows no algorithm: what a transform does
is the algorithm's.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from trajtune import distributed as dist
from trajtune.chat.render import ChatRenderer
from trajtune.schema import atomic_write_text
from trajtune.tokens import CLOSED_ROWS, SOURCE_POLICY, TokenTrajectory
from trajtune.envs.base import Environment, Task
from trajtune.rollout import RolloutConfig, _round_seed, run_rollouts


@dataclass
class DatasetSource:
    """SFT experience: a fixed list of TokenTrajectories, reshuffled each epoch from the seed."""

    data: list[TokenTrajectory]
    batch_size: int
    seed: int = 0
    _orders: dict[int, list[int]] = field(default_factory=dict)

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._orders[epoch] = torch.randperm(len(self.data), generator=g).tolist()
        return self._orders[epoch]

    def batch(self, step: int, model: Any) -> tuple[list[TokenTrajectory], dict[str, float]]:
        n = len(self.data)
        if n == 0:
            raise ValueError("the training set is empty")
        out = []
        for k in range(step * self.batch_size, (step + 1) * self.batch_size):
            epoch, pos = divmod(k, n)
            out.append(self.data[self._order(epoch)[pos]])
        return out, {"epoch": (step * self.batch_size) / n}


#: A transform: a pure-ish function on one step's experience, returning what is kept and metrics.
Transform = Callable[[list[TokenTrajectory]], tuple[list[TokenTrajectory], dict[str, float]]]


def pick_tasks(tasks: list[Task], step: int, round_no: int, k: int, seed: int) -> list[Task]:
    """Step ``step``'s ``k`` tasks: the next ``k`` in order (cycling) on the first sampling round; a
    seeded random draw on the extra rounds of dynamic sampling. A function of (seed, step, round), so
    resume is exact."""
    n = len(tasks)
    if round_no == 0:
        return [tasks[(step * k + i) % n] for i in range(k)]
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 7_919 + round_no)
    return [tasks[i] for i in torch.randperm(n, generator=g)[:k].tolist()]


@dataclass
class RolloutSource:
    """Each step: ``tasks_per_step`` training tasks × ``group_size`` samples from the current model,
    then the algorithm's transforms.

    ``per_round`` transforms run on every sampling round (termination policy, reward terms,
    filters); ``per_batch`` ones on the assembled batch (advantages, reference log-probs). With
    ``min_groups`` (DAPO dynamic sampling) rounds continue, on other tasks, until the batch holds
    that many groups that passed ``per_round`` (informative ones, when a filter drops the others),
    at most ``max_rounds`` rounds; the extra rounds are logged (``sampling_rounds``). Task choice is
    a function of (seed, step, round), so resume stays exact."""

    tokenizer: Any
    env_factory: Callable[[], Environment]
    tasks: list[Task]
    rollout: RolloutConfig
    tasks_per_step: int = 8
    group_size: int = 8
    per_round: list[Transform] = field(default_factory=list)
    per_batch: list[Transform] = field(default_factory=list)
    min_groups: int | None = None
    max_rounds: int = 1
    seed: int = 0
    renderer: ChatRenderer | None = None
    on_episodes: Callable[[int, list[Any]], None] | None = None
    sampler: Any = None  # a sampler replacing the local one (a generation server's: remote.ServerSampler)
    #: sets each episode's training reward from named terms (rl.reward: algorithms/rewards.py)
    compose: Callable[[int, list[Any]], dict[str, float]] | None = None
    curriculum: Any = None  # algorithms/curriculum.Curriculum: which tasks are in the pool (rl.curriculum)
    #: sets per-episode values with the current model before the advantages (rl.credit: mc_critic)
    critic: Callable[[int, list[Any], Any], dict[str, float]] | None = None

    def state_dict(self) -> dict[str, Any] | None:
        """The curriculum's level and counts for the checkpoint (None: nothing to save)."""
        return {"curriculum": self.curriculum.state_dict()} if self.curriculum is not None else None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.curriculum is not None and "curriculum" in state:
            self.curriculum.load_state_dict(state["curriculum"])

    def _tasks(self, step: int, round_no: int) -> list[Task]:
        if self.curriculum is not None:
            return self.curriculum.pick(step, round_no, self.tasks_per_step, self.seed)
        return pick_tasks(self.tasks, step, round_no, self.tasks_per_step, self.seed)

    def _round(self, step: int, round_no: int, model: Any) -> tuple[list[TokenTrajectory], list[Any]]:
        tasks = self._tasks(step, round_no)
        seed = self.seed * 1_000_003 + step if round_no == 0 else _round_seed(self.seed, step, round_no)
        # each rank samples groups r, r + W, ... (one process, or sharded weights: all of them); every
        # rank then holds the whole step, in group order
        rank, world = dist.sampling_ranks()
        g = self.group_size
        mine = [t for t in tasks[rank::world] for _ in range(g)]
        remote = {"sampler": self.sampler} if self.sampler is not None else {}  # a server's sampler
        own = run_rollouts(model, self.tokenizer, self.env_factory, mine, self.rollout,
                           seed=seed + 104_729 * rank, renderer=self.renderer, **remote) if mine else []
        parts = dist.all_gather(own) if world > 1 else [own]
        episodes = [e for i in range(len(tasks)) for e in parts[i % world][(i // world) * g:(i // world + 1) * g]]
        tts = []
        for k, e in enumerate(episodes):
            tt = e.tokens
            tt.group = f"{step}:{k // self.group_size}" if round_no == 0 else f"{step}.{round_no}:{k // self.group_size}"
            if e.rows:  # contexts that left the active one: they join the batch after the advantages
                tt.meta[CLOSED_ROWS] = e.rows
            tts.append(tt)
        return tts, episodes

    def batch(self, step: int, model: Any) -> tuple[list[TokenTrajectory], dict[str, float]]:
        kept, metrics, episodes = self.sample(step, model, step)
        if self.on_episodes:
            self.on_episodes(step, episodes)
        return kept, metrics

    def sample(self, step: int, model: Any, version: int) -> tuple[list[TokenTrajectory], dict[str, float], list[Any]]:
        """Step ``step``'s experience from ``model``, the policy after ``version`` optimizer steps
        (recorded on every episode as ``policy_version``), and the episodes themselves."""
        if not self.tasks:
            raise ValueError("no training tasks for RL")
        kept: list[TokenTrajectory] = []
        all_eps: list[Any] = []
        metrics: dict[str, float] = {}
        rounds = 0
        target = self.min_groups
        while True:
            tts, episodes = self._round(step, rounds, model)
            for e in episodes:
                e.trajectory.metadata["policy_version"] = version
            if self.compose is not None:
                shaped = self.compose(step, episodes)
                if rounds == 0:
                    metrics.update(shaped)
            rounds += 1
            all_eps += episodes
            if rounds == 1:  # the batch's behaviour metrics: the first round, as without dynamic sampling
                finite = [float(t.reward or 0.0) for t in tts if math.isfinite(float(t.reward or 0.0))]
                metrics.update({
                    "reward": sum(finite) / max(1, len(finite)),
                    "success": sum(1.0 for e in episodes if e.trajectory.outcome and e.trajectory.outcome.success)
                    / len(tts),
                    "format_errors": sum(e.format_errors for e in episodes) / len(tts),
                    "mean_len": sum(len(t) for t in tts) / len(tts),
                })
            for tr in self.per_round:
                tts, m = tr(tts)
                for k, v in m.items():
                    metrics[k] = metrics.get(k, 0.0) + v
            kept += tts
            n_groups = len({t.group for t in kept})
            if target is None or n_groups >= target or rounds >= self.max_rounds:
                break
        if self.curriculum is not None:
            metrics.update(self.curriculum.observe(all_eps))
        if target is not None:
            metrics["sampling_rounds"] = float(rounds)
            groups = list(dict.fromkeys(t.group for t in kept))[:target]  # the first `target` groups
            kept = [t for t in kept if t.group in set(groups)]
            metrics["kept_groups"] = float(len(groups))
        if self.critic is not None:
            live = {id(t) for t in kept}
            metrics.update(self.critic(step, [e for e in all_eps if id(e.tokens) in live], model))
        for tr in self.per_batch:
            kept, m = tr(kept)
            metrics.update(m)
        trained = {id(t) for t in kept}
        for e in all_eps:  # what each episode was trained with (the report and rollouts.jsonl show it)
            t = e.tokens
            if id(t) in trained and t.advantages is not None:
                e.trajectory.metadata["advantage"] = round(next(
                    (a for a, w, s in zip(t.advantages, t.weight, t.source) if s == SOURCE_POLICY and w), 0.0), 6)
                for key in ("turn_advantages", "anchor_group_sizes"):  # per-turn credit, GiGPO's step groups
                    if key in t.meta:
                        e.trajectory.metadata[key] = t.meta[key]
            elif id(t) not in trained:
                e.trajectory.metadata["trained"] = False
        if metrics.get("nonfinite_rewards"):
            warnings.warn(f"step {step + 1}: {metrics['nonfinite_rewards']:.0f} episode(s) with a non-finite reward "
                          "(inf/NaN) were masked as env_error; check the environment's reward (metrics.jsonl: "
                          "nonfinite_rewards)", RuntimeWarning, stacklevel=2)
        return kept, metrics, all_eps


class OneStepAhead:
    """Asynchronous rollouts with a staleness of one step (``rl.async_rollouts``).

    While the learner trains step k, a background thread samples step k+1's experience from a
    copy of the policy as it was before step k's update; step 0 is sampled in the foreground. So
    step k ≥ 1 trains on episodes of policy version k−1 and the clipped objective's ratio is taken
    against their stored sampling log-probs (the importance ratio to the sampling policy).

    Exactness: what step k+1 gets is a function of (seed, step, policy version k), never of thread
    timing; a checkpoint after step k waits for step k+1's experience and stores it, so a resumed
    run trains on exactly what the uninterrupted one did. Episodes are handed to ``on_episodes`` when
    their step consumes them, so logs of steps a killed run never trained are not written."""

    def __init__(self, inner: RolloutSource, steps: int):
        self.inner, self.steps = inner, steps
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="trajtune-rollouts")
        self.pending: tuple[int, Future[Any]] | None = None
        self.ready: dict[int, tuple[list[TokenTrajectory], dict[str, float], list[Any]]] = {}
        self.shadow: Any = None

    def _take(self, step: int) -> tuple[list[TokenTrajectory], dict[str, float], list[Any]] | None:
        if self.pending is not None:
            at, fut = self.pending
            self.pending = None
            got = fut.result()  # a rollout failure (a lost worker, an env bug) surfaces here
            if at == step:
                return got
        return self.ready.pop(step, None)

    def batch(self, step: int, model: Any) -> tuple[list[TokenTrajectory], dict[str, float]]:
        got = self._take(step)
        version = step - 1 if got is not None else step
        if got is None:  # step 0, or a resumed run whose checkpoint holds no prepared step
            got = self.inner.sample(step, model, step)
        if step + 1 < self.steps:
            if self.shadow is None:
                self.shadow = copy.deepcopy(model)
            else:
                self.shadow.load_state_dict(model.state_dict())
            self.pending = (step + 1, self.pool.submit(self.inner.sample, step + 1, self.shadow, step))
        kept, metrics, episodes = got
        if self.inner.on_episodes:
            self.inner.on_episodes(step, episodes)
        return kept, {**metrics, "policy_lag": float(step - version)}

    def state_dict(self) -> dict[str, Any]:
        """The experience prepared for the next step (waits for it), for the checkpoint."""
        if self.pending is not None:
            at, fut = self.pending
            self.pending = None
            self.ready[at] = fut.result()
        return {"ready": dict(self.ready)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ready = dict(state["ready"])

    def close(self) -> None:
        if self.pending is not None:
            self.pending[1].cancel()
            try:
                self.pending[1].result()
            except BaseException:  # noqa: BLE001 - the run is over (or already failing); nothing to hand on
                pass
            self.pending = None
        self.pool.shutdown(wait=True)


#: Mines one iteration's training data with the current model: (iteration, model) ->
#: (IR records to persist, metrics). ``render`` turns persisted records into trainable rows.
MineFn = Callable[[int, Any], tuple[list[Any], dict[str, float]]]


@dataclass
class IterativeSource:
    """Experience that is re-mined from the policy every ``steps_per_iteration`` steps (RFT's kept
    successes, DPO's mined pairs), then served like a dataset.

    Each iteration's mined records are written to ``cache_dir/iter-NNN.jsonl`` (atomically) before
    any step trains on them; a resumed run reads them back instead of mining again, so resume is
    exact wherever the checkpoint lies, and a finished iteration is never redone. Rows of one unit
    (a pair) stay adjacent in every batch."""

    mine: MineFn | None  # None: only the fixed units (a dataset of units, e.g. pairs from a file)
    render: Callable[[list[Any]], list[list[TokenTrajectory]]]  # records -> units of rows
    load: Callable[[str], Any]  # one JSONL line -> record
    dump: Callable[[Any], str]  # record -> one JSONL line
    steps_per_iteration: int
    batch_size: int  # units per step
    cache_dir: Any
    fixed: list[list[TokenTrajectory]] = field(default_factory=list)  # units served every iteration (experts)
    keep_previous: bool = True  # serve earlier iterations' records too
    seed: int = 0
    on_mined: Callable[[int, dict[str, float]], None] | None = None
    _units: dict[int, list[list[TokenTrajectory]]] = field(default_factory=dict)
    _mined_metrics: dict[int, dict[str, float]] = field(default_factory=dict)

    def _path(self, it: int) -> Any:
        from pathlib import Path

        return Path(self.cache_dir) / f"iter-{it:03d}.jsonl"

    def _records(self, it: int, step: int, model: Any) -> list[list[TokenTrajectory]]:
        if it in self._units:
            return self._units[it]
        import json
        from pathlib import Path

        path = self._path(it)
        # rank 0 mines and writes; the others read its file (with sharded weights they mine too, in
        # step with rank 0, since its forward passes need them; rank 0 still writes alone). Rank 0's
        # view of the file decides for every rank: a rank that looked later could find the file
        # already written, skip the barrier rank 0 waits at, and the next collectives would pair up
        # wrongly (a hang)
        existed = dist.all_gather(path.exists())[0]
        if existed or not (dist.is_main() or dist.sharded()):
            if not existed:
                dist.barrier()  # rank 0 is mining: its barrier comes once the files are written
            records = [self.load(ln) for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
            meta = Path(str(path) + ".json")
            self._mined_metrics[it] = json.loads(meta.read_text()) if meta.exists() else {}
        else:
            if step != it * self.steps_per_iteration:  # mining needs the policy as it was at the iteration start
                raise RuntimeError(f"iteration {it} has no mined data ({path}) but the run is at step {step}, "
                                   "inside the iteration; the run directory is incomplete")
            assert self.mine is not None
            records, metrics = self.mine(it, model)
            if dist.is_main():
                Path(self.cache_dir).mkdir(parents=True, exist_ok=True)
                atomic_write_text(path, "".join(self.dump(r) + "\n" for r in records))
                atomic_write_text(Path(str(path) + ".json"), json.dumps(metrics))
                if self.on_mined:
                    self.on_mined(it, metrics)
            self._mined_metrics[it] = metrics
            dist.barrier()
        self._units[it] = self.render(records)
        return self._units[it]

    def batch(self, step: int, model: Any) -> tuple[list[TokenTrajectory], dict[str, float]]:
        it, pos = divmod(step, self.steps_per_iteration)
        units = list(self.fixed)
        for j in range(0 if self.keep_previous else it, it + 1) if self.mine is not None else ():
            units += self._records(j, step if j == it else j * self.steps_per_iteration, model)
        if not units:
            raise RuntimeError("nothing to train on")  # the algorithm's mine() refuses an empty iteration first
        # one permutation per (iteration, epoch over the iteration's units)
        start = pos * self.batch_size
        out: list[TokenTrajectory] = []
        orders: dict[int, list[int]] = {}
        for k in range(start, start + self.batch_size):
            epoch, idx = divmod(k, len(units))
            if epoch not in orders:
                g = torch.Generator().manual_seed(self.seed * 1_000_003 + it * 10_007 + epoch)
                orders[epoch] = torch.randperm(len(units), generator=g).tolist()
            out.extend(units[orders[epoch][idx]])
        metrics: dict[str, float] = {"iteration": float(it), "train_units": float(len(units))}
        if pos == 0:
            metrics.update({f"mined/{k}": v for k, v in self._mined_metrics.get(it, {}).items()})
        return out, metrics
