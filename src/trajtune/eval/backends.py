"""How the evaluated model produces text: an HF model (batched, token-level) or any text function.

The harness needs two things from a model:

- ``rollout(env_factory, tasks, max_turns, seed)``: multi-turn episodes against environments;
- ``complete(prompts, seed)``: one assistant answer per (messages, tools) prompt, for
  single-turn benchmarks (BFCL's AST categories).

``HFBackend`` uses ``trajtune.rollout.run_rollouts`` (KV-cached batched ``generate``, the exact
loop RL trains with) and a batched prompt→completion call rendered with the model's own chat
template. ``TextBackend`` wraps a plain ``generate_fn(messages, tools) -> str`` (a test double, a
server client) and drives environments with the message-level loop of ``trajtune.envs.runner``.
Both parse text with the same registered tool-call parser. ``trajtune.rollout`` and
``trajtune.generation`` are imported inside ``HFBackend`` only: they import torch, which a
``TextBackend`` (an endpoint, a test double) never needs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from trajtune.chat.parsers import assistant_message, parse_tool_calls
from trajtune.chat.render import ChatRenderer
from trajtune.envs.base import Environment, Task
from trajtune.envs.runner import run_episodes, step_batch
from trajtune.schema import Message, Outcome, ToolSpec, Trajectory

Prompt = tuple[list[Message], list[ToolSpec]]
GenerateFn = Callable[[list[Message], list[ToolSpec]], str]


class Backend(Protocol):
    name: str

    def rollout(self, env_factory: Callable[[], Environment], tasks: Sequence[Task], *, max_turns: int,
                seed: int) -> list[Trajectory]: ...

    def complete(self, prompts: Sequence[Prompt], *, seed: int) -> list[str | None]:
        """Text per prompt; ``None`` when the prompt alone does not fit the context."""
        ...


class HFBackend:
    """A loaded HF causal LM + tokenizer. ``temperature == 0`` is greedy decoding."""

    name = "hf"

    def __init__(self, model: Any, tokenizer: Any, *, temperature: float = 0.0, top_p: float = 1.0,
                 max_new_tokens: int = 256, max_length: int = 4096, batch_size: int = 16, parser: str = "hermes",
                 workers: int = 8, step_timeout_s: float = 30.0, renderer: Any = None, mask_observations_at: int = 0):
        self.model, self.tok = model, tokenizer
        self.mask_observations_at = mask_observations_at
        self.renderer = renderer or ChatRenderer(tokenizer)
        self.temperature, self.top_p = temperature, top_p
        self.max_new_tokens, self.max_length, self.batch_size = max_new_tokens, max_length, batch_size
        self.parser, self.workers, self.step_timeout_s = parser, workers, step_timeout_s

    def _config(self, max_turns: int) -> Any:
        # lazy: imports torch; eval.harness (settings and suites, used by the CLI) imports this module
        from trajtune.rollout import RolloutConfig

        return RolloutConfig(max_turns=max_turns, max_new_tokens=self.max_new_tokens, max_length=self.max_length,
                             temperature=self.temperature, top_p=self.top_p, parser=self.parser,
                             batch_size=self.batch_size, step_timeout_s=self.step_timeout_s,
                             mask_observations_at=self.mask_observations_at)

    def rollout(self, env_factory: Callable[[], Environment], tasks: Sequence[Task], *, max_turns: int,
                seed: int) -> list[Trajectory]:
        # lazy: imports torch; eval.harness (settings and suites, used by the CLI) imports this module
        from trajtune.rollout import run_rollouts

        workers = self.workers

        def step_fn(envs: Sequence[Environment], acts: Sequence[Message], t: float) -> list[Any]:
            return step_batch(list(envs), list(acts), timeout_s=t, max_workers=workers)

        eps = run_rollouts(self.model, self.tok, env_factory, list(tasks), self._config(max_turns), seed=seed,
                           renderer=self.renderer, step_fn=step_fn)
        return [e.trajectory for e in eps]

    def complete(self, prompts: Sequence[Prompt], *, seed: int) -> list[str | None]:
        import torch

        # lazy: imports torch; eval.harness (settings and suites, used by the CLI) imports this module
        from trajtune.generation import sampler_for
        from trajtune.rollout import _generate  # the rollout's own sampler: same decoding as RL

        eot = self.renderer.stop_ids()
        cfg = self._config(1)
        # a sampler the model carries (a DualTune model decodes in two stages), else generate()
        own = sampler_for(self.model, self.tok, temperature=cfg.temperature, top_p=cfg.top_p, stop_ids=eot,
                          reuse_cache=False)
        out: list[str | None] = [None] * len(prompts)
        seqs = [self.renderer.prompt_ids(m, t) for m, t in prompts]  # with render.assistant_prefix
        fits = [i for i, s in enumerate(seqs) if len(s) < self.max_length]
        was_training = self.model.training
        self.model.eval()
        try:
            for b0 in range(0, len(fits), self.batch_size):
                rows = fits[b0:b0 + self.batch_size]
                room = [min(self.max_new_tokens, self.max_length - len(seqs[i])) for i in rows]
                with torch.no_grad():
                    if own is not None:
                        gens = [g[:3] for g in own.turn([(None, seqs[i]) for i in rows], room, seed + b0)]
                    else:
                        gens = _generate(self.model, self.tok, [seqs[i] for i in rows], room, cfg, eot, seed + b0)
                for i, (ids, _lps, ended) in zip(rows, gens):
                    out[i] = self.tok.decode(ids[:-1] if ended else ids, skip_special_tokens=False)
        finally:
            self.model.train(was_training)
        return out


class _TextPolicy:
    """A ``generate_fn`` as a message-level policy: text -> parsed assistant message."""

    def __init__(self, generate_fn: GenerateFn, parser: str):
        self.generate_fn, self.parser = generate_fn, parser
        self.name = getattr(generate_fn, "__name__", "generate_fn")

    def __call__(self, messages: list[Message], tools: list[ToolSpec]) -> Message:
        return text_to_message(self.generate_fn(messages, tools), self.parser)


def text_to_message(text: str, parser: str) -> Message:
    """Model text -> assistant message; parse errors recorded in ``extra`` (as the rollout does)."""
    p = parse_tool_calls(text, parser)
    return assistant_message(p.content, p.tool_calls, p.errors, text)


class TextBackend:
    """Any ``generate_fn(messages, tools) -> str``; environments stepped ``workers`` at a time."""

    name = "text"

    def __init__(self, generate_fn: GenerateFn, *, parser: str = "hermes", workers: int = 8,
                 step_timeout_s: float = 30.0):
        self.generate_fn, self.parser, self.workers, self.step_timeout_s = generate_fn, parser, workers, step_timeout_s

    def rollout(self, env_factory: Callable[[], Environment], tasks: Sequence[Task], *, max_turns: int,
                seed: int) -> list[Trajectory]:
        trajs = run_episodes(env_factory, list(tasks), _TextPolicy(self.generate_fn, self.parser),
                             max_turns=max_turns, timeout_s=self.step_timeout_s, max_workers=self.workers)
        for t, task in zip(trajs, tasks):
            t.id = task.id
            if t.outcome is None:
                t.outcome = Outcome(success=False)
            if t.outcome.termination != "done":
                t.outcome.success = False  # as the token-level rollout: only a finished episode can succeed
        return trajs

    def complete(self, prompts: Sequence[Prompt], *, seed: int) -> list[str | None]:
        return [self.generate_fn(list(m), list(t)) for m, t in prompts]


def message_as_hermes(msg: Message) -> str:
    """An assistant message as Hermes text (its text, then one ``<tool_call>`` block per call), so an
    endpoint's structured answer goes through the same parser and metrics as a local model's text."""
    import json

    parts = [msg.text() or ""]
    for c in msg.tool_calls or []:
        args: Any = c.arguments if c.arguments is not None else (c.arguments_raw or {})
        parts.append("<tool_call>\n" + json.dumps({"name": c.name, "arguments": args}, ensure_ascii=False)
                     + "\n</tool_call>")
    return "\n".join(p for p in parts if p)


def endpoint_backend(policy: Callable[[list[Message], list[ToolSpec]], Message], *, workers: int = 8,
                     step_timeout_s: float = 30.0) -> "TextBackend":
    """Evaluate an OpenAI-compatible endpoint (``OpenAIChatPolicy``): its answers as Hermes text."""
    backend = TextBackend(lambda messages, tools: message_as_hermes(policy(messages, tools)), parser="hermes",
                          workers=workers, step_timeout_s=step_timeout_s)
    backend.name = getattr(policy, "name", "endpoint")
    return backend
