"""Property test: every registered tool-call parser, and the eval store behind them, survive deep,
huge and odd input — no exception escapes and every call ends in bounded time.

Inputs come from a seeded generator (reproducible; ``hypothesis`` is not a dependency): nesting
1000+ levels deep, 1 MB texts, lone surrogates, NUL bytes, unterminated tags, bracket and
whitespace storms after every format's markers. "Bounded" is checked with a generous per-input
limit: the steps run in a forked child process that reports each step's start and end, and the
parent kills it when one step takes longer than BOUND_S seconds (a thread would not do: a
backtracking regex holds the GIL). The inputs are sized so that a linear parser needs well under
a second and a quadratic one hours, so the limit separates the two without being a benchmark.
"""

from __future__ import annotations

import multiprocessing
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from trajtune.chat import parsers as P
from trajtune.chat.parsers import ParseResult, available_parsers, parse_tool_calls
from trajtune.eval.store import EvalStore
from trajtune.schema import Message, Outcome, ToolCall, Trajectory

BOUND_S = 120.0
MB = 1 << 20

MARKERS = ["<tool_call>", "</tool_call>", "[TOOL_CALLS]", "[ARGS]", "<|python_tag|>", '{"name": ', "[f(", "```tool_code\n",
           "Action: ", "Action Input: ", "Observation:", "Final Answer: ", "<think>", "</think>",
           "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>"]
ODD = ["\ud800", "\udfff", "\x00", "\\", '"', "'", "'''", '"""', "#", "\n", "\r", "\t", " ", "é", "💥", "\u2028",
       "{", "}", "[", "]", "(", ")", ",", ":", "=", "True", "null", "NaN", "1e999", "-", "not "]


def _deep_json(n: int) -> str:
    return '{"a": ' * n + "[1]" + "}" * n


def _corpus(seed: int = 1234) -> dict[str, str]:
    """Named adversarial texts: fixed worst cases plus seeded random mixtures of markers and odd pieces."""
    rng = random.Random(seed)
    ws = " " * MB
    fixed = {
        "pythonic_bracket_storm": "[f(a='" + "]" * MB,
        "open_bracket_storm": "[" * MB,
        "call_open_storm": "[f(" * (MB // 3),
        "many_pythonic_calls": "[" + "f(a=1)," * (200_000 // 7) + "]",
        "string_storm": "[f(a=" + "'" * MB + ")]",
        "deep_json_in_every_format": "\n".join(m + _deep_json(1000) for m in MARKERS),
        "deep_pythonic": "[f(a=" + "[" * 1000 + "]" * 1000 + ")]",
        "deep_unary": "[f(a=" + "-" * 100_000 + "1)]",
        "whitespace_after_markers": ws.join(MARKERS),
        "deepseek_whitespace_name": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f" + ws,
        "deepseek_whitespace_body": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n" + ws,
        "marker_storm": "".join(MARKERS) * (MB // sum(map(len, MARKERS))),
        "react_action_storm": "Action: f[\n" * (MB // 11),
        "nul_and_surrogates": ("\x00\ud800<tool_call>{\"name\": \"\udfff\", \"arguments\": {\"\ud800\": 1}}</tool_call>"
                               * 2000),
        "single_quoted_hermes": "<tool_call>{'name': 'f', 'arguments': {'a': (1, 2), 'b': {1, 2}}}</tool_call>" * 100,
    }
    for i in range(24):
        pieces = [rng.choice(MARKERS if rng.random() < 0.4 else ODD) * rng.choice([1, 1, 2, 50, 2000])
                  for _ in range(rng.randint(5, 400))]
        fixed[f"random_{i}"] = "".join(pieces)
    return fixed


CORPUS = _corpus()


Step = tuple[str, Callable[[], Any]]


def _child(steps: Callable[[], Iterator[Step]], conn: Any) -> None:
    label = "setup"
    try:
        for label, fn in steps():
            conn.send(("start", label))
            fn()
            conn.send(("done", label))
        conn.send(("end", ""))
    except BaseException as e:  # noqa: BLE001 - any escape is the failure we test for
        conn.send(("error", f"{label}: raised {type(e).__name__}: {str(e)[:300]}"))


def _run_bounded(steps: Callable[[], Iterator[Step]]) -> int:
    """Run ``steps()`` in a forked child; fail on the first step that raises or runs past BOUND_S."""
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(steps, child), daemon=True)
    proc.start()
    current, done = "setup", 0
    try:
        while True:
            if not parent.poll(BOUND_S):
                pytest.fail(f"{current}: still running after {BOUND_S:.0f} s (super-linear on this input?)")
            try:
                kind, label = parent.recv()
            except EOFError:
                pytest.fail(f"{current}: the process died (exit code {proc.exitcode})")
            if kind == "error":
                pytest.fail(label)
            if kind == "end":
                return done
            current = label
            done += kind == "done"
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()


def _check(r: Any) -> ParseResult:
    assert isinstance(r, ParseResult) and isinstance(r.content, str) and isinstance(r.errors, list)
    assert all(isinstance(c, ToolCall) for c in r.tool_calls)
    return r


def test_corpus_is_deep_huge_and_odd():
    assert max(len(t) for t in CORPUS.values()) >= MB
    assert any("\ud800" in t for t in CORPUS.values()) and any("\x00" in t for t in CORPUS.values())
    assert any(t.count("[") >= 1000 for t in CORPUS.values())


@pytest.mark.parametrize("name", available_parsers())
def test_every_parser_survives_the_corpus(name, tmp_path):
    raw = P._PARSERS[name]
    results: list[Trajectory] = []

    def parse_both(key: str, text: str) -> None:
        _check(raw(text))
        r = _check(parse_tool_calls(text, name, reasoning=True))
        # what the parser recovered is data a run must be able to store
        results.append(Trajectory(
            id=f"{name}-{key}", messages=[Message(role="user", content="q"),
                                          Message(role="assistant", content=r.content[:1000] or None,
                                                  tool_calls=r.tool_calls[:50] or None, origin="agent")],
            outcome=Outcome(success=False, termination="done"),
            metadata={"eval": {"task_id": f"{name}-{key}", "sample": 0}, "parse_errors": r.errors[:20]}))

    def store_and_resume() -> None:
        with EvalStore(tmp_path / "ev", {"parser": name}) as store:
            store.append(results)
        with EvalStore(tmp_path / "ev", {"parser": name}, resume=True) as again:
            assert len(again.done) == len(results) == len(CORPUS)

    def steps() -> Iterator[Step]:
        for key, text in CORPUS.items():
            yield f"{name} on {key}", lambda key=key, text=text: parse_both(key, text)
        yield f"EvalStore.append of the {name} results", store_and_resume

    assert _run_bounded(steps) == len(CORPUS) + 1


def _odd_values(rng: random.Random) -> list[Any]:
    deep: Any = "leaf"
    for i in range(1000):
        deep = [deep] if i % 2 else {"k": deep}
    wide = {f"k{i}": rng.choice(ODD) * rng.randint(1, 50) for i in range(2000)}
    return [deep, wide, {"huge": "x" * MB}, {"\ud800": "\udfff\x00"}, {"nan": float("nan"), "inf": float("inf")},
            [[[[[]]]]] * 1000, {"n": 10 ** 400}]


def test_eval_store_append_survives_deep_huge_and_odd_values(tmp_path):
    rng = random.Random(99)
    trajs = []
    for i, v in enumerate(_odd_values(rng)):
        trajs.append(Trajectory(
            id=f"t{i}", messages=[Message(role="user", content=rng.choice(ODD) * 1000),
                                  Message(role="assistant", content="\ud800 \x00",
                                          tool_calls=[ToolCall(id="c", name="f", arguments={"v": v},
                                                               arguments_raw=rng.choice(ODD) * 100)],
                                          extra={"v": v})],
            metadata={"eval": {"task_id": f"t{i}", "sample": 0}, "v": v}))

    def append_and_resume() -> None:
        with EvalStore(tmp_path / "ev", {}) as store:
            store.append(trajs)
        with EvalStore(tmp_path / "ev", {}, resume=True) as again:
            assert sorted(again.done) == sorted((f"t{i}", 0) for i in range(len(trajs)))
            # lone surrogates survive the file (written as JSON escapes)
            assert again.done[("t0", 0)].messages[1].content == "\ud800 \x00"

    assert _run_bounded(lambda: iter([("EvalStore.append", append_and_resume)])) == 1
