"""MiniWoB++ web tasks as a trajtune ``Environment`` (optional extra ``miniwob``).

MiniWoB++ (Farama's ``miniwob`` package) is 125 small web pages, each with a one-line instruction
("Click button ONE.", "Enter "Kanesha" into the text field and press Submit.") and a JavaScript
checker, driven in a real headless Chromium through Selenium. The package speaks gymnasium with
structured actions (an action type plus an element ref); this plug-in turns that into tool calls:

- the observation is the instruction and the page as text, one line per DOM element:
  ``[ref] tag "text" id=.. class=.. value=".."`` (at most ``max_elements`` lines), re-read after
  every action;
- two tools act on an element by its ref: ``click(ref)`` and ``type_text(ref, text)`` (focus the
  element, then type); a ref that is not on the page is a tool error, not an action;
- the episode ends when the page's checker says so: success is MiniWoB's raw reward > 0 (it
  also gives a time-discounted reward, kept in ``info["miniwob_env_reward"]``). A final text answer
  ends it too, unsolved;
- the task seed is the page's seed (train seeds even, test seeds odd).

Browsers are slow to start (about 1.5 s) and rollouts make a fresh environment per episode, so
started browsers are pooled per process and task: an episode borrows one at ``reset`` and gives it
back when it ends (or when its environment is garbage-collected, for an episode cut by trajtune's
own limits); every browser is closed at exit. The Chromium binary and its driver are the system's
(``chromium`` and ``chromedriver``: ``make test`` installs them as root; elsewhere set
``MINIWOB_CHROME_BINARY`` and ``MINIWOB_CHROMEDRIVER``, or put them on PATH).
"""

from __future__ import annotations

import atexit
import functools
import os
import re
import shutil
import threading
import weakref
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from trajtune.envs.base import Environment, ResetResult, StepResult, Task, parse_env_options
from trajtune.envs.toolenv import check_game_task, game_tasks
from trajtune.envs.tools import tool_message
from trajtune.errors import EnvError
from trajtune.plugins import require
from trajtune.schema import Message, ToolSpec, Trajectory

INSTALL_HINT = ("pip install 'trajtune[miniwob]' (or: pip install miniwob==1.1.0), and a Chromium with its driver "
                "(Debian: apt-get install chromium chromium-driver)")

INSTRUCTIONS = ("You operate a web page with tools. The page is listed one element per line as [ref] tag \"text\". "
                "Call click(ref) or type_text(ref, text) on an element's ref to do the task.")

TOOLS = [
    ToolSpec(name="click", description="Click the page element with this ref.",
             parameters={"type": "object", "properties": {"ref": {"type": "integer", "description": "the element's ref"}},
                         "required": ["ref"], "additionalProperties": False}),
    ToolSpec(name="type_text", description="Focus the page element with this ref and type text into it.",
             parameters={"type": "object", "properties": {
                 "ref": {"type": "integer", "description": "the element's ref"},
                 "text": {"type": "string", "description": "the text to type"}},
                 "required": ["ref", "text"], "additionalProperties": False}),
]


class MiniWoBNotInstalledError(EnvError, ImportError):
    """The optional ``miniwob`` package (or the browser it drives) is missing."""


class MiniWoBOptions(BaseModel):
    """Options of the ``miniwob`` environment."""

    model_config = ConfigDict(extra="forbid")

    task: str = Field("click-test-2", description="a MiniWoB++ task name (click-test-2, click-button, enter-text, "
                      "login-user, ...; `miniwob/` prefix optional)")
    max_turns: int = Field(8, ge=1, le=200, description="agent turns before the episode is cut (max_turns)")
    max_elements: int = Field(80, ge=1, le=2000, description="page elements listed in an observation")


def _browser_paths() -> tuple[str, str]:
    chrome = os.environ.get("MINIWOB_CHROME_BINARY") or shutil.which("chromium") or shutil.which("chromium-browser") \
        or shutil.which("google-chrome")
    driver = os.environ.get("MINIWOB_CHROMEDRIVER") or shutil.which("chromedriver")
    if not chrome or not driver:
        raise MiniWoBNotInstalledError(f"the miniwob environment needs Chromium and chromedriver (found: browser "
                                       f"{chrome or 'none'}, driver {driver or 'none'}); {INSTALL_HINT}")
    return chrome, driver


@functools.cache
def task_names() -> list[str]:
    """Every registered MiniWoB++ task, without the ``miniwob/`` prefix and ``-v1`` suffix (read once:
    rollouts make an environment per episode)."""
    gym = require("gymnasium", MiniWoBNotInstalledError, "the miniwob environment", INSTALL_HINT)
    miniwob = require("miniwob", MiniWoBNotInstalledError, "the miniwob environment", INSTALL_HINT)
    gym.register_envs(miniwob)
    return sorted(k[len("miniwob/"):].rsplit("-v", 1)[0] for k in gym.registry if k.startswith("miniwob/"))


class _Browsers:
    """Started MiniWoB environments (one Chromium each), idle ones kept per task for the next episode."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.idle: dict[str, list[Any]] = {}
        self.all: list[Any] = []

    def borrow(self, task: str) -> Any:
        with self.lock:
            if self.idle.get(task):
                return self.idle[task].pop()
        import gymnasium as gym

        chrome, driver = _browser_paths()
        os.environ.setdefault("MINIWOB_CHROME_BINARY", chrome)
        os.environ.setdefault("MINIWOB_CHROMEDRIVER", driver)
        env = gym.make(f"miniwob/{task}-v1")
        with self.lock:
            self.all.append(env)
        return env

    def give_back(self, task: str, env: Any) -> None:
        with self.lock:
            self.idle.setdefault(task, []).append(env)

    def close_all(self) -> None:
        with self.lock:
            envs, self.all, self.idle = self.all, [], {}
        for env in envs:
            try:
                env.close()
            except Exception:  # noqa: BLE001 - a browser already gone at exit
                pass


BROWSERS = _Browsers()
atexit.register(BROWSERS.close_all)


def page_text(elements: list[dict[str, Any]], limit: int) -> str:
    """The DOM as one line per element (see the module docstring); the body and empty containers left out."""
    lines = []
    for el in elements:
        tag, text = str(el.get("tag", "")), str(el.get("text") or "").strip()
        ident, classes = str(el.get("id") or "").strip(), str(el.get("classes") or "").strip()
        value = el.get("value")
        if tag in ("body", "div", "span", "p", "form") and not (text or ident) and value in (None, ""):
            continue
        line = f"[{el['ref']}] {tag}" + (f' "{text[:80]}"' if text else "")
        line += f" id={ident}" if ident else ""
        line += f" class={classes}" if classes else ""
        line += f' value="{str(value)[:40]}"' if value not in (None, "", False) else ""
        lines.append(line)
    shown = lines[:limit]
    if len(lines) > limit:
        shown.append(f"... {len(lines) - limit} more elements not shown")
    return "\n".join(shown)


class MiniWoBEnv(Environment):
    """A MiniWoB++ task operated through tool calls (see the module docstring)."""

    name = "miniwob"
    description = ("MiniWoB++ web tasks in a headless Chromium (click-test-2, click-button, enter-text, login-user, "
                   "...): the page as text, click/type_text tools on element refs; options task, max_turns "
                   "(extra: miniwob).")
    options_model = MiniWoBOptions
    install = INSTALL_HINT

    def __init__(self, **options: Any) -> None:
        self.options = o = parse_env_options(MiniWoBOptions, "miniwob", options)
        self.task_name = o.task.removeprefix("miniwob/").removesuffix("-v1")
        known = task_names()
        if self.task_name not in known:
            import difflib

            close = difflib.get_close_matches(self.task_name, known, n=5)
            raise EnvError(f"miniwob task {o.task!r} is not registered"
                           + (f"; did you mean {', '.join(close)}?" if close else f" ({len(known)} tasks)"))
        _browser_paths()
        self.max_turns = o.max_turns
        self.gym: Any = None
        self._finalizer: Any = None
        self.elements: list[dict[str, Any]] = []
        self.info: dict[str, Any] = {}
        self.utterance = ""

    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        return game_tasks("miniwob", split, n, seed, "task", self.task_name)

    def _release(self) -> None:
        if self._finalizer is not None and self._finalizer.detach() is not None:
            BROWSERS.give_back(self.task_name, self.gym)
        self._finalizer, self.gym = None, None

    def reset(self, task: Task) -> ResetResult:
        check_game_task(task, "task", self.task_name)
        self._release()
        self.gym = BROWSERS.borrow(self.task_name)
        # an episode cut by trajtune's limits never reaches done: its browser returns when this object goes
        self._finalizer = weakref.finalize(self, BROWSERS.give_back, self.task_name, self.gym)
        obs, _ = self.gym.reset(seed=task.seed)
        self.elements, self.info = list(obs["dom_elements"]), {}
        self.utterance = str(obs["utterance"])
        return ResetResult(messages=[Message(role="system", content=INSTRUCTIONS, origin="system"),
                                     Message(role="user", content=f"Task: {self.utterance}\n\nPage:\n"
                                             f"{page_text(self.elements, self.options.max_elements)}",
                                             origin="environment")],
                           tools=list(TOOLS))

    def _action(self, name: str, args: dict[str, Any]) -> Any | str:
        """The MiniWoB action for a call, or the error message the model sees."""
        from miniwob.action import ActionTypes

        ref = args.get("ref")
        if isinstance(ref, bool) or not isinstance(ref, int):
            return f"Error: {name} needs an integer ref, got {ref!r}"
        if ref not in {int(el["ref"]) for el in self.elements}:
            return f"Error: no element [{ref}] on the page"
        if name == "click":
            return self.gym.unwrapped.create_action(ActionTypes.CLICK_ELEMENT, ref=ref)
        text = args.get("text")
        if not isinstance(text, str):
            return f"Error: type_text needs a string text, got {text!r}"
        return self.gym.unwrapped.create_action(ActionTypes.FOCUS_ELEMENT_AND_TYPE_TEXT, ref=ref, text=text)

    def step(self, action: Message) -> StepResult:
        calls = action.tool_calls or []
        if not calls:  # a text answer ends the episode: the page's checker did not say it is solved
            self._release()
            return StepResult(observations=[], reward=0.0, done=True, info={"success": False})
        out: list[Message] = []
        for i, c in enumerate(calls):
            if c.name not in ("click", "type_text"):
                out.append(tool_message(c.id, c.name, f"Error: unknown tool {c.name!r}; use click or type_text"))
                continue
            act = self._action(c.name, c.arguments or {})
            if isinstance(act, str):
                out.append(tool_message(c.id, c.name, act))
                continue
            obs, _, terminated, truncated, info = self.gym.step(act)
            if terminated or truncated:
                raw = float(info.get("raw_reward", 0.0))
                self.info = {"success": raw > 0, "miniwob_env_reward": float(info.get("env_reward", 0.0)),
                             "reason": info.get("reason")}
                out.append(tool_message(c.id, c.name, "The task is over."))
                out += [tool_message(d.id, d.name, "Error: the task is over") for d in calls[i + 1:]]
                self._release()
                return StepResult(observations=out, reward=raw, done=True,
                                  termination="done" if terminated else "max_turns", info=dict(self.info))
            self.elements = list(obs["dom_elements"])
            out.append(tool_message(c.id, c.name, f"Page:\n{page_text(self.elements, self.options.max_elements)}"))
        return StepResult(observations=out, reward=0.0, done=False)

    def success(self) -> bool:
        return bool(self.info.get("success"))

    def render(self) -> str:
        return f"[miniwob {self.task_name}] {self.utterance}\n{page_text(self.elements, 40)}"

    def expert(self, task: Task) -> Trajectory:
        """Click the button the instruction names (click-test, click-test-2, click-button)."""
        if self.task_name not in ("click-test", "click-test-2", "click-button"):
            raise NotImplementedError(f"miniwob task {self.task_name!r} has no scripted expert "
                                      "(click-test, click-test-2 and click-button have one)")
        from trajtune.envs.runner import run_episode
        from trajtune.schema import ToolCall

        def policy(messages: list[Message], tools: list[Any]) -> Message:
            m = re.search(r'[Cc]lick (?:on )?(?:the )?(?:button )?"?([^".]+?)"?(?: button)?\.?$', self.utterance)
            want = m.group(1).strip() if m else ""
            buttons = [el for el in self.elements if el.get("tag") == "button"]
            refs = [int(el["ref"]) for el in buttons if str(el.get("text") or "").strip() == want]
            refs = refs or ([int(buttons[0]["ref"])] if len(buttons) == 1 else [])  # "Click the button."
            if not refs:
                return Message(role="assistant", content=f"I cannot find the button {want!r}.")
            return Message(role="assistant", tool_calls=[ToolCall(id="call_0", name="click", arguments={"ref": refs[0]})])

        traj = run_episode(self, task, policy)
        traj.metadata.update({"expert": True, "policy": f"expert:{self.name}", "task": self.task_name})
        return traj
