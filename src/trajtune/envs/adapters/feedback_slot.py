"""``feedback_slot``: an environment whose request carries a fixed feedback line (FAFT at inference).

Why: a FAFT model was trained on (request + "Feedback on the answer to this request: <verdict>")
→ plan; at inference the slot must say the verdict one wants ("all constraints pass"), in exactly
the training wording. ``env: {name: feedback_slot, kwargs: {env: trip, text: "all constraints pass"}}``
wraps any environment so; ``trajtune eval --env '{name: feedback_slot, kwargs: {env: trip}}'`` too.
The registered factory (which looks the inner environment up by name) is in ``trajtune.envs.registry``.
"""

from __future__ import annotations

from trajtune.envs.adapters.prompt_wrapper import PromptWrapper
from trajtune.envs.base import Environment
from trajtune.schema import Message

FEEDBACK_PREFIX = "Feedback on the answer to this request: "


def add_feedback(messages: list[Message], text: str) -> list[Message]:
    """The messages with ``FEEDBACK_PREFIX + text`` after the first user message's text."""
    out = [m.model_copy(deep=True) for m in messages]
    first = next((m for m in out if m.role == "user"), None)
    if first is None:
        raise ValueError("no user message to put the feedback in")
    first.content = f"{first.text()}\n\n{FEEDBACK_PREFIX}{text}"
    return out


class FeedbackSlot(PromptWrapper):
    """An environment whose request carries a fixed feedback slot (FAFT at inference)."""

    def __init__(self, inner: Environment, text: str):
        super().__init__(inner, f"{inner.description} (with the feedback slot {text!r})")
        self.text = text

    def rewrite(self, messages: list[Message]) -> list[Message]:
        return add_feedback(messages, self.text)
