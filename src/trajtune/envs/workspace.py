"""``workspace``: a stateful multi-tool world (accounts, orders, calendar, messaging).

What it trains: picking the right tool among near-duplicates (``add_credit`` vs
``transfer_credit``, ``create_event`` vs ``create_reminder``, ``send_email`` vs
``send_message``), chaining lookups (name -> account -> orders), and asking a clarifying
question when the request lacks a required argument instead of guessing it.

Success is checked on the final state: the intended change happened, and nothing else did
(no stray events, credits, cancellations or messages).
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

FIRST = ["Ada", "Bruno", "Chiara", "Dmitri", "Elena", "Farid", "Greta", "Hiro", "Ines", "Jonas", "Kavya", "Luca",
         "Mina", "Nils", "Olga", "Pavel", "Quinn", "Rosa", "Sami", "Tariq"]
LAST = ["Okafor", "Lindqvist", "Moreau", "Tanaka", "Silva", "Novak", "Haddad", "Berg", "Costa", "Weber"]
ITEMS = ["desk lamp", "keyboard", "monitor arm", "webcam", "headset", "office chair", "USB hub", "notebook"]
TITLES = ["Quarterly review", "Onboarding call", "Budget sync", "Design critique", "Contract renewal", "Demo prep"]
TIMES = ["09:00", "10:30", "11:00", "13:30", "14:00", "15:15", "16:45"]
KINDS = ("cancel_order", "schedule", "credit", "message", "schedule_clarify", "credit_clarify")


def _build(rng: random.Random) -> dict[str, Any]:
    names = rng.sample([f"{f} {l}" for f in FIRST for l in LAST], 6)
    accounts = {}
    for i, name in enumerate(names):
        aid = f"A{rng.randint(100, 999)}{i}"
        accounts[aid] = {"name": name, "email": name.lower().replace(" ", ".") + "@example.com",
                         "balance": rng.randint(0, 50) * 10}
    orders = {}
    for aid in accounts:
        for j in range(rng.randint(1, 3)):
            oid = f"O{rng.randint(1000, 9999)}{j}"
            orders[oid] = {"account_id": aid, "item": rng.choice(ITEMS), "qty": rng.randint(1, 4),
                           "status": rng.choice(["pending", "pending", "shipped", "delivered"]), "day": rng.randint(1, 28)}
    target = rng.choice(list(accounts))
    kind = rng.choice(KINDS)
    goal: dict[str, Any] = {"kind": kind, "account_id": target, "name": accounts[target]["name"]}
    if kind == "cancel_order":
        pend = [o for o, v in orders.items() if v["account_id"] == target and v["status"] == "pending"]
        if not pend:
            oid = f"O{rng.randint(1000, 9999)}9"
            orders[oid] = {"account_id": target, "item": rng.choice(ITEMS), "qty": 1, "status": "pending", "day": 1}
            pend = [oid]
        latest = max(pend, key=lambda o: (orders[o]["day"], o))
        goal["order_id"] = latest
    elif kind in ("schedule", "schedule_clarify"):
        goal.update(title=rng.choice(TITLES), date=f"2026-12-{rng.randint(1, 28):02d}", time=rng.choice(TIMES))
    elif kind in ("credit", "credit_clarify"):
        goal["amount"] = rng.randint(1, 20) * 5
    elif kind == "message":
        goal["text"] = f"Your {rng.choice(ITEMS)} is ready for pickup."
    return {"accounts": accounts, "orders": orders, "goal": goal}


def _prompt(goal: dict[str, Any]) -> str:
    k, name = goal["kind"], goal["name"]
    if k == "cancel_order":
        return f"Please cancel the most recent pending order of {name}."
    if k == "schedule":
        return f"Schedule a meeting titled '{goal['title']}' with {name} on {goal['date']} at {goal['time']}."
    if k == "schedule_clarify":
        return f"Schedule a meeting titled '{goal['title']}' with {name} on {goal['date']}."
    if k == "credit":
        return f"Add {goal['amount']} credit to {name}'s account as a goodwill gesture."
    if k == "credit_clarify":
        return f"Add some goodwill credit to {name}'s account."
    return f"Send {name} an email with the subject 'Pickup' and the body: {goal['text']}"


class WorkspaceEnv(ToolEnv):
    """Accounts, orders, calendar and messaging with near-duplicate tools and clarification tasks."""

    name = "workspace"
    description = ("Stateful multi-tool world (accounts, orders, calendar, messages) with near-duplicate tools "
                   "and tasks that need a clarifying question.")
    max_turns = 10
    system_prompt = ("You are a back-office assistant. Use the tools to do what the user asks. If the request is "
                     "missing information you need, ask the user a question instead of guessing. When finished, "
                     "reply with a short confirmation.")
    tool_names = ("find_account", "get_account", "list_orders", "cancel_order", "return_order", "add_credit",
                  "transfer_credit", "create_event", "create_reminder", "list_events", "send_email", "send_message")

    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        return make_tasks("workspace", split, n, seed, _build)

    def setup(self, task: Task) -> None:
        data = json.loads(json.dumps(task.data))  # deep copy: tasks are shared
        self.accounts: dict[str, dict[str, Any]] = data["accounts"]
        self.orders: dict[str, dict[str, Any]] = data["orders"]
        self.goal: dict[str, Any] = data["goal"]
        self.initial = json.loads(json.dumps({"accounts": self.accounts, "orders": self.orders}))
        self.events: list[dict[str, Any]] = []
        self.reminders: list[dict[str, Any]] = []
        self.outbox: list[dict[str, Any]] = []
        self.clarified = False
        self.asked_before_acting = None  # for clarify tasks: did the question come before any write?
        self.writes = 0

    def prompt(self, task: Task) -> str:
        return _prompt(task.data["goal"])

    # -- tools ---------------------------------------------------------------------------------
    def _account(self, account_id: str) -> dict[str, Any]:
        if account_id not in self.accounts:
            raise ToolError(f"no account with id {account_id!r}")
        return self.accounts[account_id]

    def find_account(self, name: str) -> list[dict[str, Any]]:
        """Find accounts whose holder's name contains the given name (case-insensitive).

        Args:
            name: full or partial name of the account holder
        """
        hits = [{"account_id": a, "name": v["name"], "email": v["email"]} for a, v in self.accounts.items()
                if name.lower().strip() in v["name"].lower()]
        if not hits:
            raise ToolError(f"no account matches {name!r}")
        return hits

    def get_account(self, account_id: str) -> dict[str, Any]:
        """Get an account's details (name, email, credit balance).

        Args:
            account_id: the account id, e.g. A1230
        """
        return {"account_id": account_id, **self._account(account_id)}

    def list_orders(self, account_id: str) -> list[dict[str, Any]]:
        """List an account's orders with their status and the day of December they were placed.

        Args:
            account_id: the account id
        """
        self._account(account_id)
        return [{"order_id": o, **{k: v for k, v in d.items() if k != "account_id"}}
                for o, d in sorted(self.orders.items()) if d["account_id"] == account_id]

    def _order(self, order_id: str) -> dict[str, Any]:
        if order_id not in self.orders:
            raise ToolError(f"no order with id {order_id!r}")
        return self.orders[order_id]

    def cancel_order(self, order_id: str) -> str:
        """Cancel an order that has not shipped yet.

        Args:
            order_id: the order id
        """
        o = self._order(order_id)
        if o["status"] != "pending":
            raise ToolError(f"order {order_id} is {o['status']} and cannot be cancelled; use return_order")
        o["status"] = "cancelled"
        self.writes += 1
        return f"order {order_id} cancelled"

    def return_order(self, order_id: str) -> str:
        """Start a return for an order that was already delivered.

        Args:
            order_id: the order id
        """
        o = self._order(order_id)
        if o["status"] != "delivered":
            raise ToolError(f"order {order_id} is {o['status']}; only delivered orders can be returned")
        o["status"] = "return_requested"
        self.writes += 1
        return f"return started for {order_id}"

    def add_credit(self, account_id: str, amount: int) -> str:
        """Grant new credit to one account (goodwill, compensation).

        Args:
            account_id: the account receiving the credit
            amount: credit to add, a positive whole number
        """
        if amount <= 0:
            raise ToolError("amount must be positive")
        a = self._account(account_id)
        a["balance"] += amount
        self.writes += 1
        return f"balance of {account_id} is now {a['balance']}"

    def transfer_credit(self, from_account_id: str, to_account_id: str, amount: int) -> str:
        """Move existing credit from one account to another.

        Args:
            from_account_id: account the credit is taken from
            to_account_id: account the credit goes to
            amount: credit to move, a positive whole number
        """
        src, dst = self._account(from_account_id), self._account(to_account_id)
        if amount <= 0 or src["balance"] < amount:
            raise ToolError("invalid amount or insufficient balance")
        src["balance"] -= amount
        dst["balance"] += amount
        self.writes += 1
        return f"moved {amount} from {from_account_id} to {to_account_id}"

    def create_event(self, title: str, date: str, time: str, attendees: list[str]) -> str:
        """Create a calendar meeting with attendees.

        Args:
            title: meeting title
            date: day in YYYY-MM-DD format
            time: start time in HH:MM (24h) format
            attendees: email addresses of the attendees
        """
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", date) or not re.fullmatch(r"\d{2}:\d{2}", time):
            raise ToolError("date must be YYYY-MM-DD and time HH:MM")
        self.events.append({"title": title, "date": date, "time": time, "attendees": sorted(attendees)})
        self.writes += 1
        return f"event {len(self.events)} created"

    def create_reminder(self, title: str, date: str) -> str:
        """Create a private reminder for yourself (no attendees, no time).

        Args:
            title: what to be reminded of
            date: day in YYYY-MM-DD format
        """
        self.reminders.append({"title": title, "date": date})
        self.writes += 1
        return "reminder saved"

    def list_events(self, date: str) -> list[dict[str, Any]]:
        """List calendar meetings on a day.

        Args:
            date: day in YYYY-MM-DD format
        """
        return [e for e in self.events if e["date"] == date]

    def send_email(self, to: str, subject: str, body: str) -> str:
        """Send an email to an email address.

        Args:
            to: recipient email address
            subject: subject line
            body: message text
        """
        self.outbox.append({"channel": "email", "to": to, "subject": subject, "body": body})
        self.writes += 1
        return "email sent"

    def send_message(self, to: str, text: str) -> str:
        """Send an instant chat message to a colleague's handle (not customers).

        Args:
            to: chat handle
            text: message text
        """
        self.outbox.append({"channel": "chat", "to": to, "text": text})
        self.writes += 1
        return "message sent"

    # -- dialogue and success --------------------------------------------------------------------
    def on_text(self, text: str) -> tuple[list[Message], bool]:
        kind = self.goal["kind"]
        if kind.endswith("_clarify") and not self.clarified and "?" in text:
            self.clarified = True
            if self.asked_before_acting is None:
                self.asked_before_acting = self.writes == 0
            answer = f"At {self.goal['time']}, please." if kind == "schedule_clarify" else f"{self.goal['amount']}, please."
            return [Message(role="user", content=answer, origin="user")], False
        self.final_answer = text
        return [], True

    def success(self) -> bool:
        g = self.goal
        k = g["kind"]
        acct = g["account_id"]
        orders_ok = self.orders == self.initial["orders"]
        balances_ok = self.accounts == self.initial["accounts"]
        if k == "cancel_order":
            expected = json.loads(json.dumps(self.initial["orders"]))
            expected[g["order_id"]]["status"] = "cancelled"
            return self.orders == expected and balances_ok and not self.events and not self.outbox and not self.reminders
        if k in ("schedule", "schedule_clarify"):
            want = {"title": g["title"], "date": g["date"], "time": g["time"],
                    "attendees": [self.initial["accounts"][acct]["email"]]}
            ok = self.events == [want] and not self.reminders and not self.outbox and orders_ok and balances_ok
            return ok and (k == "schedule" or bool(self.asked_before_acting))
        if k in ("credit", "credit_clarify"):
            expected = json.loads(json.dumps(self.initial["accounts"]))
            expected[acct]["balance"] += g["amount"]
            ok = self.accounts == expected and orders_ok and not self.events and not self.outbox and not self.reminders
            return ok and (k == "credit" or bool(self.asked_before_acting))
        email = self.initial["accounts"][acct]["email"]
        return (self.outbox == [{"channel": "email", "to": email, "subject": "Pickup", "body": g["text"]}]
                and orders_ok and balances_ok and not self.events)

    def state_view(self) -> str:
        return (f"goal={self.goal}\nevents={self.events} reminders={self.reminders} outbox={self.outbox}\n"
                f"balances={ {a: v['balance'] for a, v in self.accounts.items()} }")

    # -- expert -----------------------------------------------------------------------------------
    def expert_policy(self, task: Task) -> Callable[[list[Message], list[ToolSpec]], Message]:
        return scripted_policy(self._script(task.data["goal"]))

    def _script(self, g: dict[str, Any]) -> Generator[Message, str, None]:
        obs = yield assistant_call("find_account", name=g["name"])
        acct = json.loads(obs)[0]
        k = g["kind"]
        if k == "cancel_order":
            obs = yield assistant_call("list_orders", account_id=acct["account_id"])
            pend = [o for o in json.loads(obs) if o["status"] == "pending"]
            latest = max(pend, key=lambda o: (o["day"], o["order_id"]))
            yield assistant_call("cancel_order", order_id=latest["order_id"])
            yield assistant_text(f"Done: order {latest['order_id']} ({latest['item']}) is cancelled.")
        elif k in ("schedule", "schedule_clarify"):
            t = g["time"] if k == "schedule" else None
            if t is None:
                reply = yield assistant_text(f"What time should the meeting with {g['name']} on {g['date']} start?")
                t = re.search(r"\d{2}:\d{2}", reply).group(0)  # type: ignore[union-attr]
            yield assistant_call("create_event", title=g["title"], date=g["date"], time=t, attendees=[acct["email"]])
            yield assistant_text(f"Scheduled '{g['title']}' with {g['name']} on {g['date']} at {t}.")
        elif k in ("credit", "credit_clarify"):
            amount = g.get("amount") if k == "credit" else None
            if amount is None:
                reply = yield assistant_text(f"How much credit should I add to {g['name']}'s account?")
                amount = int(re.search(r"\d+", reply).group(0))  # type: ignore[union-attr]
            yield assistant_call("add_credit", account_id=acct["account_id"], amount=amount)
            yield assistant_text(f"Added {amount} credit to {g['name']}'s account.")
        else:
            yield assistant_call("send_email", to=acct["email"], subject="Pickup", body=g["text"])
            yield assistant_text(f"Emailed {g['name']}.")
