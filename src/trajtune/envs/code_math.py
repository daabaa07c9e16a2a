"""``code_math``: arithmetic word problems solved by running Python in the sandbox.

The numbers are drawn per task so the problems need computation (sums over ranges, prime counts,
compound growth), not recall. The agent has two tools: ``run_python`` (executed by
``trajtune.sandbox``, the only place trajtune runs code) and ``submit_answer``. Success is
checked on state: the submitted number equals the ground truth.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Generator
from typing import Any

from trajtune.envs.base import Task
from trajtune.envs.toolenv import ToolEnv, assistant_call, assistant_text, make_tasks, scripted_policy
from trajtune.envs.tools import ToolError
from trajtune.sandbox import SandboxLimits, run_python
from trajtune.schema import Message, ToolSpec


def _primes_below(n: int) -> int:
    sieve = bytearray([1]) * n
    sieve[0:2] = b"\x00\x00"[: min(2, n)]
    for i in range(2, int(n ** 0.5) + 1):
        if sieve[i]:
            sieve[i * i::i] = bytearray(len(range(i * i, n, i)))
    return sum(sieve)


def _build(rng: random.Random) -> dict[str, Any]:
    kind = rng.choice(["shop", "multiples", "primes", "interest", "digits"])
    if kind == "shop":
        a, p, b, q = rng.randint(3, 40), rng.randint(2, 19), rng.randint(2, 25), rng.randint(11, 60)
        text = (f"A shop sells pencils at {p} cents each and notebooks at {q} cents each. Maya buys {a} pencils and "
                f"{b} notebooks. How many cents does she pay in total?")
        code = f"print({a} * {p} + {b} * {q})"
        answer: float = a * p + b * q
    elif kind == "multiples":
        k1, k2, n = rng.choice([3, 4, 6, 7]), rng.choice([5, 9, 11]), rng.randint(200, 5000)
        text = f"What is the sum of all positive integers below {n} that are multiples of {k1} or {k2}?"
        code = f"print(sum(i for i in range(1, {n}) if i % {k1} == 0 or i % {k2} == 0))"
        answer = sum(i for i in range(1, n) if i % k1 == 0 or i % k2 == 0)
    elif kind == "primes":
        n = rng.randint(100, 20000)
        text = f"How many prime numbers are there below {n}?"
        code = (f"n = {n}\nsieve = [True] * n\nsieve[0] = sieve[1] = False\n"
                "for i in range(2, int(n ** 0.5) + 1):\n    if sieve[i]:\n        for j in range(i * i, n, i):\n"
                "            sieve[j] = False\nprint(sum(sieve))")
        answer = _primes_below(n)
    elif kind == "interest":
        principal, rate, years = rng.randint(10, 500) * 100, rng.choice([2, 3, 4, 5, 6, 7]), rng.randint(2, 30)
        text = (f"A deposit of {principal} dollars earns {rate}% interest per year, compounded yearly. What is it "
                f"worth after {years} years? Round to 2 decimal places.")
        code = f"print(round({principal} * (1 + {rate} / 100) ** {years}, 2))"
        answer = round(principal * (1 + rate / 100) ** years, 2)
    else:
        n = rng.randint(10, 60)
        text = f"What is the sum of the digits of 2 to the power {n * 7}?"
        code = f"print(sum(int(d) for d in str(2 ** {n * 7})))"
        answer = sum(int(d) for d in str(2 ** (n * 7)))
    return {"kind": kind, "question": text, "answer": answer, "reference_code": code}


class CodeMathEnv(ToolEnv):
    """Math word problems; the agent computes with ``run_python`` (sandboxed) and submits a number."""

    name = "code_math"
    description = "Math word problems solved by running Python in the sandbox; submit the number with submit_answer."
    max_turns = 6
    system_prompt = ("Solve the problem by writing Python code and running it with run_python (print the result). "
                     "Then call submit_answer with the final number and reply with a one-line summary.")
    tool_names = ("run_python", "submit_answer")

    def __init__(self, limits: SandboxLimits | None = None) -> None:
        super().__init__()
        self.limits = limits or SandboxLimits(cpu_s=2, wall_s=5.0, memory_mb=256, file_size_mb=1,
                                              max_output_bytes=8_000)

    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        return make_tasks("code_math", split, n, seed, _build)

    def setup(self, task: Task) -> None:
        self.submitted: float | None = None
        self.runs: list[str] = []

    def prompt(self, task: Task) -> str:
        return task.data["question"]

    def run_python(self, code: str) -> str:
        """Run a Python program in a sandbox and return what it printed.

        Args:
            code: a complete Python program; print the values you need
        """
        result = run_python(code, self.limits)
        self.runs.append(result.status)
        return result.observation() or "(no output)"

    def submit_answer(self, answer: float) -> str:
        """Submit the final numeric answer (a later submission replaces it), then reply to finish.

        Args:
            answer: the final number
        """
        self.submitted = float(answer)
        return "answer recorded"

    def success(self) -> bool:
        if self.submitted is None or self.task is None:
            return False
        truth = float(self.task.data["answer"])
        return math.isclose(self.submitted, truth, rel_tol=1e-9, abs_tol=1e-6)

    def state_view(self) -> str:
        return f"runs={self.runs} submitted={self.submitted}"

    def expert_policy(self, task: Task) -> Callable[[list[Message], list[ToolSpec]], Message]:
        return scripted_policy(self._script(task))

    def _script(self, task: Task) -> Generator[Message, str, None]:
        out = yield assistant_call("run_python", code=task.data["reference_code"])
        m = re.search(r"-?\d+(?:\.\d+)?", out)
        if m is None:
            raise ToolError(f"reference code printed no number: {out!r}")
        value = float(m.group(0))
        yield assistant_call("submit_answer", answer=int(value) if value.is_integer() else value)
        yield assistant_text(f"The answer is {m.group(0)}.")
