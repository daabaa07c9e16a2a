"""The agent loop: batched multi-turn generation against environments.

A batch of episodes advances together: each round, every unfinished episode's token sequence is
left-padded and extended by HF ``generate`` (KV cache) until its end-of-turn token; the sampled
ids and their log-probabilities are recorded as they were sampled (no re-tokenization), the text
is parsed into tool calls, the environment answers, and the observation tokens are appended from
the chat-template delta. The result is the IR trajectory and its TokenTrajectory, built together.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from trajtune.chat.parsers import assistant_message, parse_tool_calls
from trajtune.chat.render import (
    PREFIX_KEY,
    SOURCE_ENV,
    SOURCE_POLICY,
    SOURCE_PROMPT,
    ChatRenderer,
    RenderError,
    TokenTrajectory,
)
from trajtune.envs.base import Environment, StepResult, Task
from trajtune.envs.runner import step_batch
from trajtune.folding import FOLD_KEY, MASKED_TEXT
from trajtune.envs.adapters.roles import ROLE_KEY
from trajtune.generation import RowCache, sampler_for
from trajtune.models.adapters import DEFAULT, activate, role_adapters
from trajtune.schema import Message, Outcome, ToolSpec, Trajectory
from trajtune.settings import setting


@dataclass
class RolloutConfig:
    """The agent loop's settings. Each field made with ``setting`` is also a ``rollout.*`` config key
    (``config.RolloutSpec`` is built from these fields: declare a setting here only)."""

    max_turns: int = setting(8, gt=0, description="assistant turns per episode at most (termination max_turns)")
    max_new_tokens: int = setting(128, gt=0, description="tokens per assistant turn at most (termination length)")
    max_length: int = setting(2048, gt=8, description="tokens per episode at most, prompt included (termination "
                                                      "context_overflow)")
    temperature: float = setting(1.0, ge=0, description="sampling temperature; 0: greedy")
    top_p: float = setting(1.0, gt=0, le=1, description="nucleus sampling mass")
    parser: str = setting("auto", description="tool-call parser; auto: the one matching the render tool format")
    batch_size: int = setting(32, gt=0, description="episodes generated together; a finished one is replaced at "
                                                    "once")
    step_timeout_s: float = setting(30.0, gt=0, description="an environment step taking longer ends the episode "
                                                            "(termination timeout)")
    reuse_kv_cache: bool = setting(True, description="keep each episode's KV cache across turns (encode only the "
                                                     "new tokens); false, or a model it cannot serve: generate() "
                                                     "per turn")
    share_prompt_cache: bool = setting(True, description="decode the samples of one prompt (a GRPO group's first "
                                                         "turn) against one copy of its KV cache, read once per "
                                                         "step for all of them (cascade attention); false: each "
                                                         "sample attends to its own copy (the same attention up "
                                                         "to float rounding)")
    mask_observations_at: int = setting(0, ge=0, description="observation masking (a baseline for context folding): "
                                                           "when the active context passes this many tokens, every "
                                                           "tool result but the latest is replaced by a placeholder "
                                                           "and the context re-encoded; what was sampled before "
                                                           "trains as its own row; 0: off")
    snapshots: bool = False  # keep env.snapshot() (and the tools) before each turn: Episode.snapshots (not a config key)


@dataclass
class Episode:
    trajectory: Trajectory
    tokens: TokenTrajectory
    format_errors: int = 0
    turns: int = 0
    task: Task | None = None
    #: (env.snapshot(), tools) before each of the policy's turns, with RolloutConfig.snapshots (in memory only)
    snapshots: list[Any] = field(default_factory=list)
    #: the contexts that left the active one (a returned branch, a context before observation
    #: masking), each its own training row, in the order they closed; ``tokens`` is the last context
    rows: list[TokenTrajectory] = field(default_factory=list)


@dataclass
class _Branch:
    """An open branch: where the main context stood when it began."""

    k: int  # the branch's number in the episode
    ids_at: int  # tokens of the main context (the branch call included)
    messages_at: int  # messages of the main context (the branch call included)
    call_id: str
    name: str


@dataclass
class _Live:
    env: Environment
    task: Task
    messages: list[Message]
    tools: list[ToolSpec]
    ids: list[int] = field(default_factory=list)
    source: list[int] = field(default_factory=list)
    turn: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    reward: float = 0.0
    turns: int = 0
    format_errors: int = 0
    termination: str | None = None
    taken_ids: set[str] = field(default_factory=set)
    error: str | None = None
    reward_info: dict[str, float] = field(default_factory=dict)  # info["reward_terms"], summed over steps
    feedback: str | None = None  # the verifier's summary, a step's info["feedback"] (FAFT)
    snapshots: list[Any] = field(default_factory=list)  # (env.snapshot(), tools) before each own turn
    cache: Any = None  # what the sampler keeps of ids[:cache.n]: a RowCache, or a server's remote.Sent
    index: int = 0  # the task's position in the run_rollouts call (where its episode goes)
    log: list[Message] = field(default_factory=list)  # every message, folded or masked ones too (the record)
    branch: _Branch | None = None  # the open branch of a folding environment (envs/adapters/fold.py)
    folds: int = 0  # branches opened
    fold_errors: int = 0  # branch / return calls the environment refused
    rows: list[TokenTrajectory] = field(default_factory=list)  # closed contexts (Episode.rows)
    peak: int = 0  # the longest active context, in tokens
    acting: str | None = None  # the role acting in the turn being generated (envs with roles)
    turn_roles: list[str] = field(default_factory=list)  # the role of each of the policy's own turns
    role_caches: dict[str, Any] = field(default_factory=dict)  # per role: the cache under its own adapter
    role_rewards: dict[str, float] = field(default_factory=dict)  # info["role_rewards"], summed over steps

    def extend(self, ids: list[int], src: int, logprobs: list[float] | None = None) -> None:
        self.ids += ids
        self.source += [src] * len(ids)
        self.turn += [self.turns] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)
        self.peak = max(self.peak, len(self.ids))

    def add(self, msgs: list[Message]) -> None:
        """Messages join the active context and the record; inside a branch they carry its mark."""
        for m in msgs:
            if self.branch is not None:
                m.extra[FOLD_KEY] = {"branch": self.branch.k}
            self.messages.append(m)
            self.log.append(m)

    def close_row(self, trained_from: int) -> None:
        """The active context as it is becomes a training row of its own; its policy tokens before
        ``trained_from`` train in another row (the main context's), so they weigh 0 here."""
        self.rows.append(TokenTrajectory(
            ids=list(self.ids), source=list(self.source), turn=list(self.turn),
            weight=[1.0 if s == SOURCE_POLICY and i >= trained_from else 0.0 for i, s in enumerate(self.source)],
            logprobs=list(self.logprobs), traj_id=self.task.id))

    def truncate(self, n: int) -> None:
        del self.ids[n:], self.source[n:], self.turn[n:], self.logprobs[n:]


def _round_seed(seed: int, *parts: Any) -> int:
    h = hashlib.sha256(repr((seed,) + parts).encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


def default_step(envs: Sequence[Environment], actions: Sequence[Message], timeout_s: float) -> list[StepResult]:
    """Step each environment through the runner: tool failures and hangs become observations, never crashes."""
    return step_batch(list(envs), list(actions), timeout_s=timeout_s)


@torch.no_grad()
def _generate(model: Any, tok: Any, seqs: list[list[int]], max_new: list[int], cfg: RolloutConfig,
              eot_ids: list[int], seed: int) -> list[tuple[list[int], list[float], bool]]:
    """Continue each sequence; returns (new ids, their log-probs, ended with end-of-turn) per row.

    ``eot_ids`` are the tokens that close a turn (an answer and a tool call may close differently)."""
    device = next(model.parameters()).device
    eot_id = eot_ids[0]
    stops = set(eot_ids)
    width = max(len(s) for s in seqs)
    pad = tok.pad_token_id if tok.pad_token_id is not None else eot_id
    input_ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    for r, s in enumerate(seqs):
        input_ids[r, width - len(s):] = torch.tensor(s, dtype=torch.long)
        attn[r, width - len(s):] = 1
    greedy = cfg.temperature <= 0
    gen_kwargs: dict[str, Any] = dict(
        max_new_tokens=max(max_new), do_sample=not greedy, eos_token_id=list(eot_ids), pad_token_id=pad,
        return_dict_in_generate=True, output_logits=True, use_cache=True,
    )
    if not greedy:
        gen_kwargs.update(temperature=cfg.temperature, top_p=cfg.top_p, top_k=0)
    torch.manual_seed(seed)
    out = model.generate(input_ids=input_ids.to(device), attention_mask=attn.to(device), **gen_kwargs)
    new = out.sequences[:, width:].cpu()
    # Raw logits of every generated position; log-probs at the sampling temperature (no top-p), the
    # same quantity the policy-gradient objective recomputes.
    logits = torch.stack(out.logits, dim=1).float().cpu()
    temp = cfg.temperature if not greedy else 1.0
    logp = torch.log_softmax(logits / temp, dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
    results = []
    for r in range(len(seqs)):
        ids: list[int] = []
        lps: list[float] = []
        ended = False
        for j in range(min(new.shape[1], max_new[r])):
            t = int(new[r, j])
            ids.append(t)
            lps.append(float(logp[r, j]))
            if t in stops:
                ended = True
                break
        results.append((ids, lps, ended))
    return results


def run_rollouts(
    model: Any,
    tokenizer: Any,
    env_factory: Callable[[], Environment],
    tasks: Sequence[Task],
    config: RolloutConfig,
    *,
    seed: int = 0,
    renderer: ChatRenderer | None = None,
    step_fn: Callable[[Sequence[Environment], Sequence[Message], float], list[StepResult]] | None = None,
    progress: Callable[[int], None] | None = None,
    prefixes: Sequence[list[Message]] | None = None,
    sampler: Any = None,
) -> list[Episode]:
    """Roll out ``model`` on every task, at most ``config.batch_size`` episodes at a time: when one
    ends, the next task takes its place (so one long episode does not hold up a whole batch).

    ``prefixes`` (one per task) start each episode from a state: a ``StartState`` is restored from its
    snapshot; a list of messages has its assistant actions replayed through the environment after
    reset (``Environment.reach``). Either way the history is
    prompt-source tokens (the policy did not sample it: no loss, no log-probs), rewards earned in
    the prefix are not the episode's, and ``max_turns`` counts the policy's own turns only.

    ``sampler`` replaces the local one: anything with ``CachedSampler.turn``'s signature, e.g. a
    generation server's (``remote.ServerSampler``); the ids and log-probs it returns are stored as they are."""
    if prefixes is not None and len(prefixes) != len(tasks):
        raise ValueError(f"{len(prefixes)} prefixes for {len(tasks)} tasks")
    renderer = renderer or ChatRenderer(tokenizer)
    step_fn = step_fn or default_step
    eot_ids = renderer.stop_ids()
    if config.parser == "auto":
        config = RolloutConfig(**{**config.__dict__, "parser": renderer.parser or "hermes"})
    was_training = model.training
    model.eval()
    try:
        return _run_all(model, tokenizer, renderer, env_factory, list(tasks), config, seed, eot_ids, step_fn,
                        list(prefixes) if prefixes is not None else None, progress, sampler)
    finally:
        model.train(was_training)


@dataclass
class StartState:
    """Where an episode starts when its state is restored, not replayed: ``env.snapshot()``, the
    conversation so far and the tools on offer (``Episode.snapshots`` holds them per turn)."""

    snapshot: Any
    messages: list[Message]
    tools: list[ToolSpec]


def _start(renderer: ChatRenderer, env_factory: Callable[[], Environment], task: Task, index: int,
           cfg: RolloutConfig, prefix: "list[Message] | StartState | None") -> _Live:
    env = env_factory()
    ended = False
    if isinstance(prefix, StartState):
        env.restore(prefix.snapshot)
        messages, tools = list(prefix.messages), list(prefix.tools)
    elif prefix:
        messages, tools, ended = env.reach(task, prefix)
    else:
        res = env.reset(task)
        messages, tools = list(res.messages), list(res.tools)
    ep = _Live(env=env, task=task, messages=messages, tools=tools, index=index, log=list(messages))
    ep.extend(renderer.prompt_ids(ep.messages, ep.tools), SOURCE_PROMPT)  # with render.assistant_prefix
    if ended:
        ep.termination = "done"
    elif len(ep.ids) >= cfg.max_length:
        ep.termination = "context_overflow"
    elif cfg.snapshots:
        ep.snapshots.append((env.snapshot(), list(ep.tools)))
    return ep


def _inject_prefix(renderer: ChatRenderer, ep: _Live) -> None:
    """Append the render option ``assistant_prefix`` after the generation prompt: the model continues
    from it. Prompt tokens (no loss, no log-probs), encoded on their own as the renderer's segment is."""
    guard = renderer.config.assistant_prefix
    if guard:
        ep.extend(renderer.encode(guard), SOURCE_PROMPT)


def _run_all(model: Any, tok: Any, renderer: ChatRenderer, env_factory: Callable[[], Environment],
             tasks: list[Task], cfg: RolloutConfig, seed: int, eot_ids: list[int],
             step_fn: Callable[..., list[StepResult]], prefixes: list[list[Message]] | None,
             progress: Callable[[int], None] | None, sampler: Any = None) -> list[Episode]:
    """Step every task's episode to its end, ``cfg.batch_size`` at a time: each round, finished
    episodes leave and new ones take their places, every live episode generates one turn, and those
    whose turn ended with a call are stepped in their environments together. (The token-level loop:
    ``envs.runner.run_episodes`` is the message-level one, for policies that return only messages.)"""
    results: list[Episode | None] = [None] * len(tasks)
    live: list[_Live] = []
    next_i = 0
    round_no = 0
    if sampler is None:  # the model's own sampler, else the cached one, else None: generate() below
        sampler = sampler_for(model, tok, temperature=cfg.temperature, top_p=cfg.top_p, stop_ids=eot_ids,
                              reuse_cache=cfg.reuse_kv_cache, share_prompt=cfg.share_prompt_cache)
    while True:
        live = _retire_finished(live, results, progress)
        while len(live) < cfg.batch_size and next_i < len(tasks):  # refill the free places
            live.append(_start(renderer, env_factory, tasks[next_i], next_i, cfg,
                               prefixes[next_i] if prefixes is not None else None))
            next_i += 1
        if not live:
            break
        if any(e.termination is not None for e in live):  # ended before acting (a replayed prefix, too long)
            continue
        gens = _generate_turn(model, tok, sampler, live, cfg, eot_ids, _round_seed(seed, 0, round_no))
        round_no += 1
        stepping: list[tuple[_Live, Message]] = []
        for e, gen in zip(live, gens):
            msg = _record_turn(tok, renderer, cfg, e, gen)
            if msg is not None:
                stepping.append((e, msg))
        if not stepping:
            continue
        stepped = step_fn([e.env for e, _ in stepping], [m for _, m in stepping], cfg.step_timeout_s)
        for (e, msg), res in zip(stepping, stepped):
            _take_step(renderer, cfg, e, msg, res)
    assert all(r is not None for r in results)
    return results  # type: ignore[return-value]


def _retire_finished(live: list[_Live], results: list[Episode | None],
                     progress: Callable[[int], None] | None) -> list[_Live]:
    """Move finished episodes into ``results`` (at their task's index) and return the live ones."""
    for e in live:
        if e.termination is not None:
            e.cache = None  # a finished episode's keys and values are not needed again
            results[e.index] = _finish(e)
            if progress:
                progress(1)
    return [e for e in live if e.termination is None]


def _generate_turn(model: Any, tok: Any, sampler: Any, active: list[_Live], cfg: RolloutConfig,
                   eot_ids: list[int], round_seed: int) -> list[tuple[list[int], list[float], bool]]:
    """One assistant turn for every live episode: (ids, log-probs, ended at end-of-turn). A sampler
    continues each episode's KV cache from its new tokens; without one, ``generate()`` re-encodes."""
    room = [min(cfg.max_new_tokens, cfg.max_length - len(e.ids)) for e in active]
    roles = [e.env.acting_role() if hasattr(e.env, "acting_role") else None for e in active]
    if any(r is not None for r in roles):
        return _generate_by_role(model, tok, sampler, active, roles, room, cfg, eot_ids, round_seed)
    return _sample(model, tok, sampler, active, room, cfg, eot_ids, round_seed, None)


def _sample(model: Any, tok: Any, sampler: Any, rows: list[_Live], room: list[int], cfg: RolloutConfig,
            eot_ids: list[int], seed: int, role: str | None) -> list[tuple[list[int], list[float], bool]]:
    """One turn for ``rows``: through the sampler, continuing each row's KV cache (the episode's own,
    or with ``role`` that role's), or, without a sampler, ``generate()`` over the whole context."""
    if sampler is None:
        return _generate(model, tok, [e.ids for e in rows], room, cfg, eot_ids, seed)
    caches = [e.cache if role is None else e.role_caches.get(role) for e in rows]
    outs = sampler.turn([(c, e.ids[c.n if c else 0:]) for e, c in zip(rows, caches)], room, seed)
    gens = []
    for e, (ids, lps, ended, cache) in zip(rows, outs):
        if role is None:
            e.cache = cache
        else:
            e.role_caches[role] = cache
        gens.append((ids, lps, ended))
    return gens


def _generate_by_role(model: Any, tok: Any, sampler: Any, active: list[_Live], roles: list[str | None],
                      room: list[int], cfg: RolloutConfig, eot_ids: list[int],
                      round_seed: int) -> list[tuple[list[int], list[float], bool]]:
    """One turn of every live episode of an environment with roles: the rows of each role together,
    with that role's LoRA adapter active when the model has one per role (``rl.role_adapters``). Each
    episode keeps a KV cache per role (keys and values computed under one adapter are not valid under
    another), so a role encodes only what was said since its own last turn."""
    adapters = role_adapters(model)
    if cfg.mask_observations_at:
        raise ValueError("rollout.mask_observations_at is not supported with several roles per episode: masking "
                         "re-encodes the context, which the per-role KV caches would not follow")
    gens: list[tuple[list[int], list[float], bool] | None] = [None] * len(active)
    try:
        for k, role in enumerate(dict.fromkeys(roles)):
            rows = [i for i, r in enumerate(roles) if r == role]
            if adapters:
                if role not in adapters:
                    raise ValueError(f"the model has no adapter for role {role!r} (its roles: {', '.join(adapters)})")
                activate(model, adapters[role])
            outs = _sample(model, tok, sampler, [active[i] for i in rows], [room[i] for i in rows], cfg, eot_ids,
                           _round_seed(round_seed, k), role or "")
            for i, out in zip(rows, outs):
                gens[i] = out
                active[i].acting = role
    finally:
        if adapters:
            activate(model, DEFAULT)
    return gens  # type: ignore[return-value]


def _record_turn(tok: Any, renderer: ChatRenderer, cfg: RolloutConfig, e: _Live,
                 gen: tuple[list[int], list[float], bool]) -> Message | None:
    """Append the sampled tokens as they were sampled and the parsed assistant message. Returns the
    message when the turn ended at end-of-turn (its calls go to the environment); a turn cut off by a
    token limit ends the episode instead."""
    ids, lps, ended = gen
    e.extend(ids, SOURCE_POLICY, lps)
    text = tok.decode(ids[:-1] if ended else ids, skip_special_tokens=False)
    parsed = parse_tool_calls(text, cfg.parser, taken_ids=e.taken_ids)
    e.format_errors += len(parsed.errors)
    msg = assistant_message(parsed.content, parsed.tool_calls, parsed.errors, text)
    if renderer.config.assistant_prefix:  # recorded, so re-rendering masks it whatever the config says
        msg.extra[PREFIX_KEY] = renderer.config.assistant_prefix
    if e.acting is not None:  # who wrote this turn, in an episode with roles
        msg.extra[ROLE_KEY] = e.acting
        e.turn_roles.append(e.acting)
        e.acting = None
    e.add([msg])
    e.turns += 1
    if not ended:
        e.termination = "length" if len(e.ids) < cfg.max_length else "context_overflow"
        return None
    return msg


def _take_step(renderer: ChatRenderer, cfg: RolloutConfig, e: _Live, msg: Message, res: StepResult) -> None:
    """Apply the environment's answer to a turn: its reward, then either the episode's end or the
    observation tokens (from the chat-template delta) and the next generation prompt. A branch that
    returns folds first (``_fold``)."""
    _record_reward(e, msg, res)
    event = _fold_event(e, res)
    if event == "branch":  # the branch call stays in the main context; what follows is the branch's
        call = (msg.tool_calls or [None])[0]
        e.branch = _Branch(k=e.folds, ids_at=len(e.ids), messages_at=len(e.messages),
                           call_id=call.id if call else "", name=call.name if call else "branch")
        e.folds += 1
    if event == "return":
        obs = [_fold(e, res)]
    else:
        obs = list(res.observations)
    e.add(obs)
    if res.termination and res.termination != "done":
        e.termination = res.termination
        e.error = str(res.info.get("error")) if res.info.get("error") else None
        return
    if res.done:
        e.termination = "done"
        return
    if e.turns >= cfg.max_turns:
        e.termination = "max_turns"
        return
    n_prev = len(e.messages) - len(obs)
    try:
        obs_ids = renderer.encode(renderer.observation_text(e.messages, e.tools, n_prev))
    except RenderError as err:
        e.termination, e.error = "env_error", str(err)
        return
    e.extend(obs_ids, SOURCE_ENV)
    _inject_prefix(renderer, e)
    if cfg.mask_observations_at and len(e.ids) > cfg.mask_observations_at and e.branch is None:
        try:
            _mask_observations(renderer, e, n_prev)
        except RenderError as err:
            e.termination, e.error = "env_error", str(err)
            return
    if cfg.snapshots:
        e.snapshots.append((e.env.snapshot(), list(e.tools)))
    if len(e.ids) >= cfg.max_length:
        e.termination = "context_overflow"


def _fold_event(e: _Live, res: StepResult) -> str | None:
    """``branch`` or ``return`` when a folding environment reports one (``info["fold"]``) that applies."""
    if res.info.get("fold_error"):
        e.fold_errors += 1
    fold = res.info.get("fold")
    event = fold.get("event") if isinstance(fold, dict) else None
    if event == "branch" and e.branch is None:
        return "branch"
    if event == "return" and e.branch is not None:
        return "return"
    return None


def _fold(e: _Live, res: StepResult) -> Message:
    """Close the branch: its context (up to the ``return`` call) becomes a training row, the active
    context goes back to the branch point (the KV cache too, without recomputing it), and the
    environment's answer to ``return`` (the summary) answers the branch call instead. Returns that
    summary message."""
    b = e.branch
    assert b is not None
    if e.role_caches:
        raise ValueError("folding (branch/return) is not supported with several roles per episode: the context "
                         "rolls back, which the per-role KV caches would not follow")
    e.close_row(trained_from=b.ids_at)
    e.truncate(b.ids_at)
    del e.messages[b.messages_at:]
    e.cache = _rolled_back(e.cache, b.ids_at)
    e.branch = None
    first = res.observations[0] if res.observations else Message(role="user", content="")
    answer = {"tool_call_id": b.call_id, "name": b.name} if first.role == "tool" else {}
    return first.model_copy(update={**answer, "extra": {**first.extra, FOLD_KEY: {"summary": b.k}}})


def _rolled_back(cache: Any, n: int) -> Any:
    """The first ``n`` tokens' keys and values (views: nothing is recomputed or copied); None (the
    next turn encodes the context afresh) for a cache that cannot be cut, such as a server's."""
    if isinstance(cache, RowCache) and cache.n >= n:
        return RowCache([(k[:, :, :n], v[:, :, :n]) for k, v in cache.layers], n)
    return None


def _mask_observations(renderer: ChatRenderer, e: _Live, n_latest: int) -> None:
    """The observation-masking baseline: every tool result before the latest step's becomes
    ``MASKED_TEXT``; the context so far closes as a training row, and the masked one, re-encoded,
    goes on as prompt tokens (the model did not sample its turns in this context)."""
    masked = [m.model_copy(update={"content": MASKED_TEXT}) if m.role == "tool" and i < n_latest
              and m.content != MASKED_TEXT else m for i, m in enumerate(e.messages)]
    if all(a is b for a, b in zip(masked, e.messages)):
        return
    prompt = renderer.prompt_ids(masked, e.tools)
    e.close_row(trained_from=0)
    e.messages = masked
    e.truncate(0)
    e.cache = None
    e.extend(prompt, SOURCE_PROMPT)
    _inject_prefix(renderer, e)


def _record_reward(e: _Live, msg: Message, res: StepResult) -> None:
    """What a step reports besides observations: the reward (on the episode and on the assistant
    message that earned it), feedback, named reward terms, and a changed tool list."""
    e.reward += float(res.reward)
    msg.reward = float(res.reward)  # a turn's reward sits on the assistant message that earned it
    if isinstance(res.info.get("feedback"), str):
        e.feedback = res.info["feedback"]
    terms = res.info.get("reward_terms")
    if isinstance(terms, dict):  # named reward terms an environment reports (rl.reward: info.NAME)
        for k, v in terms.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                e.reward_info[str(k)] = e.reward_info.get(str(k), 0.0) + float(v)
    if isinstance(res.info.get("tools"), list) and res.info["tools"]:
        e.tools = [t if isinstance(t, ToolSpec) else ToolSpec.model_validate(t) for t in res.info["tools"]]
    if isinstance(res.info.get("role_rewards"), dict):  # per-role rewards of an environment with roles
        for k, v in res.info["role_rewards"].items():
            e.role_rewards[str(k)] = e.role_rewards.get(str(k), 0.0) + float(v)


def _own_turn_rewards(e: _Live) -> list[float]:
    rewards = [float(m.reward or 0.0) for m in e.log if m.role == "assistant"]
    return rewards[len(rewards) - e.turns:] if e.turns else []


def _finish(e: _Live) -> Episode:
    success = bool(e.env.success()) if e.termination == "done" else False
    final = next((m.text() for m in reversed(e.log) if m.role == "assistant" and not m.tool_calls), None)
    fold: dict[str, Any] = {}
    if e.folds or e.fold_errors or e.rows or getattr(e.env, "folds_context", False):
        fold = {"folds": e.folds, "fold_errors": e.fold_errors, "rows": len(e.rows) + 1,
                **({"unreturned_branch": True} if e.branch is not None else {})}
    traj = Trajectory(
        id=e.task.id,
        messages=e.log,
        tools=e.tools,
        reward=e.reward,
        outcome=Outcome(success=success, final_answer=final, termination=e.termination),
        metadata={"env": e.env.name, "seed": e.task.seed, "split": e.task.split, "turns": e.turns,
                  "format_errors": e.format_errors, **({"error": e.error} if e.error else {}),
                  **({"reward_info": e.reward_info} if e.reward_info else {}),
                  **({"feedback": e.feedback} if e.feedback is not None else {}),
                  "peak_context": e.peak, **fold},
    )
    tt = TokenTrajectory(
        ids=e.ids, source=e.source, turn=e.turn,
        weight=[1.0 if s == SOURCE_POLICY else 0.0 for s in e.source],
        logprobs=e.logprobs, traj_id=e.task.id, reward=e.reward, success=success, termination=e.termination,
        meta={"format_errors": e.format_errors, "turns": e.turns,
              # the reward of each of the policy's own turns (not a replayed prefix's), in turn order
              "turn_rewards": _own_turn_rewards(e),
              # the role of each of the policy's own turns, and per-role rewards (environments with roles)
              **({"turn_roles": list(e.turn_roles)} if e.turn_roles else {}),
              **({"role_rewards": dict(e.role_rewards)} if e.role_rewards else {})},
    )
    tt.check()
    for r in e.rows:  # a closed context ends as its episode did
        r.reward, r.success, r.termination = e.reward, success, e.termination
        r.meta = {"turns": e.turns, "closed_row": True}
        r.check()
    if any(math.isnan(x) for x in e.logprobs) or any(math.isnan(x) for r in e.rows for x in r.logprobs or []):
        raise FloatingPointError("NaN log-probability during rollout")
    return Episode(trajectory=traj, tokens=tt, format_errors=e.format_errors, turns=e.turns, task=e.task,
                   snapshots=e.snapshots, rows=e.rows)
