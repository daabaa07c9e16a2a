"""``trip``: a small TravelPlanner-style planning world with hard constraints (Planner-R1's setting).

Why: outcome-only rewards are hopeless on planning tasks (a plan either meets every constraint or
fails), which is what staged reward shaping and curricula are for. Here each task carries a
generated database and a request with hard constraints; the verifier reports, besides pass/fail,
whether the submitted plan is well formed and the fraction of constraints it meets, as named
reward terms in the final step's ``info["reward_terms"]`` (``schema_valid``, ``constraints``,
``pass``), which ``rl.reward`` can weigh by stage (``info.constraints`` …).

A task: travel from an origin to a destination for ``days`` days with ``people`` travellers, within
a budget. Tools: ``search_flights(origin, destination)``, ``search_hotels(city)``,
``search_restaurants(city)``, and ``submit_plan(flight, hotel, restaurants)`` (a flight number, a
hotel name, one restaurant name per day; once per episode); the agent's final reply ends the
episode, and the final step's reward and terms judge the submitted plan (none: all 0).

Difficulty (``task.data["difficulty"]``, the knob ``difficulty=`` keeps one level):

- 0: the budget only;
- 1: + a cuisine (every restaurant of the plan serves it);
- 2: + a room rule (the hotel allows pets / is non-smoking) and the hotel must sleep the whole party.

Constraints checked: budget (flight × people + hotel × nights + Σ restaurant price × people), and
at levels ≥ 1 and 2 the ones above. Schema: the flight exists and goes origin → destination, the
hotel and restaurants exist in the destination, one restaurant per day. Every task is solvable:
the budget is drawn above the cheapest plan that meets every constraint. The scripted expert
searches, then submits that cheapest plan.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Generator
from typing import Any

from trajtune.envs.base import StepResult, Task
from trajtune.envs.toolenv import ToolEnv, assistant_call, assistant_text, make_tasks, scripted_policy
from trajtune.envs.tools import ToolError
from trajtune.schema import Message, ToolSpec

CITIES = ["Avalon", "Brightwater", "Cedarport", "Dunmore", "Eastvale", "Fairhaven"]
CUISINES = ["italian", "thai", "mexican", "indian", "french"]
RULES = ["pets allowed", "non-smoking"]
HOTEL_WORDS = ["Grand", "Harbor", "Garden", "Plaza", "Summit", "Lakeside"]
FOOD_WORDS = ["Olive", "Lotus", "Cactus", "Saffron", "Bistro", "Ember", "Maple"]


def _build(rng: random.Random, level: int | None) -> dict[str, Any]:
    difficulty = rng.randrange(3) if level is None else level
    origin, dest = rng.sample(CITIES, 2)
    days, people = rng.randint(2, 4), rng.randint(1, 3)
    numbers = rng.sample(range(100, 1000), 4)  # distinct flight numbers
    flights = [{"flight": f"F{n}", "from": origin, "to": dest, "price": rng.randrange(80, 400)} for n in numbers[:3]]
    flights += [{"flight": f"F{numbers[3]}", "from": origin,
                 "to": rng.choice([c for c in CITIES if c not in (origin, dest)]), "price": rng.randrange(60, 200)}]
    hotels = [{"name": f"{w} {dest} Hotel", "city": dest, "price_per_night": rng.randrange(60, 300),
               "rules": sorted(rng.sample(RULES, rng.randint(0, 2))), "max_guests": rng.randint(1, 4)}
              for w in rng.sample(HOTEL_WORDS, 4)]
    restaurants = [{"name": f"{w} {dest}", "city": dest, "cuisine": rng.choice(CUISINES), "price": rng.randrange(10, 60)}
                   for w in rng.sample(FOOD_WORDS, 6)]
    want: dict[str, Any] = {}
    if difficulty >= 1:
        want["cuisine"] = rng.choice(sorted({r["cuisine"] for r in restaurants}))
    if difficulty >= 2:
        ok_rules = [x for x in RULES if any(x in h["rules"] and h["max_guests"] >= people for h in hotels)]
        if not ok_rules:  # make one hotel fit, so the task stays solvable
            hotels[0]["rules"], hotels[0]["max_guests"] = sorted(RULES), max(people, hotels[0]["max_guests"])
            ok_rules = list(RULES)
        want["room_rule"] = rng.choice(ok_rules)
        want["guests"] = people
    data = {"origin": origin, "destination": dest, "days": days, "people": people, "difficulty": difficulty,
            "flights": flights, "hotels": hotels, "restaurants": restaurants, "want": want}
    best = cheapest_plan(data)
    assert best is not None
    data["budget"] = int(plan_cost(data, *best) * rng.uniform(1.1, 1.4)) + 1
    return data


def plan_cost(data: dict[str, Any], flight: str, hotel: str, restaurants: list[str]) -> float:
    f = next(x for x in data["flights"] if x["flight"] == flight)
    h = next(x for x in data["hotels"] if x["name"] == hotel)
    food = {r["name"]: r["price"] for r in data["restaurants"]}
    nights = data["days"] - 1
    return f["price"] * data["people"] + h["price_per_night"] * nights + sum(food[r] for r in restaurants) * data["people"]


def cheapest_plan(data: dict[str, Any]) -> tuple[str, str, list[str]] | None:
    """The cheapest plan that meets every constraint but the budget (None if there is none)."""
    want = data["want"]
    flights = [f for f in data["flights"] if f["to"] == data["destination"]]
    hotels = [h for h in data["hotels"] if ("room_rule" not in want or want["room_rule"] in h["rules"])
              and h["max_guests"] >= want.get("guests", 0)]
    food = [r for r in data["restaurants"] if "cuisine" not in want or r["cuisine"] == want["cuisine"]]
    if not flights or not hotels or not food:
        return None
    f = min(flights, key=lambda x: (x["price"], x["flight"]))
    h = min(hotels, key=lambda x: (x["price_per_night"], x["name"]))
    r = min(food, key=lambda x: (x["price"], x["name"]))
    return f["flight"], h["name"], [r["name"]] * data["days"]


def verify(data: dict[str, Any], flight: Any, hotel: Any, restaurants: Any) -> dict[str, Any]:
    """``{"schema_valid", "constraints" (fraction met), "pass", "failed": [names]}`` for a plan."""
    problems = []
    f = next((x for x in data["flights"] if x["flight"] == flight), None)
    if f is None or f["from"] != data["origin"] or f["to"] != data["destination"]:
        problems.append("flight")
    h = next((x for x in data["hotels"] if x["name"] == hotel), None)
    if h is None:
        problems.append("hotel")
    names = {r["name"]: r for r in data["restaurants"]}
    if not isinstance(restaurants, list) or len(restaurants) != data["days"] or \
            any(not isinstance(r, str) or r not in names for r in restaurants):
        problems.append("restaurants")
    if problems:
        return {"schema_valid": 0.0, "constraints": 0.0, "pass": 0.0, "failed": [f"schema: {p}" for p in problems]}
    want = data["want"]
    checks = {"budget": plan_cost(data, flight, hotel, restaurants) <= data["budget"]}
    if "cuisine" in want:
        checks["cuisine"] = all(names[r]["cuisine"] == want["cuisine"] for r in restaurants)
    if "room_rule" in want:
        checks["room_rule"] = want["room_rule"] in h["rules"]  # type: ignore[index]
        checks["guests"] = h["max_guests"] >= want["guests"]  # type: ignore[index]
    met = sum(checks.values()) / len(checks)
    return {"schema_valid": 1.0, "constraints": met, "pass": float(met == 1.0),
            "failed": sorted(k for k, v in checks.items() if not v)}


PASS_FEEDBACK = "all constraints pass"


def feedback_text(verdict: dict[str, Any] | None) -> str:
    """The verifier's pass/fail summary of a plan (FAFT conditions on it; at inference the slot says
    ``PASS_FEEDBACK``)."""
    if verdict is None:
        return "no plan was submitted"
    if not verdict["failed"]:
        return PASS_FEEDBACK
    return "the plan fails: " + ", ".join(verdict["failed"])


def _request(data: dict[str, Any]) -> str:
    want = data["want"]
    who = "1 person" if data["people"] == 1 else f"{data['people']} people"
    parts = [f"Plan a {data['days']}-day trip from {data['origin']} to {data['destination']} for {who}, "
             f"with a total budget of ${data['budget']} (flight per person, hotel per night for "
             f"{data['days'] - 1} nights, one restaurant per day, meals per person)."]
    if "cuisine" in want:
        parts.append(f"Every restaurant must serve {want['cuisine']} food.")
    if "room_rule" in want:
        party = "" if data["people"] == 1 else f" and sleep all {data['people']} of us"
        parts.append(f"The hotel must be {want['room_rule']}{party}.")
    parts.append("Submit the plan with submit_plan.")
    return " ".join(parts)


class TripEnv(ToolEnv):
    """Plan a trip under hard constraints; the verifier reports schema validity, the fraction of
    constraints met and pass/fail as named reward terms."""

    name = "trip"
    description = ("TravelPlanner-style trips under hard constraints (budget, cuisine, room rules); reward terms "
                   "schema_valid, constraints (fraction met), pass; difficulty 0-2.")
    max_turns = 6
    reward_terms = ("schema_valid", "constraints", "pass")
    system_prompt = ("You plan trips. Search flights, hotels and restaurants with the tools, submit one plan that "
                     "meets every constraint with submit_plan, then reply with one line.")
    tool_names = ("search_flights", "search_hotels", "search_restaurants", "submit_plan")

    def __init__(self, difficulty: int | None = None) -> None:
        super().__init__()
        if difficulty is not None and difficulty not in (0, 1, 2):
            raise ValueError(f"trip: difficulty must be 0, 1 or 2 (or omitted for all), got {difficulty!r}")
        self.difficulty = difficulty

    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        return make_tasks("trip", split, n, seed, lambda rng: _build(rng, self.difficulty))

    def setup(self, task: Task) -> None:
        self.verdict: dict[str, Any] | None = None

    def prompt(self, task: Task) -> str:
        return _request(task.data)

    def search_flights(self, origin: str, destination: str) -> str:
        """Flights from one city to another, with their price per person.

        Args:
            origin: the departure city
            destination: the arrival city
        """
        assert self.task is not None
        got = [f for f in self.task.data["flights"] if f["from"] == origin and f["to"] == destination]
        if not got:
            raise ToolError(f"no flights from {origin!r} to {destination!r}")
        return json.dumps(got)

    def search_hotels(self, city: str) -> str:
        """Hotels in a city: price per night, house rules, how many guests a room sleeps.

        Args:
            city: the city
        """
        return self._in_city("hotels", city)

    def search_restaurants(self, city: str) -> str:
        """Restaurants in a city: cuisine and price per person.

        Args:
            city: the city
        """
        return self._in_city("restaurants", city)

    def _in_city(self, table: str, city: str) -> str:
        assert self.task is not None
        got = [x for x in self.task.data[table] if x["city"] == city]
        if not got:
            raise ToolError(f"no {table} in {city!r}")
        return json.dumps(got)

    def submit_plan(self, flight: str, hotel: str, restaurants: list[str]) -> str:
        """Submit the final plan (once; then reply to the user).

        Args:
            flight: the flight number, e.g. F123
            hotel: the hotel's name
            restaurants: one restaurant name per day, in order
        """
        assert self.task is not None
        if self.verdict is not None:
            raise ToolError("a plan was already submitted; reply to the user")
        self.verdict = verify(self.task.data, flight, hotel, restaurants)
        failed = self.verdict["failed"]
        return "plan accepted" if not failed else f"plan submitted; it does not meet: {', '.join(failed)}"

    def step(self, action: Message) -> StepResult:
        res = super().step(action)
        if res.done:
            v = self.verdict or {"schema_valid": 0.0, "constraints": 0.0, "pass": 0.0}
            res.info = {**res.info, "reward_terms": {k: float(v[k]) for k in ("schema_valid", "constraints", "pass")},
                        "feedback": feedback_text(self.verdict)}
        return res

    def success(self) -> bool:
        return bool(self.verdict and self.verdict["pass"] == 1.0)

    def state_view(self) -> str:
        return f"verdict={json.dumps(self.verdict)}"

    def expert_policy(self, task: Task) -> Callable[[list[Message], list[ToolSpec]], Message]:
        return scripted_policy(self._script(task))

    def _script(self, task: Task) -> Generator[Message, str, None]:
        """Search, read the results, submit the cheapest plan that meets every constraint."""
        d = task.data
        seen: dict[str, Any] = {}
        seen["flights"] = json.loads((yield assistant_call("search_flights", origin=d["origin"],
                                                           destination=d["destination"])))
        seen["hotels"] = json.loads((yield assistant_call("search_hotels", city=d["destination"])))
        seen["restaurants"] = json.loads((yield assistant_call("search_restaurants", city=d["destination"])))
        plan = cheapest_plan({**d, **seen})
        assert plan is not None
        yield assistant_call("submit_plan", flight=plan[0], hotel=plan[1], restaurants=plan[2])
        yield assistant_text("Your trip is planned.")
