"""The ``rft`` algorithm: rejection-sampling fine-tuning on the policy's own verified attempts.

Each iteration: sample k attempts per training task with the current policy, let the environment
verify them, keep the successes (deduplicated, at most a quota per task), then SFT on the expert
data plus the kept attempts; repeat. The kept attempts of each iteration are written to the run
directory before training on them, so a killed run resumes exactly (``experience.IterativeSource``).
With ``rft.eef`` the failed expert trajectories are mined for their beneficial segments (EEF); with
``rft.early_experience`` the policy's own alternatives at the expert's states become world-model and
self-reflection records (``algorithms.early_experience``).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Literal

from pydantic import Field, model_validator

from trajtune import rollout as agent_loop  # by module: tests replace agent_loop.run_rollouts
from trajtune.algorithms.actions import action_signature
from trajtune.algorithms.batch import fit_length
from trajtune.algorithms.early_experience import ENDED, EarlyExperienceSpec, early_experience_mine
from trajtune.algorithms.registry import Algorithm, Recipe, RunContext, register_algorithm
from trajtune.algorithms.sft import (
    SFTObjective,
    critical_steps,
    filter_records,
    load_records,
    mask_errors,
    render_training_data,
)
from trajtune.config import DataSpec, EnvRunBase, FilterSpec, _C
from trajtune.envs.registry import make_env
from trajtune.errors import ConfigError, DataError, require_input
from trajtune.experience import IterativeSource
from trajtune.filters import apply_filters, make_filter_judge
from trajtune.progress import console
from trajtune.schema import Trajectory
from trajtune.tokens import TokenTrajectory


def select_successes(episodes: list[Any], per_task_quota: int,
                     dedup: bool = True) -> tuple[list[Trajectory], dict[str, int]]:
    """Verified successes (``outcome.success``, set by the environment from its state), at most
    ``per_task_quota`` per task (``episode.task.id``), duplicates of an already kept action sequence
    of the same task skipped; in episode order, so the choice is deterministic."""
    kept: list[Trajectory] = []
    per_task: dict[str, int] = defaultdict(int)
    seen: dict[str, set[str]] = defaultdict(set)
    counts = {"attempts": len(episodes), "successes": 0, "duplicates": 0, "over_quota": 0, "kept": 0,
              "tasks_with_success": 0}
    tasks_ok: set[str] = set()
    for e in episodes:
        t: Trajectory = e.trajectory
        if not (t.outcome is not None and t.outcome.success):
            continue
        counts["successes"] += 1
        task = e.task.id if getattr(e, "task", None) is not None else t.id
        tasks_ok.add(task)
        sig = action_signature(t)
        if dedup and sig in seen[task]:
            counts["duplicates"] += 1
            continue
        if per_task[task] >= per_task_quota:
            counts["over_quota"] += 1
            continue
        seen[task].add(sig)
        per_task[task] += 1
        kept.append(t.model_copy(update={"metadata": {**t.metadata, "task_id": task, "rft": True}}))
    counts["kept"] = len(kept)
    counts["tasks_with_success"] = len(tasks_ok)
    return kept, counts


def rft_mine(model: Any, tokenizer: Any, renderer: Any, env_factory: Any, tasks: list[Any], rollout: Any, k: int,
             per_task_quota: int, seed: int, dedup: bool = True,
             progress: Any = None) -> tuple[list[Trajectory], dict[str, int]]:
    """k attempts per task with ``model``, then ``select_successes``."""
    expanded = [t for t in tasks for _ in range(k)]
    episodes = agent_loop.run_rollouts(model, tokenizer, env_factory, expanded, rollout, seed=seed, renderer=renderer,
                                       progress=progress)
    return select_successes(episodes, per_task_quota, dedup)


# -- EEF: exploring expert failures -----------------------------------------------------------------

def eef_states(n_steps: int, m: int) -> list[int]:
    """The states explored in a failed expert trajectory of ``n_steps`` actions: s_0, s_l, s_2l, …,
    s_Ml with l = ⌊n/(M+1)⌋ (12 steps, M = 3: s0, s3, s6, s9). A trajectory shorter than M + 1
    actions gets every state s_0 … s_{n−1} (l = 1) rather than none: agent trajectories are often
    a handful of actions, and their failures are worth mining too."""
    step = max(1, n_steps // (m + 1))
    return [i * step for i in range(m + 1) if i * step < max(n_steps, 1)]


def beneficial_segments(n_steps: int, states: list[int], success_from: list[bool]) -> list[int]:
    """Action indices to supervise: the segment s_k → s_next is beneficial when the policy fails from
    s_k and succeeds from s_next (the expert's actions in between carry it into a state it can
    finish from). The last state's segment runs to the end of the trajectory; the expert failed
    there, so it is never beneficial. Check: 12 steps, states (0, 3, 6, 9), success (0, 1, 0, 1)
    supervise a0–a2 and a6–a8."""
    out: list[int] = []
    for j in range(len(states) - 1):
        if not success_from[j] and success_from[j + 1]:
            out += list(range(states[j], states[j + 1]))
    return out


def supervise_actions(t: Trajectory, actions: list[int]) -> Trajectory:
    """A copy of ``t`` whose assistant messages number ``actions`` (0-based) are trained and the
    others stay in context untrained."""
    chosen = set(actions)
    msgs, a = [], 0
    for m in t.messages:
        if m.role == "assistant":
            m = m.model_copy(update={"train": a in chosen})
            a += 1
        msgs.append(m)
    return t.model_copy(update={"messages": msgs})


def eef_mine(model: Any, tokenizer: Any, renderer: Any, env_factory: Any, failed: list[tuple[Any, Trajectory]],
             rollout: Any, m: int, attempts: int, seed: int) -> tuple[list[Trajectory], dict[str, int]]:
    """EEF over failed expert trajectories: from each of their ``eef_states`` the policy makes
    ``attempts`` attempts (the state is reached by replaying the expert's actions); a state counts as
    solved when any attempt succeeds. Returns the expert trajectories with only their beneficial
    segments trained (those with none are left out) and counts."""
    jobs: list[tuple[int, int]] = []  # (trajectory index, state index) per rollout
    tasks, prefixes, plan = [], [], []
    for i, (task, traj) in enumerate(failed):
        where = [j for j, msg in enumerate(traj.messages) if msg.role == "assistant"]
        states = eef_states(len(where), m)
        plan.append((len(where), states))
        for k, s in enumerate(states):
            prefix = traj.messages[: where[s]] if s < len(where) else list(traj.messages)
            for _ in range(attempts):
                tasks.append(task)
                prefixes.append(prefix)
                jobs.append((i, k))
    solved: dict[tuple[int, int], bool] = defaultdict(bool)
    if tasks:
        episodes = agent_loop.run_rollouts(model, tokenizer, env_factory, tasks, rollout, seed=seed, renderer=renderer,
                                           prefixes=prefixes)
        for job, e in zip(jobs, episodes):
            solved[job] |= bool(e.trajectory.outcome is not None and e.trajectory.outcome.success)
    out: list[Trajectory] = []
    counts = {"failed_experts": len(failed), "rollouts": len(tasks), "states_solved": sum(solved.values()),
              "trajectories": 0, "supervised_actions": 0}
    for i, (task, traj) in enumerate(failed):
        n, states = plan[i]
        acts = beneficial_segments(n, states, [solved[(i, k)] for k in range(len(states))])
        if acts:
            out.append(supervise_actions(traj, acts).model_copy(
                update={"metadata": {**traj.metadata, "task_id": task.id, "eef_actions": acts}}))
            counts["supervised_actions"] += len(acts)
    counts["trajectories"] = len(out)
    return out, counts


# -- the `rft` algorithm: config and recipe ----------------------------------------------------------

class RFTSpec(_C):
    iterations: int = Field(2, gt=0, description="mine → train rounds; train.steps is split evenly between them")
    n_tasks: int = Field(64, gt=0, description="training tasks of the env's train split (seeded by the run seed), "
                                               "all attempted every iteration")
    k: int = Field(4, ge=0, description="attempts per task and iteration (0: none, with rft.eef or "
                                        "rft.early_experience)")
    per_task_quota: int = Field(1, gt=0, description="kept successes per task and iteration at most")
    dedup: bool = Field(True, description="keep one copy of identical successful action sequences")
    keep_previous: bool = Field(True, description="train on the successes of earlier iterations too")
    eef: bool = Field(False, description="expert-failure mining: supervise the beneficial segments of the failed "
                                         "expert trajectories in data.path (their ids are training task ids)")
    eef_states: int = Field(5, gt=0, description="M: evenly spaced states per failed expert trajectory")
    eef_attempts: int = Field(2, gt=0, description="policy attempts from each state")
    early_experience: EarlyExperienceSpec | None = Field(
        None, description="early experience: the policy's own alternative actions at the expert trajectories' states "
                          "(data.path) become world-model and self-reflection records (docs/algorithms.md, Early "
                          "experience)")
    filters: FilterSpec | None = Field(
        None, description="quality filters on the mined successes before they train (stepwise consistency, "
                          "mistakes, format, length, an LLM judge; docs/formats.md, Filtering data); removed ones "
                          "are logged as filtered_RULE")

    @model_validator(mode="after")
    def _no_ops(self) -> "RFTSpec":
        if not self.eef and {"eef_states", "eef_attempts"} & self.non_default():
            raise ValueError("rft.eef_states / rft.eef_attempts are set but rft.eef is false")
        if self.k == 0 and not (self.eef or self.early_experience is not None):
            raise ValueError("rft.k: 0 mines no attempt, and neither rft.eef nor rft.early_experience is set: nothing "
                             "of the policy's own would train (for SFT on the data alone use algorithm: sft)")
        if self.k == 0 and ({"per_task_quota", "dedup", "filters"} & self.non_default()):
            raise ValueError("rft.per_task_quota / rft.dedup / rft.filters apply to mined successes, and rft.k is 0")
        return self


class RFTRunConfig(EnvRunBase):
    """``algorithm: rft``: rejection-sampling fine-tuning on the policy's own verified successes
    (plus expert data, plus EEF segments), re-mined every iteration."""

    algorithm: Literal["rft"] = Field("rft", description="rejection-sampling fine-tuning on own verified attempts")
    data: DataSpec | None = Field(None, description="expert trajectories trained every iteration (and, with "
                                                    "rft.eef, the source of failed expert trajectories)")
    rft: RFTSpec = Field(default_factory=RFTSpec, description="attempts, filtering and iterations")

    @model_validator(mode="after")
    def _steps(self) -> "RFTRunConfig":
        if self.train.steps % self.rft.iterations:
            raise ValueError(f"train.steps ({self.train.steps}) must be a multiple of rft.iterations "
                             f"({self.rft.iterations}): each iteration trains the same number of steps")
        if self.data is not None and self.data.faft:
            raise ValueError("data.faft is an sft option: rft's own attempts would train without the feedback slot")
        if self.data is not None and self.data.train_on == "all_tokens":
            raise ValueError("data.train_on: all_tokens (continual pre-training) is an sft option; rft trains "
                             "assistant turns")
        if self.data is not None and (self.data.mask_errors or self.data.critical_steps is not None) \
                and self.data.train_on == "last":
            raise ValueError("data.mask_errors / data.critical_steps with data.train_on: last are not supported by "
                             "rft (the policy's own attempts would then train every turn); use train_on: all or hint")
        if self.rft.eef and self.data is None:
            raise ValueError("rft.eef needs data.path: the expert trajectories whose failures are mined")
        if self.rft.early_experience is not None and self.data is None:
            raise ValueError("rft.early_experience needs data.path: the expert trajectories whose states are explored")
        return self


def _prepare(cfg: RFTRunConfig, ctx: RunContext) -> dict[str, Any]:
    env = make_env(cfg.env.name, **cfg.env.kwargs)  # fail fast on an unknown environment
    for on, key in ((cfg.rft.eef, "rft.eef"), (cfg.rft.early_experience is not None, "rft.early_experience")):
        if on and not env.deterministic:
            raise ConfigError(f"{key} replays expert actions to reach states, and environment {cfg.env.name!r} is not "
                              "deterministic (docs/envs.md, Reaching a state)")
    tasks = env.tasks("train", cfg.rft.n_tasks, seed=cfg.seed)
    experts: list[Any] = []
    failed: list[tuple[Any, Any]] = []
    explore: list[tuple[Any, Any]] = []
    counts: dict[str, Any] = {}
    fixed: list[TokenTrajectory] = []
    if cfg.data is not None:
        require_input(cfg.data.path, "data.path")
        trajs, load = load_records(cfg.data)
        trajs, filtered = filter_records(trajs, cfg.data)
        if filtered:
            counts["filters"] = filtered
        trajs, masked = mask_errors(trajs, cfg.data)
        if masked:
            counts["error_turns_masked"] = masked
        trajs, critical = critical_steps(trajs, cfg.data)
        if critical:
            counts["critical_steps"] = critical
        experts = [t for t in trajs if not (t.outcome is not None and t.outcome.success is False)]
        by_id = {t.id: t for t in tasks}
        if cfg.rft.eef:
            bad = [t for t in trajs if t.outcome is not None and t.outcome.success is False]
            failed = [(by_id[t.id], t) for t in bad if t.id in by_id]
            if not failed:
                raise DataError(f"{cfg.data.path}: rft.eef found no failed expert trajectory of a training task "
                                f"({len(bad)} record(s) with outcome.success false, {len(bad) - len(failed)} of them "
                                f"with an id outside the {len(tasks)} training tasks of {cfg.env.name} at seed "
                                f"{cfg.seed})")
        if cfg.rft.early_experience is not None:
            explore = [(by_id[t.id], t) for t in experts if t.id in by_id]
            if not explore:
                raise DataError(f"{cfg.data.path}: rft.early_experience found no expert trajectory of a training task "
                                f"({len(experts)} record(s); their ids must be ids of the {len(tasks)} training tasks "
                                f"of {cfg.env.name} at seed {cfg.seed}, as trajtune data generate --seed writes them)")
        if experts:
            fixed, c = render_training_data(experts, ctx.renderer, cfg.data.path, cfg.data.max_length,
                                            cfg.data.truncation, ctx.quiet)
            counts.update({"expert_records": c["train_records"], "invalid_skipped": load.skipped})
        counts["failed_experts"] = len(failed)
        if explore:
            counts["early_experience_experts"] = len(explore)
    return {"tasks": tasks, "fixed": fixed, "failed": failed, "explore": explore, "counts": counts}


def _build(cfg: RFTRunConfig, ctx: RunContext, prepared: dict[str, Any]) -> Recipe:
    assert ctx.out is not None
    r = cfg.rft
    ro = cfg.rollout.to_config()
    max_length = cfg.data.max_length if cfg.data else cfg.rollout.max_length

    env_factory = cfg.rollout.env_factory(cfg.env)
    judge = make_filter_judge(r.filters) if r.filters is not None else None

    def mine(it: int, model: Any) -> tuple[list[Any], dict[str, float]]:
        seed = cfg.seed * 1_000_003 + 7_777 + it
        kept: list[Trajectory] = []
        c: dict[str, int] = {}
        if r.k:
            kept, c = rft_mine(model, ctx.tokenizer, ctx.renderer, env_factory, prepared["tasks"], ro, r.k,
                               r.per_task_quota, seed, dedup=r.dedup)
        metrics = {k: float(v) for k, v in c.items()}
        if r.filters is not None:  # a success that repeated a failed call still teaches the repeat
            kept, report = apply_filters(kept, r.filters, judge)
            metrics.update({f"filtered_{k}": float(v) for k, v in report.removed.items()})
            metrics["filtered_out"] = float(sum(report.removed.values()))
            if report.judge_failures:
                metrics["filter_judge_failures"] = float(report.judge_failures)
        records = list(kept)
        if r.eef:
            segs, ce = eef_mine(model, ctx.tokenizer, ctx.renderer, env_factory, prepared["failed"], ro,
                                r.eef_states, r.eef_attempts, seed)
            records += segs
            metrics.update({f"eef_{k}": float(v) for k, v in ce.items()})
        if r.early_experience is not None:
            extra, cx = early_experience_mine(model, ctx.tokenizer, ctx.renderer, env_factory, prepared["explore"], ro,
                                              r.early_experience, seed)
            records += extra
            metrics.update({f"ee_{k}": float(v) for k, v in cx.items()})
            if cx["world_model_records"] and cx["silent_outcomes"] == cx["world_model_records"] and not ctx.quiet:
                console.print(f"[yellow]rft.early_experience: the environment answered none of the "
                              f"{cx['world_model_records']} actions (every episode ended at once), so every world-"
                              f"model record predicts '{ENDED}' and teaches nothing; use an environment that answers "
                              "actions (for fncall: single_turn: false) or set early_experience.world_model: "
                              "false[/yellow]")
        metrics["records"] = float(len(records))
        if not records and not prepared["fixed"] and not (r.keep_previous and it > 0):
            raise DataError(f"rft iteration {it + 1}: nothing to train on: {c.get('successes', 0)} successes in "
                            f"{c.get('attempts', 0)} attempts on {len(prepared['tasks'])} tasks"
                            + (f", {metrics.get('eef_trajectories', 0):.0f} EEF trajectories" if r.eef else "")
                            + ", and no expert data; start from a stronger model, raise rft.k or the rollout "
                              "temperature, or add data.path")
        if not records and not ctx.quiet:
            console.print(f"rft iteration {it + 1}: no success in {c.get('attempts', 0)} attempts; training on the "
                          "expert data" + (" and earlier successes" if r.keep_previous and it > 0 else ""))
        return records, metrics

    def render(records: list[Any]) -> list[list[TokenTrajectory]]:
        rows: list[TokenTrajectory] = []
        for t in records:
            rows += [s for s in ctx.renderer.render_samples(t) if any(w > 0 for w in s.weight)]
        rows, _ = fit_length(rows, max_length, "drop")
        return [[t] for t in rows if any(w > 0 for w in t.weight)]

    source = IterativeSource(
        mine=mine, render=render, load=Trajectory.model_validate_json,
        dump=lambda t: t.model_dump_json(exclude_none=True), steps_per_iteration=cfg.train.steps // r.iterations,
        batch_size=cfg.train.batch_size, cache_dir=ctx.out / "rft", fixed=[[t] for t in prepared["fixed"]],
        keep_previous=r.keep_previous, seed=cfg.seed)
    t = cfg.train
    return Recipe(source=source, objective=SFTObjective(t.eaft, t.eaft_top_k, t.eaft_alpha),
                  micro_batch_size=min(t.micro_batch_size, t.batch_size), result=dict(prepared["counts"]),
                  shown=("loss", "token_accuracy"), plot=("loss.png", ("loss", "token_accuracy"), "RFT"))


register_algorithm(Algorithm("rft", RFTRunConfig, "rejection-sampling fine-tuning on verified own attempts (+ EEF)",
                             _prepare, _build))
