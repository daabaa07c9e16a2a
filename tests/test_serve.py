"""`trajtune serve`: OpenAI-compatible answers with exact token ids and log-probs, clear errors,
and `data generate --policy openai:URL` (teacher distillation) against it."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest
from typer.testing import CliRunner

from trajtune.algorithms.batch import collate, token_logprobs
from trajtune.chat.render import ChatRenderer
from trajtune.cli.main import app
from trajtune.envs import make_env
from trajtune.envs.adapters.openai_policy import to_openai_messages
from trajtune.serve import ChatService, make_server
from trajtune.tokens import SOURCE_POLICY, SOURCE_PROMPT, TokenTrajectory

runner = CliRunner()


@pytest.fixture()
def server(tiny_model, tiny_tok):
    service = ChatService(tiny_model, tiny_tok, ChatRenderer(tiny_tok), name="tiny", max_tokens=12)
    srv = make_server(service, "127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1", service
    srv.shutdown()
    srv.server_close()


def _post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_chat_completion_returns_exact_tokens_and_log_probs(server, tiny_model, tiny_tok):
    url, service = server
    env = make_env("home")
    res = env.reset(env.tasks("test", 1, seed=0)[0])
    body = {"model": "tiny", "messages": to_openai_messages(res.messages), "tools": [t.to_openai() for t in res.tools],
            "temperature": 0.9, "max_tokens": 10, "seed": 3, "logprobs": True}
    status, out = _post(url, body)
    assert status == 200 and out["object"] == "chat.completion"
    r = ChatRenderer(tiny_tok)
    assert out["prompt_token_ids"] == r.encode(r.prompt_text(res.messages, res.tools))  # as training renders it
    choice = out["choices"][0]
    ids = choice["token_ids"]
    assert 1 <= len(ids) <= 10 and out["usage"]["completion_tokens"] == len(ids)
    lps = [x["logprob"] for x in choice["logprobs"]["content"]]
    assert len(lps) == len(ids)
    prompt = out["prompt_token_ids"]
    row = TokenTrajectory(ids=prompt + ids, source=[SOURCE_PROMPT] * len(prompt) + [SOURCE_POLICY] * len(ids),
                          turn=[0] * (len(prompt) + len(ids)), weight=[0.0] * len(prompt) + [1.0] * len(ids),
                          logprobs=[0.0] * len(prompt) + lps)
    b = collate([row], 0)
    lp, _ = token_logprobs(tiny_model, b, temperature=0.9)
    m = b.source[:, 1:] == SOURCE_POLICY
    assert float(((lp.detach() - b.old_logprobs[:, 1:]).abs() * m).max()) < 1e-3
    assert _post(url, body)[1]["choices"][0]["token_ids"] == ids  # same seed, same sample
    if choice["finish_reason"] == "length":
        assert len(ids) == 10
    with urllib.request.urlopen(url + "/models", timeout=10) as resp:
        assert json.loads(resp.read())["data"][0]["id"] == "tiny"


def test_bad_requests_get_a_400_and_the_server_stays_up(server):
    url, _ = server
    for body, needle in [({"messages": []}, "non-empty"), ({"messages": [{"role": "user", "content": "hi"}], "n": 3},
                                                           "`n` is not supported"),
                         ({"messages": [{"role": "wizard", "content": "x"}]}, "do not convert"),
                         ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "max_tokens"),
                         # a streaming client must not get a non-streamed body it cannot read
                         ({"messages": [{"role": "user", "content": "hi"}], "stream": True},
                          "`stream` is not supported")]:
        status, out = _post(url, body)
        assert status == 400 and needle in out["error"]["message"], (body, out)
    status, out = _post(url, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert status == 200 and len(out["choices"][0]["token_ids"]) <= 2


def test_data_generate_with_a_teacher_endpoint(server, tmp_path):
    url, _ = server
    out = tmp_path / "teacher.jsonl"
    r = runner.invoke(app, ["data", "generate", "--env", "home", "--n", "2", "--policy", f"openai:{url}",
                            "-o", str(out)])
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 2 and "teacher successes" in r.output
    assert all(any(m["role"] == "assistant" for m in row["messages"]) for row in rows)
    r = runner.invoke(app, ["data", "generate", "--env", "home", "--n", "1", "--policy",
                            "openai:http://127.0.0.1:9/v1", "-o", str(tmp_path / "x.jsonl")])
    assert r.exit_code == 4 and "does not answer" in r.output, r.output
    assert not (tmp_path / "x.jsonl").exists()
    r = runner.invoke(app, ["data", "generate", "--env", "home", "--policy", "vllm:x", "-o", str(tmp_path / "y.jsonl")])
    assert r.exit_code == 2 and "openai:http" in r.output


def test_eval_through_the_endpoint_sees_what_a_local_eval_sees(tiny_model, tiny_tok, tmp_path):
    """Greedy, same model, same turn length: the endpoint's episodes say what the local run's say."""
    import torch

    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # large random weights, so the greedy answers are varied text, not one repeated token
        for p in tiny_model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    model_dir = tmp_path / "varied"
    tiny_model.save_pretrained(model_dir)
    tiny_tok.save_pretrained(model_dir)
    srv = make_server(ChatService(tiny_model, tiny_tok, ChatRenderer(tiny_tok), name="varied", max_tokens=12),
                      "127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/v1"
    runs = {}
    try:
        for name, model in (("endpoint", f"openai:{url}"), ("local", str(model_dir))):
            r = runner.invoke(app, ["eval", "--model", model, "--env", "home", "--tasks", "3", "--max-new-tokens",
                                    "12", "--max-turns", "1", "--out", str(tmp_path / name), "-q"])
            assert r.exit_code == 0, r.output
            assert json.loads(r.stdout)["metrics"]["episodes"] == 3
            eps = [json.loads(x) for x in (tmp_path / name / "episodes.jsonl").read_text().splitlines()]
            runs[name] = [next(m.get("content") or "" for m in e["messages"] if m["role"] == "assistant").strip()
                          for e in eps]
        r = runner.invoke(app, ["eval", "--model", f"openai:{url}", "--env", "home", "--set",
                                "render.tool_format=hermes"])
        assert r.exit_code == 2 and "an endpoint renders its own" in r.output
    finally:
        srv.shutdown()
        srv.server_close()
    assert runs["endpoint"] == runs["local"] and all(runs["local"])
