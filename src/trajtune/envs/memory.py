"""``memory``: a conversation that needs create/read/update/delete on an external memory store.

The user hands over facts over several turns ("save X under key k"), later changes some
("k changed to Y") and asks to forget others, and finally asks a question about one key. The
agent must keep the store in sync with tools and answer via ``answer``.

Success is checked on state: the final store equals the expected key-value store (every create,
update and delete applied, nothing extra) *and* the submitted answer is the latest value.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Generator
from typing import Any

from trajtune.envs.base import Task
from trajtune.envs.toolenv import ToolEnv, assistant_call, assistant_text, make_tasks, scripted_policy
from trajtune.envs.tools import ToolError
from trajtune.schema import Message, ToolSpec

PEOPLE = ["alice", "bruno", "chen", "dara", "emeka", "fatima", "goran", "hana"]
ATTRS = {"locker": lambda r: str(r.randint(1000, 9999)), "phone": lambda r: f"555-{r.randint(1000, 9999)}",
         "city": lambda r: r.choice(["Lisbon", "Osaka", "Quito", "Tallinn", "Accra", "Perth", "Bergen"]),
         "pet": lambda r: r.choice(["parrot", "tortoise", "beagle", "ferret", "goldfish"])}
ATTR_TEXT = {"locker": "locker code", "phone": "phone number", "city": "home city", "pet": "pet"}


def _build(rng: random.Random) -> dict[str, Any]:
    keys = rng.sample([f"{p}.{a}" for p in PEOPLE for a in ATTRS], rng.randint(3, 4))
    store: dict[str, str] = {}
    events: list[dict[str, str]] = []
    for k in keys:
        v = ATTRS[k.split(".")[1]](rng)
        events.append({"op": "create", "key": k, "value": v})
        store[k] = v
    upd = rng.choice(keys)
    newv = ATTRS[upd.split(".")[1]](rng)
    while newv == store[upd]:
        newv = ATTRS[upd.split(".")[1]](rng)
    events.append({"op": "update", "key": upd, "value": newv})
    store[upd] = newv
    rest = [k for k in keys if k != upd]
    dele = rng.choice(rest)
    events.append({"op": "delete", "key": dele})
    del store[dele]
    ask = upd if rng.random() < 0.6 else rng.choice([k for k in keys if k not in (upd, dele)])
    events.append({"op": "ask", "key": ask})
    return {"events": events, "final_store": store, "answer": store[ask]}


def _say(ev: dict[str, str]) -> str:
    person, attr = ev["key"].split(".")
    what = f"{person.capitalize()}'s {ATTR_TEXT[attr]}"
    if ev["op"] == "create":
        return f"Please remember {what}: {ev['value']}. Store it under the key '{ev['key']}'."
    if ev["op"] == "update":
        return f"Update: {what} has changed to {ev['value']} (key '{ev['key']}')."
    if ev["op"] == "delete":
        return f"{what} is no longer valid; delete the key '{ev['key']}'."
    return f"What is {what}? Check your memory (key '{ev['key']}') and give it with the answer tool."


class MemoryEnv(ToolEnv):
    """CRUD memory tools across a multi-turn conversation; success = correct store and answer."""

    name = "memory"
    description = "Keep a key-value memory in sync over a conversation (create/read/update/delete), then answer."
    max_turns = 24
    system_prompt = ("You manage a key-value memory for the user with the memory_* tools. Apply every request to the "
                     "memory, then reply 'Noted.' to get the next message. Answer questions with the answer tool "
                     "using what is stored, then reply with one line.")
    tool_names = ("memory_create", "memory_read", "memory_update", "memory_delete", "memory_list", "answer")

    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        return make_tasks("memory", split, n, seed, _build)

    def setup(self, task: Task) -> None:
        self.store: dict[str, str] = {}
        self.cursor = 0  # index of the event currently shown to the agent
        self.answered: str | None = None
        self.ops: list[str] = []

    def prompt(self, task: Task) -> str:
        return _say(task.data["events"][0])

    def memory_create(self, key: str, value: str) -> str:
        """Store a new value under a new key.

        Args:
            key: the key, e.g. alice.phone
            value: the value to store
        """
        if key in self.store:
            raise ToolError(f"key {key!r} exists; use memory_update")
        self.store[key] = str(value)
        self.ops.append(f"create {key}")
        return f"stored {key}"

    def memory_read(self, key: str) -> str:
        """Read the value stored under a key.

        Args:
            key: the key to read
        """
        if key not in self.store:
            raise ToolError(f"no key {key!r}")
        self.ops.append(f"read {key}")
        return self.store[key]

    def memory_update(self, key: str, value: str) -> str:
        """Replace the value of an existing key.

        Args:
            key: an existing key
            value: the new value
        """
        if key not in self.store:
            raise ToolError(f"no key {key!r}; use memory_create")
        self.store[key] = str(value)
        self.ops.append(f"update {key}")
        return f"updated {key}"

    def memory_delete(self, key: str) -> str:
        """Delete a key and its value.

        Args:
            key: the key to delete
        """
        if key not in self.store:
            raise ToolError(f"no key {key!r}")
        del self.store[key]
        self.ops.append(f"delete {key}")
        return f"deleted {key}"

    def memory_list(self) -> list[str]:
        """List all stored keys."""
        return sorted(self.store)

    def answer(self, text: str) -> str:
        """Give the answer to the user's question.

        Args:
            text: the answer (just the value)
        """
        assert self.task is not None
        if self.task.data["events"][self.cursor]["op"] != "ask":
            raise ToolError("there is no open question yet")
        self.answered = text
        return "answer delivered"

    def on_text(self, text: str) -> tuple[list[Message], bool]:
        assert self.task is not None
        events = self.task.data["events"]
        if self.cursor + 1 < len(events):
            self.cursor += 1
            return [Message(role="user", content=_say(events[self.cursor]), origin="user")], False
        self.final_answer = text
        return [], True

    def success(self) -> bool:
        if self.task is None or self.answered is None:
            return False
        return (self.store == self.task.data["final_store"]
                and self.answered.strip().lower() == str(self.task.data["answer"]).lower())

    def state_view(self) -> str:
        return f"store={json.dumps(self.store, sort_keys=True)} answered={self.answered!r} event={self.cursor}"

    def expert_policy(self, task: Task) -> Callable[[list[Message], list[ToolSpec]], Message]:
        return scripted_policy(self._script(task))

    def _script(self, task: Task) -> Generator[Message, str, None]:
        """Apply each request as it arrives, reading the op from the user's wording."""
        text = self.prompt(task)
        while True:
            key = re.search(r"key '([^']+)'", text).group(1)  # type: ignore[union-attr]
            if text.startswith("Please remember"):
                value = re.search(r": (.+?)\. Store it", text).group(1)  # type: ignore[union-attr]
                yield assistant_call("memory_create", key=key, value=value)
            elif text.startswith("Update:"):
                value = re.search(r"has changed to (.+?) \(key", text).group(1)  # type: ignore[union-attr]
                yield assistant_call("memory_update", key=key, value=value)
            elif "delete the key" in text:
                yield assistant_call("memory_delete", key=key)
            else:
                value = yield assistant_call("memory_read", key=key)
                yield assistant_call("answer", text=value.strip())
                yield assistant_text(f"It is {value.strip()}.")
                return
            text = yield assistant_text("Noted.")
