"""``home``: a small smart-home tool world, the embedded default environment of the demo.

Why this task: it is verifiable on state (the devices' on/off table), it needs multi-turn tool
use (read a room's state, then act on what was observed), and every argument is drawn from a
small finite set of single-word entities, so a from-scratch tiny model can learn it on a CPU in
minutes. Three task kinds of rising difficulty:

- ``set``: "Turn on the lamp in the kitchen." -> set_device, then "Done."
- ``copy``: "Set the fan in the office to match the fan in the attic." -> get_state(attic, fan),
  set_device(office, fan, <observed>), "Done."
- ``toggle``: "Toggle the radio in the garage." -> get_state(garage, radio), set the opposite, "Done."

Success: the target device holds the goal state, no other device changed, and the agent ended
the episode with a final answer (no tool call).

Reward terms (``rl.reward``: ``info.observed``, ``info.grounded``), reported on the final step:
``observed`` is 1 when every target that needed a reading (a copy's source, a toggle's own device)
was read with ``get_state`` before the agent first switched it, else 0; ``grounded`` is success
and observed. Why: on a ``copy`` or ``toggle`` task a model that switches the device blind is right
half the time, and an outcome reward pays that lucky guess as much as the observed answer (GRPO on
SmolLM2 learned exactly that shortcut); ``grounded`` pays only a success the agent could know it had.

``chores: N`` (N > 1) makes a long-horizon variant: a task lists N chores on distinct devices, to do
in order, and succeeds only when every target holds its goal and nothing else changed (about 1.7
calls a chore, so 8 chores take some 15 steps, 30 with ``fold``'s branch and return around each).
The expert marks each chore's messages (``extra["subtask"]``), so the ``fold`` wrapper's expert
can fold them. ``log_lines: K`` follows every tool result with K lines of the room's sensor log, as
real tools return more than the one line that matters: it is what fills a long episode's context.

``rationale: true`` makes the expert say, before each call that depends on a reading, what it read
and what follows ("The attic fan is on, so the office fan must be on." / "The garage radio is on;
toggled, it must be off."). Why: the state to write is the observed state XOR the task kind, a
two-input rule that SmolLM2-135M did not learn from calls alone in 40 LoRA steps (after SFT it
flipped copies as if they were toggles; after GRPO with the grounded reward it wrote "on" whatever
it read: ``benchmarks/home_state_probe.py``); a sentence that first restates the reading leaves one
local step per token. Scoring ignores the text: only the calls and the final answer count. With
the option the final step also reports ``explained``: success, observed, and every call that depends
on a reading was written in a turn whose text states that reading and the state that follows
(``rationale_issue``). Why: RL with an outcome or grounded reward from an under-trained checkpoint
dropped the sentence within 16 steps and the wrong states came back; ``explained`` pays only the
episodes that kept it.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

from trajtune.envs.base import Environment, ResetResult, StepResult, Task
from trajtune.schema import Message, Outcome, ToolCall, ToolSpec, Trajectory

ROOMS = ["kitchen", "bedroom", "office", "garage", "bathroom", "hallway", "attic", "cellar"]
DEVICES = ["lamp", "fan", "heater", "radio", "blinds"]
STATES = ["on", "off"]
KINDS = ["set", "copy", "toggle"]

SYSTEM = "You control a smart home. Use the tools, then reply Done."

TOOLS = [
    ToolSpec(
        name="get_state",
        description="Read whether a device is on or off.",
        parameters={"type": "object",
                    "properties": {"room": {"type": "string", "enum": ROOMS},
                                   "device": {"type": "string", "enum": DEVICES}},
                    "required": ["room", "device"], "additionalProperties": False},
    ),
    ToolSpec(
        name="set_device",
        description="Switch a device on or off.",
        parameters={
            "type": "object",
            "properties": {
                "room": {"type": "string", "enum": ROOMS},
                "device": {"type": "string", "enum": DEVICES},
                "state": {"type": "string", "enum": STATES},
            },
            "required": ["room", "device", "state"],
            "additionalProperties": False,
        },
    ),
]


def _other(state: str) -> str:
    return "off" if state == "on" else "on"


def _chore(rng: random.Random, kind: str, room: str, device: str, state: dict[str, dict[str, str]],
           taken: set[tuple[str, str]]) -> dict[str, Any]:
    """One chore on (room, device), setting up ``state`` so that it needs a change; a copy reads a
    device no chore touches."""
    c: dict[str, Any] = {"kind": kind, "room": room, "device": device}
    if kind == "set":
        c["goal"] = rng.choice(STATES)
        state[room][device] = _other(c["goal"])
        c["prompt"] = f"Turn {c['goal']} the {device} in the {room}."
    elif kind == "copy":
        src = rng.choice([r for r in ROOMS if r != room and (r, device) not in taken])
        state[room][device] = _other(state[src][device])
        c.update(source_room=src, goal=state[src][device],
                 prompt=f"Set the {device} in the {room} to match the {device} in the {src}.")
    else:
        c["goal"] = _other(state[room][device])
        c["prompt"] = f"Toggle the {device} in the {room}."
    return c


def read_room(c: dict[str, Any]) -> str:
    """The room whose device a ``copy`` or ``toggle`` chore reads before switching its target: a
    copy's source, a toggle's own room."""
    return c["source_room"] if c["kind"] == "copy" else c["room"]


def rationale_issue(text: str | None, seen: str, goal: str) -> str | None:
    """What is wrong with the sentence before a call that depends on a reading (None: it states the
    reading ``seen`` and then the state ``goal`` that follows, as ``_rationale`` writes it). Only the
    first "is on/off" and the first "must be on/off" count, so a sentence that names both states does
    not pass by luck."""
    read = re.search(r"\bis (on|off)\b", text or "")
    said = re.search(r"\bmust be (on|off)\b", text or "")
    if read is None or said is None or said.start() < read.start():
        return "sentence without a reading and a conclusion"
    if read.group(1) != seen:
        return "sentence misreads the state"
    if said.group(1) != goal:
        return "sentence reads right, concludes wrong"
    return None


def _rationale(c: dict[str, Any], seen: str, goal: str) -> str:
    """The expert's sentence before a call that depends on a reading: the reading first, then the
    rule of the task kind, then the state the call writes."""
    if c["kind"] == "copy":
        return f"The {c['source_room']} {c['device']} is {seen}, so the {c['room']} {c['device']} must be {goal}."
    return f"The {c['room']} {c['device']} is {seen}; toggled, it must be {goal}."


def make_chores_task(seed: int, split: str, chores: int, kinds: list[str] | None = None) -> Task:
    """A task of ``chores`` chores on distinct devices, listed in order (the long-horizon variant)."""
    rng = random.Random(f"chores-{chores}-{seed}")
    state = {r: {d: rng.choice(STATES) for d in DEVICES} for r in ROOMS}
    pairs = [(r, d) for r in ROOMS for d in DEVICES]
    targets = rng.sample(pairs, chores)
    taken = set(targets)
    items = [_chore(rng, rng.choice(kinds or KINDS), r, d, state, taken) for r, d in targets]
    for c in items:  # a later chore's setup must not undo an earlier chore's (distinct devices: it cannot)
        assert state[c["room"]][c["device"]] != c["goal"]
    prompt = "Do these chores in order: " + " ".join(f"{i + 1}. {c['prompt']}" for i, c in enumerate(items))
    data: dict[str, Any] = {"kind": "chores", "chores": items, "prompt": prompt, "initial": state,
                            "difficulty": chores}
    return Task(id=f"home{chores}-{split}-{seed}", seed=seed, split=split, data=data)


def make_task(seed: int, split: str, kinds: list[str] | None = None) -> Task:
    rng = random.Random(seed)
    kind = rng.choice(kinds or KINDS)
    state = {r: {d: rng.choice(STATES) for d in DEVICES} for r in ROOMS}
    room = rng.choice(ROOMS)
    device = rng.choice(DEVICES)
    # "difficulty" (0 set, 1 copy, 2 toggle) is what rl.curriculum buckets tasks by
    data: dict[str, Any] = {"kind": kind, "room": room, "device": device, "difficulty": KINDS.index(kind)}
    if kind == "set":
        goal = rng.choice(STATES)
        state[room][device] = _other(goal)  # the task always requires a change
        data["goal"] = goal
        data["prompt"] = f"Turn {goal} the {device} in the {room}."
    elif kind == "copy":
        src = rng.choice([r for r in ROOMS if r != room])
        state[room][device] = _other(state[src][device])
        data["source_room"] = src
        data["goal"] = state[src][device]
        data["prompt"] = f"Set the {device} in the {room} to match the {device} in the {src}."
    else:
        data["goal"] = _other(state[room][device])
        data["prompt"] = f"Toggle the {device} in the {room}."
    data["initial"] = state
    return Task(id=f"home-{split}-{seed}", seed=seed, split=split, data=data)


class HomeEnv(Environment):
    name = "home"
    description = "Smart-home tool world: read room states and switch devices (set / copy / toggle tasks)."
    max_turns = 4
    deterministic = True
    reward_terms = ("observed", "grounded")

    def __init__(self, kinds: list[str] | None = None, chores: int = 1, log_lines: int = 0,
                 rationale: bool = False) -> None:
        bad = [k for k in (kinds or []) if k not in KINDS]
        if bad:
            raise ValueError(f"unknown home task kind(s) {bad}; choose from {KINDS}")
        if not isinstance(chores, int) or not 1 <= chores <= 16:
            raise ValueError(f"home: chores must be an integer from 1 to 16, got {chores!r}")
        if not isinstance(log_lines, int) or not 0 <= log_lines <= 64:
            raise ValueError(f"home: log_lines must be an integer from 0 to 64, got {log_lines!r}")
        if not isinstance(rationale, bool):
            raise ValueError(f"home: rationale must be true or false, got {rationale!r}")
        self.kinds = list(kinds) if kinds else list(KINDS)
        self.rationale = rationale
        self.chores = chores
        self.log_lines = log_lines
        if chores > 1:
            self.max_turns = 3 * chores + 2
        self.task: Task | None = None
        self.state: dict[str, dict[str, str]] = {}
        self.finished = False
        self.turns = 0
        self.read: set[tuple[str, str]] = set()  # (room, device) read with get_state
        self.blind = False  # a target that needed a reading was switched before it was read
        self.unexplained = False  # rationale: a dependent call in a turn without the right sentence
        if rationale:
            self.reward_terms = (*self.reward_terms, "explained")

    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        """Train tasks use even seeds and test tasks odd ones, so the splits never share a task."""
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        rng = random.Random(f"{seed}-{split}")
        offset = 0 if split == "train" else 1
        seeds: list[int] = []
        seen: set[int] = set()
        while len(seeds) < n:
            s = 2 * rng.randrange(1 << 30) + offset
            if s not in seen:
                seen.add(s)
                seeds.append(s)
        if self.chores > 1:
            return [make_chores_task(s, split, self.chores, self.kinds) for s in seeds]
        return [make_task(s, split, self.kinds) for s in seeds]

    def snapshot(self) -> Any:
        return {"task": self.task, "state": json.loads(json.dumps(self.state)), "finished": self.finished,
                "turns": self.turns, "read": sorted(self.read), "blind": self.blind,
                "unexplained": self.unexplained}

    def restore(self, state: Any) -> None:
        self.task = state["task"]
        self.state = json.loads(json.dumps(state["state"]))
        self.finished, self.turns = state["finished"], state["turns"]
        self.read, self.blind = {tuple(x) for x in state.get("read", ())}, bool(state.get("blind", False))
        self.unexplained = bool(state.get("unexplained", False))

    def reset(self, task: Task) -> ResetResult:
        self.task = task
        self.state = json.loads(json.dumps(task.data["initial"]))
        self.finished = False
        self.turns = 0
        self.read, self.blind, self.unexplained = set(), False, False
        return ResetResult(
            messages=[Message(role="system", content=SYSTEM), Message(role="user", content=task.data["prompt"])],
            tools=list(TOOLS),
        )

    def _with_log(self, call: ToolCall, text: str) -> str:
        """``text`` and the room's sensor log (``log_lines``): the same lines every time a room is read."""
        room = (call.arguments or {}).get("room")
        if not self.log_lines or text.startswith("error") or self.task is None:
            return text
        rng = random.Random(f"log-{self.task.seed}-{room}")
        lines = [f"{h:02d}:{rng.randrange(60):02d} {rng.choice(['temp', 'humidity', 'light', 'noise'])} "
                 f"{rng.randrange(100)}" for h in sorted(rng.sample(range(24), min(self.log_lines, 24)))]
        lines += [f"note {i}: {rng.randrange(1000)}" for i in range(self.log_lines - len(lines))]
        return text + "\n" + "\n".join(lines)

    def _call(self, call: ToolCall) -> str:
        args = call.arguments or {}
        if call.name == "get_state":
            room, device = args.get("room"), args.get("device")
            if set(args) != {"room", "device"}:
                return "error: get_state takes 'room' and 'device'"
            if room not in self.state:
                return f"error: unknown room {room!r}"
            if device not in DEVICES:
                return f"error: unknown device {device!r}"
            self.read.add((room, device))
            return f"{room} {device}: {self.state[room][device]}"
        if call.name == "set_device":
            room, device, st = args.get("room"), args.get("device"), args.get("state")
            if set(args) != {"room", "device", "state"}:
                return "error: set_device takes 'room', 'device' and 'state'"
            if room not in self.state:
                return f"error: unknown room {room!r}"
            if device not in DEVICES:
                return f"error: unknown device {device!r}"
            if st not in STATES:
                return f"error: state must be 'on' or 'off', got {st!r}"
            if (need := self._needs_reading().get((room, device))) is not None and need not in self.read:
                self.blind = True
            self.state[room][device] = st
            return f"ok: {room} {device} is {st}"
        return f"error: unknown tool {call.name!r}"

    def step(self, action: Message) -> StepResult:
        self.turns += 1
        calls = action.tool_calls or []
        if not calls:
            self.finished = True
            ok = self.success()
            terms = {"observed": float(not self.blind), "grounded": float(ok and not self.blind)}
            if self.rationale:
                terms["explained"] = float(ok and not self.blind and not self.unexplained)
            return StepResult(observations=[], reward=1.0 if ok else 0.0, done=True,
                              info={"success": ok, "reward_terms": terms})
        obs = []
        for c in calls:
            if self.rationale:
                self._check_sentence(c, action.content)
            obs.append(Message(role="tool", tool_call_id=c.id, name=c.name,
                               content=self._with_log(c, self._call(c)), origin="environment"))
        return StepResult(observations=obs, reward=0.0, done=False, info={})

    def _check_sentence(self, call: ToolCall, text: str | None) -> None:
        """Before a set_device on a target that depends on a reading runs: does the turn's text state
        the state the source holds now and the chore's goal?"""
        if call.name != "set_device":
            return
        args = call.arguments or {}
        c = self._dependent().get((args.get("room"), args.get("device")))
        if c is not None and rationale_issue(text, self.state[read_room(c)][c["device"]], c["goal"]) is not None:
            self.unexplained = True

    def _dependent(self) -> dict[tuple[str, str], dict[str, Any]]:
        """Per target (room, device) whose goal depends on a state the prompt does not say (a copy
        or a toggle), its chore."""
        assert self.task is not None
        d = self.task.data
        return {(c["room"], c["device"]): c for c in d.get("chores", [d]) if c["kind"] in ("copy", "toggle")}

    def _needs_reading(self) -> dict[tuple[str, str], tuple[str, str]]:
        """Per dependent target, the (room, device) to read first: a copy's source, a toggle's own
        device."""
        return {t: (read_room(c), c["device"]) for t, c in self._dependent().items()}

    def _goal_met(self) -> bool:
        assert self.task is not None
        d = self.task.data
        initial = d["initial"]
        goals = {(c["room"], c["device"]): c["goal"] for c in d.get("chores", [d])}
        for r in ROOMS:
            for dev in DEVICES:
                want = goals.get((r, dev), initial[r][dev])
                if self.state[r][dev] != want:
                    return False
        return True

    def success(self) -> bool:
        return self.task is not None and self.finished and self._goal_met()

    def expert(self, task: Task) -> Trajectory:
        d = task.data
        reset = self.reset(task)
        msgs = list(reset.messages)
        n = 0

        def act(calls: list[ToolCall] | None, content: str | None = None) -> None:
            m = Message(role="assistant", content=content, tool_calls=calls)
            msgs.append(m)
            msgs.extend(self.step(m).observations)

        def call(name: str, **args: str) -> list[ToolCall]:
            nonlocal n
            c = ToolCall(id=f"call_{n:06d}", id_generated=True, name=name, arguments=args)
            n += 1
            return [c]

        for c in d.get("chores", [d]):
            start = len(msgs)
            if c["kind"] == "set":
                act(call("set_device", room=c["room"], device=c["device"], state=c["goal"]))
            else:
                act(call("get_state", room=read_room(c), device=c["device"]))
                seen = msgs[-1].text().splitlines()[0].rsplit(": ", 1)[1]
                goal = seen if c["kind"] == "copy" else _other(seen)
                act(call("set_device", room=c["room"], device=c["device"], state=goal),
                    _rationale(c, seen, goal) if self.rationale else None)
            if "chores" in d:  # the fold wrapper's expert folds each chore (envs/adapters/fold.py)
                for m in msgs[start:]:
                    m.extra["subtask"] = c["prompt"]
        act(None, "Done.")
        ok = self.success()
        return Trajectory(
            id=task.id, messages=msgs, tools=reset.tools, reward=1.0 if ok else 0.0,
            outcome=Outcome(success=ok, final_answer="Done.", termination="done"),
            metadata={"env": self.name, "kind": d["kind"], "seed": task.seed, "split": task.split, "expert": True},
        )

    def render(self) -> str:
        rows = [f"{r:9s} " + " ".join(f"{dev}={self.state[r][dev]:3s}" for dev in DEVICES) for r in ROOMS]
        head = f"task: {self.task.data['prompt']}" if self.task else "task: (none)"
        return head + "\n" + "\n".join(rows)
