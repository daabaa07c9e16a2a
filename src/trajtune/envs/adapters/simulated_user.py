"""A simulated user: the user's turns of an episode written by a model from a scenario the agent never sees.

Why: customer-service benchmarks (τ²-bench) and any task whose request is underspecified need a
second party. The agent's text goes to the user; its tool calls go to the environment. The user
speaks from a *scenario* (who they are, why they call, what they know); it ends the conversation
with one of τ²-bench's control tokens (``###STOP###`` when its goal is met, ``###TRANSFER###``
after a transfer, ``###OUT-OF-SCOPE###`` when the scenario says nothing more).

Who writes the user's turns (``make_user``):

- ``scripted``: deterministic, for tests and offline runs. It opens with the scenario's
  ``opening`` text, says "yes" when the agent asks it to confirm, and otherwise stops. It knows
  nothing beyond the opening; results with it are named as such.
- ``openai:URL`` (with ``user_model``): any OpenAI-compatible endpoint, e.g. ``trajtune serve``.
- anything else is a local model (a registry alias such as ``smollm2-135m``, or a path) that
  trajtune loads and decodes greedily.

A simulator that fails (raises, times out, answers nothing, or answers with a tool call) ends the
episode as ``termination="env_error"`` with the reason in ``info["user_error"]``: the agent did
nothing wrong, so evaluation does not count it as the agent's failure.

``SimulatedUser`` wraps any environment: the inner environment's request becomes the user's
scenario, the user model writes the agent's first message from it, and when the user stops, the
agent's last text goes to the inner environment as its final answer.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from trajtune.envs.adapters.openai_policy import from_openai_message, to_openai_messages
from trajtune.envs.base import Environment, ResetResult, StepResult, Task
from trajtune.errors import EnvError
from trajtune.schema import Message

STOP, TRANSFER, OUT_OF_SCOPE = "###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###"
STOP_TOKENS = (STOP, TRANSFER, OUT_OF_SCOPE)
#: The agent's fixed greeting that opens a τ²-bench conversation (the user model answers it).
GREETING = "Hi! How can I help you today?"

# τ²-bench's user-simulation guidelines (data/tau2/user_simulator/simulation_guidelines.md), shortened.
GUIDELINES = """You are playing the role of a customer contacting a customer service representative.
Follow the scenario below, one message at a time, in a natural way.
- Never make up information that the scenario does not give; what it does not say is unknown to you.
- Do not repeat the instructions verbatim; paraphrase them.
- Disclose information progressively: wait for the agent to ask for it.
- When the goal of the scenario is met, write ###STOP### to end the conversation.
- If you are transferred to another agent, write ###TRANSFER###.
- If the scenario does not give enough information to continue, write ###OUT-OF-SCOPE###."""

_CONFIRM = re.compile(r"\b(confirm|proceed|go ahead|shall i|should i|do you want|would you like|yes/no|\(yes\))\b",
                      re.IGNORECASE)


class UserSimulatorError(EnvError):
    """The user simulator failed (an error, a timeout, an empty or malformed answer)."""


class UserModel(Protocol):
    """Writes the user's next message from the user's side of the conversation (system: the scenario;
    ``user``: what the agent said; ``assistant``: what the simulated user said before)."""

    name: str

    def __call__(self, messages: list[Message], scenario: dict[str, Any]) -> str: ...


class ScriptedUser:
    """Opens with ``scenario["opening"]``, says yes to a request for confirmation, stops otherwise."""

    name = "scripted"

    def __init__(self, max_turns: int = 10):
        self.max_turns = max_turns

    def __call__(self, messages: list[Message], scenario: dict[str, Any]) -> str:
        said = [m for m in messages if m.role == "assistant"]
        if not said:
            return str(scenario.get("opening") or scenario.get("instructions") or "")
        if len(said) >= self.max_turns:
            return STOP
        last = messages[-1].text() if messages and messages[-1].role == "user" else ""
        if "TRANSFERRED TO A HUMAN AGENT" in last.upper():
            return TRANSFER
        return "Yes, please go ahead." if _CONFIRM.search(last) else STOP


class EndpointUser:
    """A user written by an OpenAI-compatible endpoint (``trajtune serve``, vLLM, a hosted API)."""

    def __init__(self, url: str, model: str, *, temperature: float = 0.0, max_tokens: int = 200,
                 timeout_s: float = 60.0):
        from trajtune.envs.adapters.openai_policy import OpenAIChatPolicy

        self.policy = OpenAIChatPolicy(url, model, temperature=temperature, max_tokens=max_tokens,
                                       timeout_s=timeout_s, max_retries=1)
        self.name = f"openai:{model}"

    def __call__(self, messages: list[Message], scenario: dict[str, Any]) -> str:
        msg = self.policy(messages, [])
        if msg.tool_calls:
            raise UserSimulatorError(f"user model {self.name} answered with a tool call, not a message")
        return msg.text()


class LocalUser:
    """A local causal LM (registry alias or path), greedy, answered as ``trajtune serve`` would."""

    def __init__(self, model: str, *, max_new_tokens: int = 120):
        from trajtune.serve import local_service

        self.service = local_service(model, max_tokens=max_new_tokens)
        self.name = f"local:{model}"

    def __call__(self, messages: list[Message], scenario: dict[str, Any]) -> str:
        reply = self.service.complete({"messages": to_openai_messages(messages), "temperature": 0.0})
        msg = from_openai_message(reply["choices"][0]["message"])
        if msg.tool_calls:
            raise UserSimulatorError(f"user model {self.name} answered with a tool call, not a message")
        return msg.text()


def make_user(spec: str, *, user_model: str = "", max_new_tokens: int = 120, timeout_s: float = 60.0) -> UserModel:
    """``scripted``, ``openai:URL`` (``user_model`` names the model there) or a local model."""
    if spec == "scripted":
        return ScriptedUser()
    if spec.startswith("openai:"):
        url = spec.partition(":")[2]
        if not url.startswith(("http://", "https://")):
            raise EnvError(f"user must be openai:http(s)://HOST[:PORT]/v1, got {spec!r}")
        return EndpointUser(url, user_model or "default", max_tokens=max_new_tokens, timeout_s=timeout_s)
    if not spec:
        raise EnvError("user is empty: give scripted, openai:URL or a local model (alias or path)")
    with _LOCAL_LOCK:  # one copy per process: rollouts build an environment (and so a user) per episode
        if (spec, max_new_tokens) not in _LOCAL:
            _LOCAL[(spec, max_new_tokens)] = LocalUser(spec, max_new_tokens=max_new_tokens)
        return _LOCAL[(spec, max_new_tokens)]


_LOCAL: dict[tuple[str, int], LocalUser] = {}
_LOCAL_LOCK = threading.Lock()


def user_system_prompt(instructions: str) -> str:
    return f"{GUIDELINES}\n\n<scenario>\n{instructions}\n</scenario>"


@dataclass
class UserSession:
    """One episode's conversation from the user's side; ``reply`` runs the model under a timeout and
    refuses an answer that is not a message."""

    user: UserModel
    scenario: dict[str, Any]
    timeout_s: float = 60.0
    messages: list[Message] = field(default_factory=list)
    role: str = "user simulator"  # who this writer is, in error messages (a game's opponent reuses it)
    system: str | None = None  # the writer's instructions; default: τ²-bench's user guidelines and the scenario

    def __post_init__(self) -> None:
        system = self.system if self.system is not None else user_system_prompt(
            str(self.scenario.get("instructions", "")))
        self.messages = [Message(role="system", content=system)]

    def _ask(self) -> str:
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["text"] = self.user(list(self.messages), self.scenario)
            except BaseException as e:  # noqa: BLE001 - reported as the simulator's failure
                box["error"] = e

        t = threading.Thread(target=run, daemon=True, name="trajtune-user-sim")
        t.start()
        t.join(self.timeout_s)
        if t.is_alive():
            raise UserSimulatorError(f"{self.role} {self.user.name} did not answer within {self.timeout_s:g}s")
        if "error" in box:
            e = box["error"]
            raise UserSimulatorError(f"{self.role} {self.user.name} failed: {type(e).__name__}: {e}") from None
        text = box.get("text")
        if not isinstance(text, str) or not text.strip():
            raise UserSimulatorError(f"{self.role} {self.user.name} answered nothing ({text!r})")
        if "<tool_call>" in text:
            raise UserSimulatorError(f"{self.role} {self.user.name} answered with a tool call: {text[:120]!r}")
        text = text.strip()
        self.messages.append(Message(role="assistant", content=text))
        return text

    def opening(self, greeting: str = GREETING) -> str:
        """The user's first message, answering the agent's fixed ``greeting``."""
        self.messages.append(Message(role="user", content=greeting))
        text = self._ask()
        if stop_token(text):
            raise UserSimulatorError(f"user simulator {self.user.name} ended the conversation before it began: "
                                     f"{text[:120]!r}")
        return text

    def reply(self, agent_text: str) -> tuple[str, str | None]:
        """The user's answer to ``agent_text`` and the control token that ends the conversation (or None)."""
        self.messages.append(Message(role="user", content=agent_text))
        text = self._ask()
        return text, stop_token(text)


def stop_token(text: str) -> str | None:
    return next((t for t in STOP_TOKENS if t in text), None)


def visible(text: str) -> str:
    """The user's message without its control tokens (what the agent is shown)."""
    for t in STOP_TOKENS:
        text = text.replace(t, "")
    return text.strip()


def user_error(exc: UserSimulatorError) -> StepResult:
    return StepResult(observations=[], done=True, termination="env_error", info={"user_error": str(exc)})


class SimulatedUser(Environment):
    """Any environment with a simulated user in front of it (see the module docstring)."""

    def __init__(self, inner: Environment, user: UserModel, *, timeout_s: float = 60.0,
                 scenario: Callable[[Task, list[Message]], dict[str, Any]] | None = None):
        self.inner, self.user, self.timeout_s = inner, user, timeout_s
        self._scenario = scenario
        self.name = f"simulated_user({inner.name})"
        self.description = f"{inner.name} with a simulated user ({user.name})"
        self.max_turns = inner.max_turns + 4
        self.session: UserSession | None = None
        self.user_error: str | None = None

    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        return self.inner.tasks(split, n, seed)

    def scenario(self, task: Task, messages: list[Message]) -> dict[str, Any]:
        if self._scenario is not None:
            return self._scenario(task, messages)
        request = next((m.text() for m in messages if m.role == "user"), "")
        return {"instructions": f"Your request to the assistant: {request}", "opening": request}

    def reset(self, task: Task) -> ResetResult:
        res = self.inner.reset(task)
        self.session = UserSession(self.user, self.scenario(task, res.messages), timeout_s=self.timeout_s)
        self.user_error = None
        opening = self.session.opening()  # a failure here is the environment's (the runner: env_error)
        msgs = [m for m in res.messages if m.role != "user"] + [Message(role="user", content=opening, origin="user")]
        return ResetResult(messages=msgs, tools=res.tools)

    def step(self, action: Message) -> StepResult:
        if action.tool_calls or self.session is None:
            return self.inner.step(action)
        try:
            text, token = self.session.reply(action.text())
        except UserSimulatorError as e:
            self.user_error = str(e)
            return user_error(e)
        if token is None:
            return StepResult(observations=[Message(role="user", content=visible(text), origin="user")])
        out = self.inner.step(action)  # the conversation is over: the agent's last text is its answer
        if not out.done:  # an inner environment that would go on is ended here: the user has left
            out = StepResult(observations=out.observations, reward=out.reward, done=True, info=out.info)
        out.info = {**out.info, "user_stop": token}
        return out

    def success(self) -> bool:
        return self.user_error is None and self.inner.success()

    def expert(self, task: Task) -> Any:
        return self.inner.expert(task)

    def render(self) -> str:
        return self.inner.render()
