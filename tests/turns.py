"""Assistant turns for tests that drive environments with scripted policies."""

from trajtune.envs.adapters.simulated_user import STOP
from trajtune.schema import Message, ToolCall


def say(text: str) -> Message:
    return Message(role="assistant", content=text)


def call(name: str, **args) -> Message:
    return Message(role="assistant", tool_calls=[ToolCall(id="", name=name, arguments=args)])


def script(*actions: Message, then: str = STOP):
    """A policy that plays ``actions`` in order, then says ``then`` (by default the agent's ###STOP###)."""
    steps = iter(actions)
    return lambda messages, tools: next(steps, say(then))
