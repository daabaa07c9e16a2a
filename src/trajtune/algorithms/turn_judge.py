"""Judge-scored turns (``rl.turn_judge``; TARL): an LLM grades every agent turn −1 / 0 / +1.

Why: an outcome reward says whether the episode worked, not which turn helped. A judge that reads
the transcript can say that turn 2 made progress and turn 3 repeated a failed call. Its scores are
added to the per-turn rewards with a coefficient c:

- with ``rl.credit: episode`` the episode's reward becomes R = outcome + c · Σ_k s_k (docs/algorithms.md,
  turn-level credit (a));
- with ``rl.credit: turn`` turn k's reward gets + c · s_k, and its return and advantage follow
  (turn-level credit (b)).

The judge is any OpenAI-compatible endpoint (``openai:URL``) or a local model, through the same code
as ``eval --judge``. A reply that is not a list of −1/0/+1 with one score per turn, or a request that
fails, is "no score": the episode keeps its environment rewards, and ``turn_judge_failures`` counts
it. It never stops the run.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import Field

from trajtune.algorithms.critical_steps import numbered_transcript
from trajtune.config import _C
from trajtune.judge import _json_objects, ask, make_judge
from trajtune.schema import Message

PROMPT = """\
You grade each turn of an AI agent that solves a task with tools. For every agent turn, in order,
give one score:
 +1  the turn makes progress toward the task (a needed call with the right arguments, a correct
     reading of a result, a correct final answer);
  0  neutral (harmless but not needed);
 -1  a mistake (a wrong or malformed call, ignoring an error, a repeated failed action, a wrong or
     unsupported answer).
Reply with only a JSON object: {"scores": [one number per agent turn]}"""


class TurnJudgeSpec(_C):
    judge: str = Field(description="openai:URL (an OpenAI-compatible endpoint) or a local model (alias, path)")
    judge_model: str = Field("default", description="with an openai: judge: the model name sent to the endpoint")
    coef: float = Field(0.1, gt=0, description="c: each turn's reward gets + c · score (score in −1, 0, +1)")
    max_tokens: int = Field(128, gt=0, description="tokens the judge may answer with")
    workers: int = Field(4, gt=0, description="judge requests in flight at once")


def parse_scores(text: str, n_turns: int) -> list[int]:
    """One −1/0/+1 per turn from ``{"scores": [...]}``; ValueError when the reply cannot be used."""
    for obj in _json_objects(text or ""):
        if isinstance(obj, dict) and "scores" in obj:
            s = obj["scores"]
            if isinstance(s, list) and len(s) == n_turns and \
                    all(isinstance(x, int) and not isinstance(x, bool) and x in (-1, 0, 1) for x in s):
                return list(s)
            raise ValueError(f"\"scores\" must hold {n_turns} numbers in -1, 0, 1: {s!r}"[:200])
    raise ValueError(f"no {{\"scores\": [...]}} in the reply: {(text or '')[:120]!r}")


class TurnJudge:
    """Adds c · s_k to each episode's turn rewards (an ``RolloutSource`` episode hook)."""

    def __init__(self, spec: TurnJudgeSpec, complete: Callable[[dict[str, Any]], dict[str, Any]], model: str):
        self.spec, self.complete, self.model = spec, complete, model

    @classmethod
    def from_spec(cls, spec: TurnJudgeSpec) -> "TurnJudge":
        judge = make_judge(spec.judge, model=spec.judge_model, max_tokens=spec.max_tokens, workers=spec.workers)
        return cls(spec, judge.complete, judge.model)

    def scores(self, episode: Any) -> list[int]:
        traj = episode.trajectory
        n = sum(1 for m in traj.messages if m.role == "assistant")
        msgs = [Message(role="system", content=PROMPT),
                Message(role="user", content=f"The episode has {n} agent turns.\n\n" + numbered_transcript(traj))]
        text = ask(self.complete, self.model, msgs, self.spec.max_tokens)  # a failure: ValueError, "no score"
        return parse_scores(text, n)

    def _one(self, episode: Any) -> list[int] | None:
        try:
            return self.scores(episode)
        except ValueError:
            return None

    def __call__(self, step: int, episodes: list[Any]) -> dict[str, float]:
        with ThreadPoolExecutor(max_workers=self.spec.workers) as pool:
            got = list(pool.map(self._one, episodes))
        c, scored, total = self.spec.coef, [], 0
        for e, s in zip(episodes, got):
            if s is None:
                e.trajectory.metadata["turn_scores"] = None
                continue
            tt = e.tokens
            turn_rewards = [float(x) for x in tt.meta.get("turn_rewards", [])]
            turn_rewards += [0.0] * (len(s) - len(turn_rewards))
            tt.meta["turn_rewards"] = [r + c * k for r, k in zip(turn_rewards, s)]
            tt.reward = float(tt.reward or 0.0) + c * sum(s)
            e.trajectory.metadata["turn_scores"] = s
            scored.append(sum(s) / max(1, len(s)))
            total += 1
        return {"turn_judge_mean": sum(scored) / len(scored) if scored else 0.0,
                "turn_judge_failures": float(len(episodes) - total)}
