"""The ``rl`` algorithm: online multi-turn policy gradient (GRPO, Dr. GRPO, RLOO, REINFORCE++).

The math is in three small modules: ``algorithms.advantages`` (the group estimators, turn-level
credit), ``algorithms.episode_transforms`` (non-finite rewards, termination policy, overlong
penalty, reference log-probs) and ``algorithms.policy_gradient`` (the clipped objective with KL).
This module is the recipe: a rollout source with the transform list the config asks for
(``rl_transforms``, which also dispatches ``rl.credit`` to its estimator: group, turn, MC-Critic
or GAE), the objective, and how many updates one rollout batch feeds (``ppo_epochs`` ×
``mini_batches``; with more than one, π_old is the sampling policy's stored log-probs, so the
ratio leaves 1 and the clip binds).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from trajtune import distributed as dist
from trajtune.algorithms.advantages import (
    Estimator,
    Whitening,
    assign_advantages,
    assign_turn_advantages,
    groups_of,
    is_informative,
    with_closed_rows,
)
from trajtune.algorithms.curriculum import Curriculum, CurriculumSpec
from trajtune.algorithms.episode_transforms import (
    DEFAULT_TERMINATION_POLICY,
    TerminationPolicy,
    add_ref_logprobs,
    apply_overlong_penalty,
    apply_termination_policy,
    mark_nonfinite_rewards,
)
from trajtune.algorithms.gigpo import Anchor, assign_gigpo_advantages
from trajtune.algorithms.mc_critic import MCCritic, MCCriticSpec, assign_mc_advantages
from trajtune.algorithms.policy_gradient import PolicyGradientObjective
from trajtune.algorithms.registry import Algorithm, Recipe, RunContext, register_algorithm
from trajtune.algorithms.roles import add_role_adapters, load_role_adapters, split_by_role, write_roles
from trajtune.algorithms.rewards import RewardComposer, RewardSpec
from trajtune.algorithms.self_correction import (
    TrainTurns,
    check_retry_env,
    first_attempt_success,
    restrict_to_turns,
)
from trajtune.algorithms.turn_judge import TurnJudge, TurnJudgeSpec
from trajtune.algorithms.value import (
    ValueEstimator,
    ValueHead,
    ValueObjective,
    ValueSpec,
    assign_gae_advantages,
    chain_critics,
    hidden_size,
)
from trajtune.config import EnvRunBase, TrainSpec, _C
from trajtune.envs.adapters.fold import folds
from trajtune.envs.adapters.openai_policy import endpoint_policy
from trajtune.envs.registry import make_env
from trajtune.errors import ConfigError, ServerError
from trajtune.experience import OneStepAhead, RolloutSource, Transform
from trajtune.generation import supports
from trajtune.remote import ServerClient, ServerSampler, ServerSynced, WeightSync
from trajtune.tokens import TokenTrajectory


class DynamicSampling(BaseModel):
    """DAPO dynamic sampling: resample until the batch holds ``rl.tasks_per_step`` informative groups."""

    model_config = ConfigDict(extra="forbid")
    max_rounds: int = Field(4, gt=1, description="sampling rounds per step at most (the first included); a step "
                                                 "that still lacks informative groups trains on those it has")


class Overlong(BaseModel):
    """DAPO soft overlong penalty on the policy's token count |y|: 0 up to L−C, linear to −1 at L, −1 beyond."""

    model_config = ConfigDict(extra="forbid")
    max_length: int = Field(gt=0, description="L: the length at which the penalty reaches −1")
    cache: int = Field(gt=0, description="C: the width of the linear band before L")

    @model_validator(mode="after")
    def _band(self) -> "Overlong":
        if self.cache > self.max_length:
            raise ValueError("rl.overlong.cache must not exceed rl.overlong.max_length")
        return self


class GiGPOSpec(BaseModel):
    """GiGPO's step groups: how anchor states are found and how much the step advantage weighs."""

    model_config = ConfigDict(extra="forbid")
    step_weight: float = Field(1.0, gt=0, description="ω: the step advantage's weight beside the episode's (the "
                                                      "paper's 1)")
    anchor: Literal["history", "last"] = Field(
        "history", description="the anchor state of a turn: history (everything the policy did not write before "
                               "it) or last (only what came back since the previous action, for environments "
                               "whose observation is the whole state)")


class RLSpec(_C):
    estimator: Literal["grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"] = Field(
        "grpo", description="advantage estimator (docs/algorithms.md): grpo (group mean/std), dr_grpo (group "
                            "mean), rloo (leave-one-out), reinforce_pp (batch whitening), reinforce_pp_baseline")
    tasks_per_step: int = Field(8, gt=0, description="training tasks per step (groups)")
    group_size: int = Field(8, gt=0, description="episodes sampled per task; advantages compare within a group")
    n_train_tasks: int = Field(1024, gt=0, description="training tasks drawn from the environment, cycled over "
                                                       "the steps")
    clip_low: float = Field(0.2, ge=0, description="ε_low: the ratio is clipped below at 1 − ε_low")
    clip_high: float = Field(0.28, ge=0, description="ε_high: the ratio is clipped above at 1 + ε_high (DAPO "
                                                     "clip-higher)")
    kl_coef: float = Field(0.0, ge=0, description="β of a KL penalty to the frozen starting model (0: none, "
                                                  "and no reference model is loaded)")
    kl_estimator: Literal["k1", "k2", "k3"] = Field("k3", description="the KL estimator (with kl_coef > 0)")
    aggregation: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"] = Field(
        "token_mean", description="how token losses are averaged (docs/algorithms.md, Objective)")
    norm_length: float = Field(1024.0, gt=0, description="the constant length of seq_mean_token_sum_norm "
                                                         "(Dr. GRPO)")
    drop_equal_groups: bool = Field(False, description="leave out groups whose rewards are all equal (zero "
                                                       "advantage)")
    termination: dict[str, Literal["keep", "zero_reward", "mask", "drop"]] = Field(
        default_factory=dict, description="per termination (length, max_turns, timeout, env_error, ...): keep the "
                                          "episode, give it reward 0, mask its loss, or drop it")
    ppo_epochs: int = Field(1, gt=0, description="passes over each rollout batch")
    mini_batches: int = Field(1, gt=0, description="optimizer updates per pass (whole groups per mini-batch)")
    dynamic_sampling: DynamicSampling | None = Field(
        None, description="DAPO: keep sampling until tasks_per_step groups have differing rewards (implies "
                          "drop_equal_groups)")
    overlong: Overlong | None = Field(None, description="DAPO soft overlong penalty added to the reward")
    whitening: Literal["token", "trajectory"] = Field(
        "token", description="REINFORCE++ batch whitening statistics: over policy tokens (verl) or trajectories")
    async_rollouts: bool = Field(
        False, description="sample step k+1's rollouts in the background while step k trains (staleness 1: "
                           "they come from the policy before step k's update; the clipped ratio is taken against "
                           "their sampling log-probs); one process, a model the KV-cache sampler serves")
    curriculum: CurriculumSpec | None = Field(
        None, description="train on the easiest tasks first (task.data['difficulty']) and add the next level once "
                          "the current one is solved often enough (docs/algorithms.md, Curriculum)")
    turn_judge: TurnJudgeSpec | None = Field(
        None, description="an LLM grades every turn -1/0/+1; c · score is added to the turn's reward (with credit: "
                          "episode, R = outcome + c · sum of scores) (docs/algorithms.md, Judge-scored turns)")
    reward: RewardSpec | None = Field(
        None, description="the training reward as weighted named terms with an optional per-stage schedule "
                          "(env, success, format, length, turns, info.NAME from the environment, module:function "
                          "plug-ins); each term is logged as reward/NAME (docs/algorithms.md, Reward composition)")
    credit: Literal["episode", "turn", "gigpo", "mc_critic", "gae"] = Field(
        "episode", description="episode: the episode reward's advantage on every policy token; turn: each turn's "
                               "discounted return compared across the group's turns at the same depth (per-turn "
                               "rewards from the environment); gigpo: the episode's advantage plus a step "
                               "advantage among the group's steps from the same anchor state (GiGPO); mc_critic: "
                               "turn-level GAE with Monte-Carlo state values from extra rollouts; gae: PPO with a "
                               "learned value head and token-level GAE(γ, λ) (docs/algorithms.md, Turn-level credit, MC-Critic, PPO with a value head)")
    gamma: float = Field(1.0, ge=0, le=1, description="discount γ of turn returns (with credit: turn, gigpo, "
                                                      "mc_critic or gae)")
    gigpo: GiGPOSpec | None = Field(None, description="with credit: gigpo: the step advantage's weight and the "
                                                      "anchor-state rule; defaults when omitted")
    value: ValueSpec | None = Field(None, description="the value head (credit: gae, or mc_critic with "
                                                      "mc_critic.value_weight > 0): vf_coef, value clipping, GAE λ "
                                                      "and advantage whitening; defaults when omitted")
    mc_critic: MCCriticSpec | None = Field(None, description="with credit: mc_critic: rollouts per state (samples) "
                                                             "and GAE λ (lam); defaults when omitted")
    train_turns: TrainTurns = Field(
        "all", description="which of the policy's turns train: all, or with the retry environment wrapper only the "
                           "reflection after a failed attempt (Reflect, Retry, Reward) or only the retried attempt "
                           "(RISE); episodes without such a turn are masked (docs/algorithms.md, Trained "
                           "self-correction)")
    role_adapters: bool = Field(
        False, description="an environment with several roles (the roles wrapper): one LoRA adapter per role on "
                           "one base model, each sampling its role's turns and trained only on them; every seat "
                           "starts from the model's adapter (docs/algorithms.md, Several trained roles)")
    masked_in_baseline: bool = Field(
        False, description="count masked episodes (env errors, timeouts, non-finite rewards) in their group's "
                           "baseline; by default they are left out, since they say nothing about the policy")

    @field_validator("termination")
    @classmethod
    def _known_terminations(cls, v: dict[str, str]) -> dict[str, str]:
        bad = sorted(set(v) - set(DEFAULT_TERMINATION_POLICY))
        if bad:
            raise ValueError(f"rl.termination: unknown termination(s) {bad}; known: "
                             f"{', '.join(DEFAULT_TERMINATION_POLICY)}")
        return v

    def uses_value_head(self) -> bool:
        """credit: gae, or MC-Critic blending a learned value in."""
        return self.credit == "gae" or (self.credit == "mc_critic" and self.mc_critic is not None
                                        and self.mc_critic.value_weight > 0)

    def _value_no_ops(self, s: dict[str, Any]) -> None:
        if self.credit == "gae":
            conflict = [k for k in ("estimator", "whitening", "masked_in_baseline") if k in s]
            if conflict:
                raise ValueError(f"rl.credit: gae computes its own advantages (token-level GAE with a value head); "
                                 f"{', '.join('rl.' + k for k in conflict)} apply to group baselines, drop them")
            if self.async_rollouts:
                raise ValueError("rl.credit: gae with rl.async_rollouts is not supported (the background sampler "
                                 "would read the value head while it trains)")
        if self.value is None:
            return
        if self.credit not in ("gae", "mc_critic"):
            raise ValueError("rl.value only applies to credit: gae, or credit: mc_critic with "
                             "rl.mc_critic.value_weight > 0")
        if self.credit == "mc_critic":
            if not self.uses_value_head():
                raise ValueError("rl.value with credit: mc_critic trains a value head nothing reads: set "
                                 "rl.mc_critic.value_weight > 0 or drop rl.value")
            extra = sorted(set(self.value.non_default()) & {"lam", "whiten_advantages"})
            if extra:
                raise ValueError(f"rl.value.{extra[0]} only applies to credit: gae (MC-Critic's λ is "
                                 "rl.mc_critic.lam, and its advantages are not whitened)")

    @model_validator(mode="after")
    def _no_ops(self) -> "RLSpec":
        s = self.non_default()
        if self.kl_coef == 0 and "kl_estimator" in s:
            raise ValueError("rl.kl_estimator is set but rl.kl_coef is 0: no KL term would be computed")
        if self.aggregation != "seq_mean_token_sum_norm" and "norm_length" in s:
            raise ValueError("rl.norm_length only applies to aggregation: seq_mean_token_sum_norm")
        if self.group_size == 1 and self.estimator in ("grpo", "dr_grpo", "rloo") and self.credit != "gae":
            raise ValueError(f"rl.group_size 1 gives zero advantages with estimator {self.estimator}; use >= 2")
        if self.group_size == 1 and (self.drop_equal_groups or self.dynamic_sampling is not None):
            raise ValueError("rl.drop_equal_groups / rl.dynamic_sampling with group_size 1 would drop every group")
        if "gamma" in s and self.credit == "episode":
            raise ValueError("rl.gamma only applies to credit: turn, gigpo, mc_critic or gae")
        if self.gigpo is not None and self.credit != "gigpo":
            raise ValueError("rl.gigpo only applies to credit: gigpo")
        if self.mc_critic is not None and self.credit != "mc_critic":
            raise ValueError("rl.mc_critic only applies to credit: mc_critic")
        if self.credit == "mc_critic" and ("estimator" in s or "whitening" in s):
            raise ValueError("rl.credit: mc_critic computes its own advantages (turn-level GAE); rl.estimator and "
                             "rl.whitening do not apply")
        self._value_no_ops(s)
        if self.credit == "mc_critic" and self.async_rollouts:
            raise ValueError("rl.credit: mc_critic with rl.async_rollouts is not supported")
        if self.credit in ("turn", "gigpo") and self.estimator.startswith("reinforce_pp"):
            raise ValueError(f"rl.credit: {self.credit} works with the group estimators (grpo, dr_grpo, rloo), not "
                             f"{self.estimator}")
        if "whitening" in s and not self.estimator.startswith("reinforce_pp"):
            raise ValueError("rl.whitening only applies to the reinforce_pp estimators")
        if self.curriculum is not None and self.async_rollouts:
            raise ValueError("rl.curriculum with rl.async_rollouts is not supported (the next step's tasks would be "
                             "chosen before this step's successes are counted)")
        if self.train_turns != "all":
            if self.credit != "episode":
                raise ValueError(f"rl.train_turns: {self.train_turns} works with rl.credit: episode (the turn it trains "
                                 f"gets the episode's advantage), not {self.credit}")
            if self.masked_in_baseline:
                raise ValueError(f"rl.masked_in_baseline with rl.train_turns: {self.train_turns} would put the episodes "
                                 "without that turn (solved at the first attempt) in the baseline; drop one of them")
        if self.mini_batches > self.tasks_per_step:
            raise ValueError(f"rl.mini_batches ({self.mini_batches}) > rl.tasks_per_step ({self.tasks_per_step}): "
                             "a mini-batch holds whole groups, so some would be empty")
        return self


class RLRunConfig(EnvRunBase):
    """``algorithm: rl``: online RL in an environment."""

    algorithm: Literal["rl"] = Field("rl", description="online multi-turn RL")
    rl: RLSpec = Field(default_factory=RLSpec, description="estimator, group sampling and the objective")

    @model_validator(mode="after")
    def _server_sync(self) -> "RLRunConfig":
        if self.rollout.server is not None and self.rl.async_rollouts:
            raise ValueError("rl.async_rollouts with rollout.server is not supported: the background sampler would "
                             "sample while the server's weights change; drop one of them")
        if self.train.sharding == "fsdp" and self.rl.uses_value_head():
            raise ValueError(f"rl.credit: {self.rl.credit} with a value head (gae, or mc_critic.value_weight > 0) is not "
                             "supported with train.sharding: fsdp (the head would stay outside the sharded model); "
                             "use train.sharding: none or another rl.credit")
        if self.rollout.vllm is not None and self.rl.async_rollouts:
            raise ValueError("rl.async_rollouts with rollout.vllm is not supported: the background sampler would "
                             "sample while vLLM's weights change; drop one of them")
        if self.rl.role_adapters:
            self._role_adapter_combinations()
        return self

    def _role_adapter_combinations(self) -> None:
        """rl.role_adapters switches adapters inside the local sampler and the learner: what cannot follow."""
        for bad, why in ((self.rollout.server is not None, "rollout.server (the server holds one adapter)"),
                         (self.rollout.vllm is not None, "rollout.vllm (vLLM samples with one set of weights)"),
                         (self.train.sharding == "fsdp", "train.sharding: fsdp"),
                         (self.rl.uses_value_head(), f"rl.credit: {self.rl.credit} with a value head"),
                         (self.rollout.mask_observations_at > 0, "rollout.mask_observations_at (it re-encodes the "
                                                                 "context, which the per-role KV caches do not follow)")):
            if bad:
                raise ValueError(f"rl.role_adapters is not supported with {why}")

    @field_validator("train")
    @classmethod
    def _rl_train(cls, v: TrainSpec) -> TrainSpec:
        if "batch_size" in v.non_default():
            raise ValueError("train.batch_size is not used by RL (a step is rl.tasks_per_step × rl.group_size episodes)")
        return v


def rl_transforms(*, estimator: Estimator = "grpo", termination: dict[str, TerminationPolicy] | None = None,
                  drop_equal_groups: bool = False, whitening: Whitening = "token", masked_in_baseline: bool = False,
                  overlong: tuple[int, int] | None = None, ref_model: Any = None, pad_id: int = 0,
                  temperature: float = 1.0, credit: str = "episode",
                  gamma: float = 1.0, lam: float = 1.0, value_weight: float = 0.0,
                  whiten_advantages: bool = False, step_weight: float = 1.0,
                  anchor: Anchor = "history",
                  roles: dict[str, str] | None = None) -> tuple[list[Transform], list[Transform]]:
    """The RL transform lists for ``RolloutSource``, in order: (per round) non-finite rewards →
    termination policy → overlong penalty → informative-group filter; (per batch) advantages →
    reference log-probs. ``credit`` picks the advantages: ``episode`` (group estimators), ``turn``
    (per-turn returns), ``gigpo`` (episode plus anchor-state step advantages), ``mc_critic``
    (turn-level GAE on Monte-Carlo values), ``gae`` (token-level GAE on a value head); the dispatch
    is here, with the algorithm, not in the experience sources."""

    def nonfinite(tts: list[TokenTrajectory]) -> tuple[list[TokenTrajectory], dict[str, float]]:
        tts, n = mark_nonfinite_rewards(tts)
        return tts, {"nonfinite_rewards": float(n)}

    def terminate(tts: list[TokenTrajectory]) -> tuple[list[TokenTrajectory], dict[str, float]]:
        return apply_termination_policy(tts, termination), {}

    def penalise(tts: list[TokenTrajectory]) -> tuple[list[TokenTrajectory], dict[str, float]]:
        assert overlong is not None
        return tts, {"overlong_penalty": apply_overlong_penalty(tts, *overlong)}

    def informative(tts: list[TokenTrajectory]) -> tuple[list[TokenTrajectory], dict[str, float]]:
        groups = groups_of(tts)
        keep = {g for g, members in groups.items() if is_informative(members)}
        return [t for t in tts if (t.group or t.traj_id) in keep], {"equal_reward_groups": float(len(groups) - len(keep))}

    def advantages(tts: list[TokenTrajectory]) -> tuple[list[TokenTrajectory], dict[str, float]]:
        if credit == "turn":
            kept, m = assign_turn_advantages(tts, estimator, gamma, masked_in_baseline)  # type: ignore[arg-type]
        elif credit == "gigpo":
            kept, m = assign_gigpo_advantages(tts, estimator, gamma, step_weight, anchor, masked_in_baseline)
        elif credit == "mc_critic":
            kept, m = assign_mc_advantages(tts, gamma, lam, value_weight)
        elif credit == "gae":
            kept, m = assign_gae_advantages(tts, gamma, lam, whiten_advantages)
        else:
            kept, m = assign_advantages(tts, estimator, False, whitening, masked_in_baseline)
        skip = {"nonfinite_rewards"} | ({"equal_reward_groups"} if drop_equal_groups else set())
        return kept, {k: v for k, v in m.items() if k not in skip}

    def reference(tts: list[TokenTrajectory]) -> tuple[list[TokenTrajectory], dict[str, float]]:
        if tts:
            add_ref_logprobs(ref_model, tts, pad_id, temperature)
        return tts, {}

    def by_role(tts: list[TokenTrajectory]) -> tuple[list[TokenTrajectory], dict[str, float]]:
        return split_by_role(tts, roles or {})

    per_round: list[Transform] = [nonfinite, terminate]
    if overlong is not None:
        per_round.append(penalise)
    if roles is not None:  # an environment with roles: a row and a group baseline per role
        per_round.append(by_role)
    if drop_equal_groups:
        per_round.append(informative)
    per_batch: list[Transform] = [advantages, with_closed_rows]
    if ref_model is not None:
        per_batch.append(reference)
    return per_round, per_batch


def episode_writer(path: Path) -> Any:
    """``on_episodes`` callback appending every sampled episode to ``path``, tagged with the optimizer
    step it feeds (step + 1, the number metrics.jsonl uses)."""

    def keep(step: int, episodes: list[Any]) -> None:
        if not dist.is_main():  # every rank samples the same episodes; one copy is kept
            return
        with path.open("a") as f:
            for e in episodes:
                f.write(json.dumps({"step": step + 1, **e.trajectory.model_dump(mode="json", exclude_none=True)}) + "\n")

    return keep


def _prepare(cfg: RLRunConfig, ctx: RunContext) -> Any:
    env = make_env(cfg.env.name, **cfg.env.kwargs)  # fail fast on an unknown environment (EnvError)
    if cfg.rl.train_turns != "all":
        check_retry_env(env, cfg.rl.train_turns)
    if cfg.rl.credit != "episode" and (folds(env) or cfg.rollout.mask_observations_at):
        why = "the fold environment wrapper" if folds(env) else "rollout.mask_observations_at"
        raise ConfigError(f"rl.credit: {cfg.rl.credit} with {why}: an episode then trains as several rows (each "
                          "context it sampled in), which carry the episode-level advantage only; set rl.credit: episode")
    if cfg.rl.reward is not None:
        RewardComposer(cfg.rl.reward)  # a plug-in that does not import is refused before anything is written
    if cfg.rl.turn_judge is not None and cfg.rl.turn_judge.judge.startswith("openai:"):
        endpoint_policy(cfg.rl.turn_judge.judge, cfg.rl.turn_judge.judge_model, option="rl.turn_judge.judge")
    if cfg.rl.credit == "mc_critic":
        if not env.deterministic and not env.can_snapshot():
            raise ConfigError(f"rl.credit: mc_critic returns to each episode's states by replaying its actions or by "
                              f"restoring snapshots, and environment {cfg.env.name!r} is not deterministic and has no "
                              "snapshot()/restore() (docs/envs.md, Reaching a state)")
        if not env.deterministic and cfg.rollout.ray is not None:
            raise ConfigError("rl.credit: mc_critic on an environment that is not deterministic restores snapshots, "
                              "which Ray rollout workers cannot hand back; drop rollout.ray")
    if cfg.rl.curriculum is not None:  # tasks without levels are refused before anything is written
        Curriculum(cfg.rl.curriculum, env.tasks("train", cfg.rl.n_train_tasks, seed=cfg.seed), cfg.env.name)
    server = cfg.rollout.server
    if server is None:
        return None
    client = ServerClient(server.url, server.model, server.timeout_s)
    client.check(len(ctx.tokenizer), ctx.renderer.stop_ids())  # before anything is written (ServerError)
    return client


def _mc_shaping(r: RLSpec, composer: RewardComposer | None) -> Any:
    """The training reward for MC-Critic's rollouts: reward composition, then the non-finite check,
    the termination policy and the overlong penalty, as the episodes get (not the judge: too costly,
    and not the group filter: the rollouts are not groups)."""
    # "drop" becomes "mask": a dropped rollout is no evidence, and masked rollouts leave the mean
    policy = {k: "mask" if v == "drop" else v for k, v in {**DEFAULT_TERMINATION_POLICY, **r.termination}.items()}

    def shape(step: int, episodes: list[Any]) -> None:
        if composer is not None:
            composer(step, episodes)
        tts, _ = mark_nonfinite_rewards([e.tokens for e in episodes])
        apply_termination_policy(tts, policy)  # type: ignore[arg-type]
        if r.overlong is not None:
            apply_overlong_penalty(tts, r.overlong.max_length, r.overlong.cache)

    return shape


def _episode_hooks(r: RLSpec, composer: RewardComposer | None) -> Any:
    """What sets each episode's reward and trained tokens after sampling: reward composition,
    judge-scored turns, then the turns ``rl.train_turns`` keeps."""
    hooks = ([composer] if composer is not None else []) + \
        ([TurnJudge.from_spec(r.turn_judge)] if r.turn_judge is not None else [])
    if r.train_turns != "all":
        train_turns = r.train_turns
        hooks.append(lambda step, episodes: {"first_attempt_success": first_attempt_success(episodes),
                                             **restrict_to_turns(episodes, train_turns)})
    if not hooks:
        return None

    def run(step: int, episodes: list[Any]) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for h in hooks:
            metrics.update(h(step, episodes))
        return metrics

    return run


def _build(cfg: RLRunConfig, ctx: RunContext, prepared: Any) -> Recipe:
    assert ctx.out is not None
    r = cfg.rl
    ro = cfg.rollout.to_config()
    env = make_env(cfg.env.name, **cfg.env.kwargs)
    roles = _role_setup(cfg, ctx, env)
    snapshots = r.credit == "mc_critic" and not env.deterministic
    if snapshots:  # MC-Critic returns to states by snapshot: take one before every turn
        ro = replace(ro, snapshots=True)
    temperature = ro.temperature if ro.temperature > 0 else 1.0
    ref = ctx.load_reference() if r.kl_coef > 0 and ctx.load_reference else None
    tok = ctx.tokenizer
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    per_round, per_batch = rl_transforms(
        estimator=r.estimator, termination=dict(r.termination),
        drop_equal_groups=r.drop_equal_groups or r.dynamic_sampling is not None, whitening=r.whitening,
        masked_in_baseline=r.masked_in_baseline, credit=r.credit, gamma=r.gamma,
        lam=(r.value or ValueSpec()).lam if r.credit == "gae" else (r.mc_critic or MCCriticSpec()).lam,
        value_weight=(r.mc_critic or MCCriticSpec()).value_weight if r.credit == "mc_critic" else 0.0,
        whiten_advantages=(r.value or ValueSpec()).whiten_advantages,
        step_weight=(r.gigpo or GiGPOSpec()).step_weight, anchor=(r.gigpo or GiGPOSpec()).anchor,
        overlong=(r.overlong.max_length, r.overlong.cache) if r.overlong else None,
        ref_model=ref, pad_id=pad_id, temperature=temperature, roles=roles)
    composer = RewardComposer(r.reward) if r.reward is not None else None
    critic: Any = MCCritic(r.mc_critic or MCCriticSpec(), r.gamma, cfg.rollout.env_factory(cfg.env), ro, tok,
                           ctx.renderer, cfg.seed, shape=_mc_shaping(r, composer),
                           snapshots=snapshots) if r.credit == "mc_critic" else None
    head = None
    if r.uses_value_head():  # the value head: its V_old is read before the advantages, then trained jointly
        head = ValueHead(hidden_size(ctx.model))
        estimate = ValueEstimator(head, pad_id)
        critic = estimate if critic is None else chain_critics(critic, estimate)
    tasks = env.tasks("train", r.n_train_tasks, seed=cfg.seed)
    episodes_path = ctx.out / "rollouts.jsonl"
    source = RolloutSource(tok, cfg.rollout.env_factory(cfg.env), tasks, ro, r.tasks_per_step, r.group_size,
                           per_round=per_round, per_batch=per_batch,
                           min_groups=r.tasks_per_step if r.dynamic_sampling else None,
                           max_rounds=r.dynamic_sampling.max_rounds if r.dynamic_sampling else 1,
                           seed=cfg.seed, renderer=ctx.renderer, on_episodes=episode_writer(episodes_path),
                           compose=_episode_hooks(r, composer), critic=critic,
                           curriculum=Curriculum(r.curriculum, tasks, cfg.env.name) if r.curriculum is not None else None)
    on_weights = None
    if prepared is not None:  # rollout.server: the server samples, and follows the policy after every step
        source, on_weights = _through_server(source, prepared, cfg, ctx)
    if r.async_rollouts:
        source = _one_step_ahead(source, cfg, ctx)
    surrogate = (r.clip_low, r.clip_high, r.kl_coef, r.kl_estimator, r.aggregation, r.norm_length, temperature)
    if head is None:
        objective = PolicyGradientObjective(*surrogate)
    else:
        v = r.value or ValueSpec()
        objective = ValueObjective(*surrogate, head=head, vf_coef=v.vf_coef, value_clip=v.clip)
    return Recipe(source=source, objective=objective, micro_batch_size=cfg.train.micro_batch_size,
                  epochs=r.ppo_epochs, mini_batches=r.mini_batches, step_logs=[episodes_path],
                  shown=("reward", "success"), plot=("reward.png", ("reward", "success", "loss"), "RL"),
                  on_weights=on_weights,
                  on_final=(lambda final: write_roles(final, roles)) if roles else None)


def _role_setup(cfg: RLRunConfig, ctx: RunContext, env: Any) -> dict[str, str] | None:
    """{role: adapter} for an environment with roles (empty: one shared model plays every role; None: no
    roles); with rl.role_adapters the model gets its adapters here, before the optimizer sees them."""
    env_roles = list(getattr(env, "roles", ()) or ())
    if cfg.rl.role_adapters and not env_roles:
        raise ConfigError(f"rl.role_adapters: environment {cfg.env.name!r} has no roles; wrap it: env: {{name: roles, "
                          "kwargs: {env: NAME, roles: [{name: planner, ...}, {name: executor, ...}]}}")
    if not env_roles:
        return None
    if not cfg.rl.role_adapters:
        return {}
    try:
        return add_role_adapters(ctx.model, env_roles, cfg.model.name_or_path)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _through_server(source: Any, client: Any, cfg: RLRunConfig, ctx: RunContext) -> tuple[Any, Any]:
    assert ctx.out is not None
    vocab = int(ctx.model.get_output_embeddings().weight.shape[0])
    served = int(client.info()["vocab_size"])
    if served != vocab:
        raise ServerError(f"{client.root} serves a model with {served} token ids, the trained model has {vocab}: "
                          "it is another model (start the server with the run's model)")
    ro = cfg.rollout
    source.sampler = ServerSampler(client, ro.temperature, ro.top_p, ctx.renderer.stop_ids())
    sync = WeightSync(client, ctx.out / "server" / "policy.safetensors")
    return ServerSynced(source, sync), sync.push


def _one_step_ahead(source: Any, cfg: RLRunConfig, ctx: RunContext) -> Any:
    if not (cfg.rollout.reuse_kv_cache and supports(ctx.model)):
        raise ConfigError("rl.async_rollouts needs the KV-cache sampler (rollout.reuse_kv_cache: true and a model "
                          "it serves, see docs/algorithms.md): generate()'s global random state would make the "
                          "background rollouts depend on thread timing")
    return OneStepAhead(source, cfg.train.steps)


register_algorithm(Algorithm("rl", RLRunConfig, "online multi-turn RL (GRPO, Dr. GRPO, RLOO, REINFORCE++)",
                             _prepare, _build, load_hook=load_role_adapters))
