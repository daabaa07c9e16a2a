"""The ``dpo`` algorithm: preference optimisation on agent trajectories (docs/algorithms.md).

Pieces, each small: the loss (sigmoid with β, or IPO), the objective over adjacent
(chosen, rejected) rows, preference pairs read from a file (validated with rule ids P301–P304) or
mined from the policy's own rollouts (success ≻ failure within one task, or sibling actions from
one state ranked by Monte-Carlo value), and the recipe that
plugs them into the one learner. Only trained policy tokens of the compared actions contribute,
through the same mask (source == policy, weight > 0) as every other objective.
"""

from __future__ import annotations

import functools
import json
import random
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from pydantic import Field, ValidationError, model_validator

from trajtune import rollout as agent_loop  # by module: tests replace agent_loop.run_rollouts
from trajtune.algorithms.base import Metrics
from trajtune.algorithms.batch import Batch, token_logprobs
from trajtune.algorithms.episode_transforms import add_ref_logprobs
from trajtune.algorithms.registry import Algorithm, Recipe, RunContext, register_algorithm
from trajtune.algorithms.actions import action_key
from trajtune.config import EnvSpec, RolloutSpec, RunBase, _C
from trajtune.envs.registry import make_env
from trajtune.errors import ConfigError, DataError, require_input
from trajtune.experience import IterativeSource
from trajtune.schema import PreferencePair, RecordError, Trajectory, iter_jsonl
from trajtune.tokens import TokenTrajectory
from trajtune.validate import record_check

LossType = Literal["sigmoid", "ipo"]


def dpo_loss(delta_chosen: torch.Tensor, delta_rejected: torch.Tensor, beta: float,
             loss_type: LossType = "sigmoid") -> torch.Tensor:
    """Per-pair loss. Δ = log π_θ − log π_ref summed over the action's policy tokens.

    sigmoid: −log σ(β(Δw − Δl)); IPO: (Δw − Δl − 1/(2β))². β = 0.1, Δw = 1, Δl = −1 gives 0.5981."""
    h = delta_chosen - delta_rejected
    if loss_type == "ipo":
        return (h - 1.0 / (2.0 * beta)) ** 2
    return -torch.nn.functional.logsigmoid(beta * h)


@dataclass
class DPOObjective:
    """Rows come in adjacent pairs: chosen at an even row, its rejected right after (one unit, so
    micro-batches never split it). The reference is a frozen model's log-probs (``model``) or the
    stored sampling log-probs of rollouts (``sampling``)."""

    beta: float = 0.1
    loss_type: LossType = "sigmoid"
    reference: Literal["model", "sampling"] = "model"
    name: str = "dpo"
    coupled_rows: bool = True

    def denominator(self, batch: Batch) -> float:
        return float(batch.size // 2)

    def loss_sum(self, model: Any, batch: Batch) -> tuple[torch.Tensor, Metrics]:
        if batch.size % 2:
            raise ValueError(f"a DPO batch holds (chosen, rejected) pairs; got {batch.size} rows")
        logp, _ = token_logprobs(model, batch)
        if self.reference == "model":
            if batch.ref_logprobs is None:
                raise ValueError("dpo.reference: model needs reference log-probs on every row")
            ref = batch.ref_logprobs[:, 1:]
        else:
            ref = batch.old_logprobs[:, 1:]
        mask = batch.loss_mask()
        n_tok = mask.sum(1)
        if bool((n_tok == 0).any()):
            raise ValueError("a DPO row has no trained policy token; pairs are checked when built, so this is a bug")
        delta = ((logp - ref) * mask).sum(1)
        dw, dl = delta[0::2], delta[1::2]
        losses = dpo_loss(dw, dl, self.beta, self.loss_type)
        n = float(losses.numel())
        with torch.no_grad():
            rw, rl = self.beta * dw.detach(), self.beta * dl.detach()
        return losses.sum(), {
            "dpo_loss": (float(losses.detach().sum()), n),
            "reward_accuracy": (float((rw > rl).float().sum()), n),
            "margin": (float((rw - rl).sum()), n),
            "chosen_reward": (float(rw.sum()), n),
            "rejected_reward": (float(rl.sum()), n),
            "tokens": float(n_tok.sum()),
        }


# -- pairs as data -------------------------------------------------------------------------------

PAIR_RULES = {
    "P301": ("pair-side-missing", "a pair needs a non-empty chosen and rejected trajectory",
             "give both `chosen` and `rejected`, each with its messages"),
    "P302": ("pair-task-mismatch", "the two sides are not attempts at the same task",
             "pair attempts of one task only: same task_id, same first user message and tools"),
    "P303": ("pair-empty-span", "a side has no policy tokens to compare",
             "each side needs an assistant action (for level: step, right after prefix_messages)"),
    "P304": ("pair-prefix-mismatch", "the sides of a step-level pair differ before the compared action",
             "both sides must share their first prefix_messages messages exactly"),
}


def _pair_error(path: str, line: int | None, rule: str, message: str, pair_id: str | None) -> RecordError:
    name, _, hint = PAIR_RULES[rule]
    return RecordError(path, line, f"{name}: {message}", rule=rule, record_id=pair_id, hint=hint)


def _first_user(t: Trajectory) -> str | None:
    return next((m.text() for m in t.messages if m.role == "user"), None)


def check_pair(pair: PreferencePair, path: str = "<pairs>", line: int | None = None) -> None:
    """Raise a RecordError (file:line, pair id, rule P30x) for a pair that cannot train correctly; the
    sides also go through the trajectory validation rules (E…)."""
    for side in ("chosen", "rejected"):
        t: Trajectory = getattr(pair, side)
        if not t.messages:
            raise _pair_error(path, line, "P301", f"{side} has no messages", pair.id)
        err = record_check(path, sft=False)(t, line or 0)
        if err is not None:
            raise RecordError(path, line, f"{side}: {err.message}", rule=err.rule, record_id=pair.id, hint=err.hint)
    c, r = pair.chosen, pair.rejected
    if _first_user(c) != _first_user(r) or [x.name for x in c.tools] != [x.name for x in r.tools]:
        raise _pair_error(path, line, "P302", f"task {pair.task_id!r}: the first user message or the tools differ",
                          pair.id)
    for side in ("chosen", "rejected"):
        tid = getattr(pair, side).metadata.get("task_id")
        if tid is not None and tid != pair.task_id:
            raise _pair_error(path, line, "P302", f"{side} is an attempt at task {tid!r}, the pair's is "
                                                  f"{pair.task_id!r}", pair.id)
    if pair.level == "step":
        k = pair.prefix_messages
        if k is None:
            raise _pair_error(path, line, "P303", "level: step needs prefix_messages", pair.id)
        if c.model_dump(include={"messages"})["messages"][:k] != r.model_dump(include={"messages"})["messages"][:k]:
            raise _pair_error(path, line, "P304", f"the first {k} messages differ", pair.id)
        for side in ("chosen", "rejected"):
            msgs = getattr(pair, side).messages
            if len(msgs) <= k or msgs[k].role != "assistant":
                raise _pair_error(path, line, "P303", f"{side}: message {k} (after the prefix) is not an assistant "
                                                      "action", pair.id)
    else:
        for side in ("chosen", "rejected"):
            if not any(m.role == "assistant" for m in getattr(pair, side).messages):
                raise _pair_error(path, line, "P303", f"{side} has no assistant turn", pair.id)


def read_pairs(path: str) -> list[PreferencePair]:
    """A pair file (JSONL, gzip read directly), every pair checked; the first bad one is an error."""
    pairs = []
    for line, obj in iter_jsonl(path):
        pid = obj.get("id") if isinstance(obj, dict) and isinstance(obj.get("id"), str) else None
        if isinstance(obj, dict):
            for side in ("chosen", "rejected"):
                if not obj.get(side):
                    raise _pair_error(path, line, "P301", f"{side} is missing or empty", pid)
        try:
            pair = PreferencePair.model_validate(obj)
        except ValidationError as e:
            first = e.errors()[0]
            raise RecordError(path, line, f"{'.'.join(map(str, first['loc']))}: {first['msg']}", rule="schema",
                              record_id=pid, hint="see docs/formats.md, Preference pairs") from None
        check_pair(pair, path, line)
        pairs.append(pair)
    if not pairs:
        raise DataError(f"{path}: no preference pairs")
    return pairs


def _with_trained(t: Trajectory, level: str, prefix: int | None) -> Trajectory:
    """A copy whose `train` flags select the compared action: every assistant turn (trajectory
    level) or only the one right after the prefix (step level)."""
    msgs = []
    for i, m in enumerate(t.messages):
        if m.role == "assistant":
            m = m.model_copy(update={"train": True if level == "trajectory" else i == prefix})
        msgs.append(m)
    return t.model_copy(update={"messages": msgs})


def render_pair(renderer: Any, pair: PreferencePair, path: str = "<pairs>") -> list[TokenTrajectory]:
    """[chosen, rejected] rows of one unit (group = pair id). The renderer must train on the per-message
    hints (``train_on: hint``). A side without trained tokens after rendering is a P303 error."""
    rows = []
    for role in ("chosen", "rejected"):
        t = _with_trained(getattr(pair, role), pair.level, pair.prefix_messages)
        tt = renderer.render(t)
        if not any(w > 0 for w, s in zip(tt.weight, tt.source) if s == 1):
            raise _pair_error(path, None, "P303", f"{role} renders to no trained policy token", pair.id)
        tt.group, tt.traj_id = f"pair:{pair.id}", pair.id
        tt.meta["pair_role"] = role
        rows.append(tt)
    return rows


# -- mining from rollouts --------------------------------------------------------------------------

@dataclass
class MinedPair:
    pair: PreferencePair
    rows: list[TokenTrajectory] = field(default_factory=list)  # [chosen, rejected] as sampled (with log-probs)


def _termination(e: Any) -> str | None:
    if getattr(e, "tokens", None) is not None and e.tokens.termination:
        return e.tokens.termination
    return e.trajectory.outcome.termination if e.trajectory.outcome is not None else None


def _task_key(e: Any) -> str:
    task = getattr(e, "task", None)
    return task.id if task is not None else e.trajectory.id


def mine_trajectory_pairs(episodes: list[Any], max_pairs_per_task: int, seed: int,
                          id_prefix: str = "") -> tuple[list[MinedPair], dict[str, int]]:
    """Success ≻ failure, only among episodes of one task (``episode.task.id``): never across tasks,
    even when their prompts coincide. Which successes and failures are paired is drawn from
    ``seed``; at most ``max_pairs_per_task`` pairs per task, no episode used twice."""
    by_task: dict[str, list[Any]] = defaultdict(list)
    for e in episodes:
        by_task[_task_key(e)].append(e)
    rng = random.Random(seed)
    out: list[MinedPair] = []
    counts = {"tasks": len(by_task), "tasks_mixed": 0, "tasks_all_success": 0, "tasks_all_fail": 0,
              "tasks_env_failures": 0, "pairs": 0}
    for task_id in sorted(by_task):
        eps = by_task[task_id]
        wins = [e for e in eps if e.trajectory.outcome is not None and e.trajectory.outcome.success]
        # a failure the environment caused (error, timeout) says nothing about the policy: never a rejected side
        losses = [e for e in eps if not (e.trajectory.outcome is not None and e.trajectory.outcome.success)
                  and _termination(e) not in ("env_error", "timeout")]
        if not wins:
            counts["tasks_all_fail"] += 1
            continue
        if not losses:
            counts["tasks_all_success" if len(wins) == len(eps) else "tasks_env_failures"] += 1
            continue
        counts["tasks_mixed"] += 1
        rng.shuffle(wins)
        rng.shuffle(losses)
        for k, (w, lo) in enumerate(zip(wins, losses)):
            if k >= max_pairs_per_task:
                break
            pid = f"{id_prefix}{task_id}#{k}"
            pair = PreferencePair(id=pid, task_id=task_id, level="trajectory", chosen=w.trajectory,
                                  rejected=lo.trajectory,
                                  chosen_value=float(w.trajectory.reward or 0.0),
                                  rejected_value=float(lo.trajectory.reward or 0.0))
            out.append(MinedPair(pair, _pair_rows(pid, w, lo)))
    counts["pairs"] = len(out)
    return out, counts


def _pair_rows(pid: str, chosen: Any, rejected: Any, first_turn_only: bool = False) -> list[TokenTrajectory]:
    """The sampled rows of a pair (ids, sources, log-probs as generated), or none for episodes read
    back from a file. ``first_turn_only``: only the first policy action is trained (step level)."""
    rows = []
    for role, e in (("chosen", chosen), ("rejected", rejected)):
        tt = e.tokens
        if tt is None:
            return []
        if getattr(e, "rows", None):
            raise ValueError("DPO pairs one row per episode, and this episode trains as several (its contexts were "
                             "folded by the fold environment wrapper, or masked by rollout.mask_observations_at); "
                             "use RL or RFT with such episodes")
        weight = [w if not first_turn_only or (s == 1 and t == 0) else 0.0
                  for w, s, t in zip(tt.weight, tt.source, tt.turn)]
        rows.append(TokenTrajectory(ids=list(tt.ids), source=list(tt.source), turn=list(tt.turn), weight=weight,
                                    logprobs=list(tt.logprobs) if tt.logprobs else None, traj_id=pid,
                                    group=f"pair:{pid}", reward=tt.reward, success=tt.success,
                                    termination=tt.termination, meta={**tt.meta, "pair_role": role}))
    return rows


def rank_siblings(values: list[float], theta: float) -> list[tuple[int, int]]:
    """Step-level pairs among sibling actions from one state: (best, worst) by Monte-Carlo value,
    kept when the gap is at least θ. One pair per state (the most informative one)."""
    if len(values) < 2:
        return []
    best = max(range(len(values)), key=lambda i: (values[i], -i))
    worst = min(range(len(values)), key=lambda i: (values[i], i))
    return [(best, worst)] if values[best] - values[worst] >= theta else []


def _nth_assistant(t: Trajectory, n: int) -> int | None:
    """Index in ``t.messages`` of its ``n``-th assistant message (0-based), or None."""
    seen = -1
    for i, m in enumerate(t.messages):
        if m.role == "assistant":
            seen += 1
            if seen == n:
                return i
    return None


def state_prefixes(episode: Any, n_states: int) -> list[list[Any]]:
    """Up to ``n_states`` − 1 states along ``episode`` past its start: the conversation before its
    2nd, 3rd, … action (each prefix ends with the observations of the action before it)."""
    out = []
    for j in range(1, n_states):
        i = _nth_assistant(episode.trajectory, j)
        if i is None:
            break
        out.append(list(episode.trajectory.messages[:i]))
    return out


def pick_spine(episodes: list[Any]) -> Any | None:
    """The episode whose states get explored: a failure the policy caused if there is one (that is
    where a better action exists), else any attempt; it needs at least two actions."""
    long = [e for e in episodes if e.turns >= 2 and _termination(e) not in ("env_error", "timeout")]
    fails = [e for e in long if not (e.trajectory.outcome is not None and e.trajectory.outcome.success)]
    return (fails or long or [None])[0]


def mine_step_pairs(states: list[tuple[str, int, list[Any]]], theta: float,
                    id_prefix: str = "") -> tuple[list[MinedPair], dict[str, int]]:
    """Step-level pairs. Each state is (task id, actions already in its prefix, the episodes rolled
    out from it). The episodes' first actions are the siblings; a sibling's Monte-Carlo value is
    the mean return of the episodes that began with it (env errors and timeouts left out). The
    best and worst siblings make a pair when their values differ by at least θ
    (``rank_siblings``); only that first action is trained, the rest of each side is context."""
    out: list[MinedPair] = []
    counts = {"states": len(states), "states_one_action": 0, "states_below_gap": 0, "pairs": 0}
    for s_no, (task_id, n_prefix, eps) in enumerate(states):
        eps = [e for e in eps if _termination(e) not in ("env_error", "timeout")]
        sibs: dict[str, list[Any]] = {}
        for e in eps:
            i = _nth_assistant(e.trajectory, n_prefix)
            if i is None:
                continue
            sibs.setdefault(action_key(e.trajectory.messages[i]), []).append(e)
        groups = list(sibs.values())  # insertion order = episode order: deterministic
        if len(groups) < 2:
            counts["states_one_action"] += 1
            continue
        values = [sum(float(e.trajectory.reward or 0.0) for e in g) / len(g) for g in groups]
        ranked = rank_siblings(values, theta)
        if not ranked:
            counts["states_below_gap"] += 1
            continue
        best, worst = ranked[0]
        w, lo = groups[best][0], groups[worst][0]
        pid = f"{id_prefix}{task_id}@{n_prefix}#{s_no}"
        pair = PreferencePair(id=pid, task_id=task_id, level="step", chosen=w.trajectory, rejected=lo.trajectory,
                              prefix_messages=_nth_assistant(w.trajectory, n_prefix),
                              chosen_value=values[best], rejected_value=values[worst])
        out.append(MinedPair(pair, _pair_rows(pid, w, lo, first_turn_only=True)))
    counts["pairs"] = len(out)
    return out, counts


def pairs_to_jsonl(pairs: list[PreferencePair]) -> str:
    return "".join(p.model_dump_json(exclude_none=True) + "\n" for p in pairs)


# -- the `dpo` algorithm: config and recipe --------------------------------------------------------

class DPOSpec(_C):
    beta: float = Field(0.1, gt=0, description="β: strength of the implicit KL to the reference")
    loss: LossType = Field("sigmoid", description="sigmoid: −log σ(β(Δw − Δl)); ipo: (Δw − Δl − 1/(2β))²")
    reference: Literal["model", "sampling"] = Field(
        "model", description="model: a frozen copy of the starting policy; sampling: the stored log-probs of "
                             "the rollouts the pairs were mined from (no second model in memory)")
    pairs: str | None = Field(None, description="a preference-pair JSONL file (docs/formats.md); else pairs are "
                                                "mined from the policy's rollouts in env")
    iterations: int = Field(1, gt=0, description="mined pairs: mine → train rounds (train.steps split evenly)")
    n_tasks: int = Field(64, gt=0, description="mined pairs: training tasks attempted per iteration")
    k: int = Field(4, gt=1, description="mined pairs: attempts per task")
    max_pairs_per_task: int = Field(2, gt=0, description="mined pairs: at most this many per task and iteration "
                                                         "(trajectory level)")
    level: Literal["trajectory", "step"] = Field(
        "trajectory", description="mined pairs: trajectory (a success ≻ a failure of one task) or step (sibling "
                                  "actions from one state, ranked by Monte-Carlo value; k rollouts per state)")
    value_gap: float = Field(0.5, ge=0, description="step level: θ, the least value gap between the siblings of a "
                                                    "pair")
    states_per_task: int = Field(2, gt=0, description="step level: states explored per task: the start and the "
                                                      "states along one attempt, before its 2nd, 3rd, … action")


class DPORunConfig(RunBase):
    """``algorithm: dpo``: preference optimisation; ``train.batch_size`` counts pairs."""

    algorithm: Literal["dpo"] = Field("dpo", description="preference optimisation on trajectory or step pairs")
    env: EnvSpec | None = Field(None, description="environment to mine pairs in (when dpo.pairs is not given)")
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, description="how episodes are sampled when pairs "
                                                                          "are mined")
    dpo: DPOSpec = Field(default_factory=DPOSpec, description="loss, reference and where pairs come from")

    @model_validator(mode="after")
    def _source(self) -> "DPORunConfig":
        d, s = self.dpo, self.dpo.non_default()
        if (d.pairs is None) == (self.env is None):
            raise ValueError("give exactly one source of pairs: dpo.pairs (a file) or env (mine from rollouts)")
        if d.pairs is not None:
            mining = {"iterations", "n_tasks", "k", "max_pairs_per_task", "level", "value_gap", "states_per_task"} & s
            if mining:
                raise ValueError(f"dpo.{sorted(mining)[0]} only applies to pairs mined from rollouts (env), not to "
                                 "dpo.pairs")
            if d.reference == "sampling":
                raise ValueError("dpo.reference: sampling needs the sampling log-probs of mined pairs; a pair file "
                                 "has none (use reference: model)")
            if self.rollout.vllm is not None:
                raise ValueError("rollout.vllm does nothing with dpo.pairs (no rollouts are sampled); remove it")
        step_only = {"value_gap", "states_per_task"} & s
        if d.level == "trajectory" and step_only:
            raise ValueError(f"dpo.{sorted(step_only)[0]} only applies to dpo.level: step")
        if d.level == "step" and "max_pairs_per_task" in s:
            raise ValueError("dpo.max_pairs_per_task only applies to dpo.level: trajectory (step level makes at "
                             "most one pair per state; use dpo.states_per_task)")
        if self.train.steps % d.iterations:
            raise ValueError(f"train.steps ({self.train.steps}) must be a multiple of dpo.iterations ({d.iterations})")
        return self


def _records(mined: list[MinedPair]) -> list[dict[str, Any]]:
    """Persisted per iteration: the IR pair plus the sampled rows (ids, sources, weights, log-probs),
    so a resumed run trains on exactly these tokens without re-rendering."""
    return [{"pair": m.pair.model_dump(mode="json", exclude_none=True),
             "rows": [{"ids": r.ids, "source": r.source, "turn": r.turn, "weight": r.weight,
                       "logprobs": r.logprobs, "reward": r.reward, "success": r.success,
                       "termination": r.termination} for r in m.rows]} for m in mined]


def _prepare(cfg: DPORunConfig, ctx: RunContext) -> list[list[TokenTrajectory]] | None:
    if cfg.dpo.pairs is None:
        assert cfg.env is not None
        env = make_env(cfg.env.name, **cfg.env.kwargs)
        if cfg.dpo.level == "step" and not env.deterministic:
            raise ConfigError(f"dpo.level: step replays actions to reach states, and environment {cfg.env.name!r} "
                              "is not deterministic (docs/envs.md, Reaching a state); use dpo.level: trajectory")
        return None
    require_input(cfg.dpo.pairs, "dpo.pairs")
    units = [render_pair(ctx.renderer, p, cfg.dpo.pairs) for p in read_pairs(cfg.dpo.pairs)]
    too_long = [u for u in units if max(len(t) for t in u) > cfg.rollout.max_length]
    units = [u for u in units if u not in too_long]
    if not units:
        raise DataError(f"{cfg.dpo.pairs}: all {len(too_long)} pairs are longer than rollout.max_length "
                        f"({cfg.rollout.max_length})")
    return units


def _build(cfg: DPORunConfig, ctx: RunContext, prepared: list[list[TokenTrajectory]] | None) -> Recipe:
    assert ctx.out is not None
    d = cfg.dpo
    tok = ctx.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    ref = ctx.load_reference() if d.reference == "model" and ctx.load_reference else None
    with_reference = functools.partial(_with_reference, ref, pad)
    objective = DPOObjective(d.beta, d.loss, d.reference)
    shown = ("loss", "reward_accuracy")
    plot = ("loss.png", ("loss", "reward_accuracy", "margin"), "DPO")

    if prepared is not None:  # pairs from a file: a dataset of units
        units = with_reference(prepared)
        source = IterativeSource(mine=None, render=lambda recs: [], load=json.loads, dump=json.dumps,
                                 steps_per_iteration=cfg.train.steps, batch_size=cfg.train.batch_size,
                                 cache_dir=ctx.out / "dpo", fixed=units, seed=cfg.seed)
        return Recipe(source=source, objective=objective, micro_batch_size=2 * cfg.train.micro_batch_size,
                      result={"pairs": len(units)}, shown=shown, plot=plot)

    miner = _PairMiner(cfg, ctx)
    source = IterativeSource(mine=miner.mine, render=lambda records: with_reference(_render_records(records)),
                             load=json.loads, dump=lambda r: json.dumps(r),
                             steps_per_iteration=cfg.train.steps // d.iterations, batch_size=cfg.train.batch_size,
                             cache_dir=ctx.out / "dpo", keep_previous=False, seed=cfg.seed)
    return Recipe(source=source, objective=objective, micro_batch_size=2 * cfg.train.micro_batch_size,
                  shown=shown, plot=plot)


def _with_reference(ref: Any, pad: int, units: list[list[TokenTrajectory]]) -> list[list[TokenTrajectory]]:
    """With ``dpo.reference: model``, each row gets the reference model's log-probs once, when it is
    rendered, so the loss never runs the reference model."""
    if ref is not None:
        add_ref_logprobs(ref, [t for u in units for t in u], pad)
    return units


def _render_records(records: list[Any]) -> list[list[TokenTrajectory]]:
    """Persisted pairs back to (chosen, rejected) rows, the tokens exactly as they were sampled."""
    units = []
    for rec in records:
        pid = rec["pair"]["id"]
        units.append([TokenTrajectory(**row, traj_id=pid, group=f"pair:{pid}", meta={"pair_role": role})
                      for role, row in zip(("chosen", "rejected"), rec["rows"])])
    return units


class _PairMiner:
    """Mines each iteration's pairs from the current policy's rollouts on the training tasks: whole
    trajectories (a success against a failure of one task) or, at ``dpo.level: step``, actions from
    the same state whose values differ."""

    def __init__(self, cfg: DPORunConfig, ctx: RunContext):
        assert cfg.env is not None
        self.cfg, self.d, self.ctx, self.tok = cfg, cfg.dpo, ctx, ctx.tokenizer
        self.tasks = make_env(cfg.env.name, **cfg.env.kwargs).tasks("train", cfg.dpo.n_tasks, seed=cfg.seed)
        self.ro = cfg.rollout.to_config()
        self.factory = cfg.rollout.env_factory(cfg.env)

    def mine(self, it: int, model: Any) -> tuple[list[Any], dict[str, float]]:
        d = self.d
        expanded = [t for t in self.tasks for _ in range(d.k)]
        episodes = agent_loop.run_rollouts(model, self.tok, self.factory, expanded, self.ro,
                                           seed=self.cfg.seed * 1_000_003 + 5_555 + it, renderer=self.ctx.renderer)
        if d.level == "step":
            mined, counts = self._mine_steps(it, model, episodes)
            if not mined:
                raise DataError(
                    f"dpo iteration {it + 1}: no step-level pair to train on: of {counts['states']} states × {d.k} "
                    f"rollouts, {counts['states_one_action']} had only one distinct first action and "
                    f"{counts['states_below_gap']} had no two actions whose values differ by dpo.value_gap "
                    f"({d.value_gap}); use more rollouts per state (dpo.k), a higher rollout.temperature or a "
                    "smaller dpo.value_gap")
            return _records(mined), {k: float(v) for k, v in counts.items()}
        mined, counts = mine_trajectory_pairs(episodes, d.max_pairs_per_task, self.cfg.seed + it,
                                              id_prefix=f"it{it}:")
        if not mined:
            raise DataError(f"dpo iteration {it + 1}: no pair to train on: of {counts['tasks']} tasks × {d.k} "
                            f"attempts, {counts['tasks_all_success']} succeeded every time and "
                            f"{counts['tasks_all_fail']} failed every time (a pair needs a success and a failure of "
                            "one task); use a policy that sometimes succeeds, more attempts (dpo.k) or a higher "
                            "rollout.temperature")
        return _records(mined), {k: float(v) for k, v in counts.items()}

    def _mine_steps(self, it: int, model: Any, root: list[Any]) -> tuple[list[MinedPair], dict[str, int]]:
        """States are each task's start plus prefixes of one spine episode (``pick_spine``); from each
        state ``dpo.k`` continuations are rolled out, and their first actions are compared."""
        d = self.d
        by_task: dict[str, list[Any]] = defaultdict(list)
        for e in root:
            by_task[_task_key(e)].append(e)
        states = [(t.id, 0, by_task[t.id]) for t in self.tasks]
        starts: list[tuple[Any, list[Any]]] = []
        for t in self.tasks:
            spine = pick_spine(by_task[t.id])
            if spine is not None:
                starts += [(t, p) for p in state_prefixes(spine, d.states_per_task)]
        if starts:
            eps = agent_loop.run_rollouts(model, self.tok, self.factory,
                                          [t for t, _ in starts for _ in range(d.k)], self.ro,
                                          seed=self.cfg.seed * 1_000_003 + 7_777 + it, renderer=self.ctx.renderer,
                                          prefixes=[p for _, p in starts for _ in range(d.k)])
            for j, (t, p) in enumerate(starts):
                states.append((t.id, sum(m.role == "assistant" for m in p), eps[j * d.k:(j + 1) * d.k]))
        return mine_step_pairs(states, d.value_gap, id_prefix=f"it{it}:")


register_algorithm(Algorithm("dpo", DPORunConfig, "preference optimisation on pairs from a file or mined from "
                             "rollouts", _prepare, _build))
