"""An LLM judge in `trajtune eval`: replies parsed robustly (never evaluated), failures counted and
reported, exact aggregates, the CLI end to end against a scripted OpenAI-compatible server, an
unreachable judge named in one line, and `trajtune serve` (or a local model) as the judge."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from typer.testing import CliRunner

from trajtune.cli.main import app
from trajtune.errors import ModelLoadError
from trajtune.eval.metrics import summarize
from trajtune.judge import DEFAULT_RUBRIC, Judge, JudgeParseError, make_judge, parse_score, render_episode
from trajtune.schema import Message, Outcome, ToolCall, ToolSpec, Trajectory

runner = CliRunner()


class FakeJudgeServer:
    """A stdlib OpenAI-compatible server that answers chat completions with scripted replies, in order,
    or with what ``replies`` (a function of the request body) returns."""

    def __init__(self, replies: list[str] | Callable[[dict], str]):
        self.replies = replies if callable(replies) else list(replies)
        self.requests: list[dict] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802
                self._send({"object": "list", "data": [{"id": "fake-judge", "object": "model"}]})

            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append(body)
                text = (fake.replies(body) if callable(fake.replies)
                        else fake.replies[(len(fake.requests) - 1) % len(fake.replies)])
                self._send({"object": "chat.completion", "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]})

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}/v1"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()


@pytest.fixture()
def fake_judge():
    servers = []

    def start(replies: list[str]) -> FakeJudgeServer:
        servers.append(FakeJudgeServer(replies))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def _episode(i: int) -> Trajectory:
    call = ToolCall(id="c1", name="lookup", arguments={"city": "Paris"})
    return Trajectory(id=f"ep{i}", tools=[ToolSpec(name="lookup", description="look a city up",
                                                   parameters={"type": "object"})],
                      messages=[Message(role="system", content="be helpful"),
                                Message(role="user", content=f"task {i}: what is the weather in Paris?"),
                                Message(role="assistant", content="Let me check.", tool_calls=[call], origin="agent"),
                                Message(role="tool", name="lookup", tool_call_id="c1", content="sunny, 21 C"),
                                Message(role="assistant", content="It is sunny.", origin="agent")],
                      outcome=Outcome(success=True, final_answer="It is sunny.", termination="done"), reward=1.0)


def test_scores_are_parsed_from_json_or_a_score_line_and_never_evaluated():
    assert parse_score('{"score": 8, "reason": "did it"}') == (8.0, "did it")
    assert parse_score('Sure.\n```json\n{"score": "6.5", "reason": "ok"}\n```') == (6.5, "ok")
    assert parse_score('thinking {not json} then {"verdict": 1} then {"score": 3}')[0] == 3.0
    assert parse_score("The agent did well.\nScore: 7")[0] == 7.0
    assert parse_score("**Score:** 9/10 - good")[0] == 9.0
    assert parse_score("score: 2\nrevised\nSCORE = 4")[0] == 4.0  # the last score line is the verdict
    for bad in ("garbage", "", '{"score": NaN}', '{"score": true}', '{"score": __import__("os").getpid()}',
                "I would give it a seven", '{"reason": "no score"}'):
        with pytest.raises(JudgeParseError):
            parse_score(bad)


def test_the_judge_sees_task_calls_results_and_final_answer():
    text = render_episode(_episode(0))
    for needle in ("task 0: what is the weather in Paris?", 'lookup({"city": "Paris"})', "[tool result lookup] sunny",
                   "It is sunny.", "## Final answer", "done"):
        assert needle in text, needle
    assert "be helpful" not in text  # the system prompt is not the task


def test_verdicts_and_metrics_with_known_numbers(fake_judge):
    srv = fake_judge(['{"score": 9, "reason": "right"}', "Reasoning...\nScore: 6", "no idea, sorry",
                      '```json\n{"score": 3, "reason": "wrong tool"}\n```'])
    judge = make_judge(f"openai:{srv.url}", model="fake-judge", workers=1)
    eps = [_episode(i) for i in range(4)]
    for i, e in enumerate(eps):
        e.metadata["eval"] = {"task_id": f"t{i}", "sample": 0, "category": "a" if i < 2 else "b"}
    judge.annotate(eps)
    assert [e.metadata["judge"]["score"] for e in eps] == [9.0, 6.0, None, 3.0]
    assert eps[0].metadata["judge"]["reason"] == "right" and eps[0].metadata["judge"]["judge"] == f"openai:{srv.url}"
    failed = eps[2].metadata["judge"]
    assert failed["raw"] == "no idea, sorry" and "no score" in failed["error"]
    m = summarize(eps)
    assert m["judge"] == {"episodes": 4, "scored": 3, "parse_failures": 1, "mean_score": 6.0}
    assert m["categories"]["a"]["judge"]["mean_score"] == 7.5 and m["categories"]["b"]["judge"]["parse_failures"] == 1
    body = srv.requests[0]
    assert body["model"] == "fake-judge" and body["temperature"] == 0.0 and body["max_tokens"] == 256
    assert body["messages"][0]["role"] == "system" and DEFAULT_RUBRIC.strip() in body["messages"][0]["content"]
    assert "task 0" in body["messages"][1]["content"]
    assert "judge" not in summarize([_episode(9)])  # unjudged episodes: no judge block
    srv.close()  # a judge that goes away mid-run: one clear error naming it, not scores quietly missing
    with pytest.raises(ModelLoadError, match=srv.url.replace(".", r"\.")):
        judge.annotate([_episode(5)])


def test_eval_cli_with_a_judge_end_to_end(fake_judge, tiny_dir, tmp_path):
    srv = fake_judge(['{"score": 8, "reason": "fine"}', "Score: 7", "garbage"])
    rubric = tmp_path / "rubric.md"
    rubric.write_text("# My rubric\nGive 0-10 for politeness.\n")
    out = tmp_path / "eval"
    r = runner.invoke(app, ["eval", "--model", str(tiny_dir), "--env", "home", "--tasks", "3", "--max-turns", "1",
                            "--max-new-tokens", "4", "--workers", "1", "--judge", f"openai:{srv.url}",
                            "--judge-model", "fake-judge", "--judge-rubric", str(rubric), "--judge-max-tokens", "64",
                            "--out", str(out)])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["metrics"]["judge"] == {"episodes": 3, "scored": 2, "parse_failures": 1, "mean_score": 7.5}
    assert "no score for 1 of 3 episodes" in r.stderr  # reported, not dropped
    eps = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
    assert [e["metadata"]["judge"].get("score") for e in eps] == [8.0, 7.0, None]
    assert json.loads((out / "results.json").read_text())["metrics"]["judge"]["mean_score"] == 7.5
    assert all(b["model"] == "fake-judge" and b["max_tokens"] == 64 and "politeness" in b["messages"][0]["content"]
               for b in srv.requests)
    assert json.loads((out / "run.json").read_text())["judge"] == f"openai:{srv.url}"
    assert "judge.mean_score" in (out / "report.html").read_text()  # the report shows the judge too


def test_an_unreachable_judge_is_one_line_naming_the_url(tiny_dir, tmp_path):
    url = "http://127.0.0.1:9/v1"
    r = runner.invoke(app, ["eval", "--model", str(tiny_dir), "--env", "home", "--tasks", "1", "--judge",
                            f"openai:{url}", "--out", str(tmp_path / "e")])
    assert r.exit_code == 4, r.output
    line = r.output.strip()
    assert "\n" not in line and url in line and line.startswith("error:")
    assert not (tmp_path / "e").exists()  # refused before anything was written
    r = runner.invoke(app, ["eval", "--model", str(tiny_dir), "--env", "home", "--judge-model", "x"])
    assert r.exit_code == 2 and "--judge" in r.output
    r = runner.invoke(app, ["eval", "--model", str(tiny_dir), "--env", "home", "--judge", "openai:nope"])
    assert r.exit_code == 2 and "openai:http" in r.output


def test_trajtune_serve_or_a_local_model_can_be_the_judge(tiny_model, tiny_tok, tiny_dir):
    """A tiny random model writes no score: every episode is still judged, the failures counted."""
    from trajtune.chat.render import ChatRenderer
    from trajtune.serve import ChatService, make_server

    srv = make_server(ChatService(tiny_model, tiny_tok, ChatRenderer(tiny_tok), name="tiny", max_tokens=8),
                      "127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        for judge in (make_judge(f"openai:http://127.0.0.1:{srv.server_address[1]}/v1", max_tokens=8),
                      make_judge(str(tiny_dir), max_tokens=8)):
            assert isinstance(judge, Judge)
            eps = [_episode(i) for i in range(2)]
            judge.annotate(eps)
            verdicts = [e.metadata["judge"] for e in eps]
            assert all(("score" in v) and (v["score"] is not None or "raw" in v) for v in verdicts)
            m = summarize(eps)["judge"]
            assert m["episodes"] == 2 and m["scored"] + m["parse_failures"] == 2
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_response_without_a_message_is_a_counted_failure():
    judge = Judge(lambda body: {"choices": []}, name="stub")
    ep = _episode(0)
    judge.annotate([ep])
    assert ep.metadata["judge"]["score"] is None and "no choices[0].message" in ep.metadata["judge"]["error"]
    assert summarize([ep])["judge"]["parse_failures"] == 1
