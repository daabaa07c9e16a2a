"""RL through a generation server (rollout.server): token-id completions, the same tokens as the local
sampler, stored log-probs that a local recompute confirms, the server following the policy, and clear
refusals of servers that cannot do that."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from safetensors.torch import load_file

from sampler_fixtures import home_prompts, policy_logprob_gap
from trajtune.algorithms.rl import RLRunConfig
from trajtune.chat.render import ChatRenderer
from trajtune.config import ConfigError, load_config
from trajtune.envs import make_env
from trajtune.errors import EXIT_CODES, ServerError
from trajtune.generation import CachedSampler
from trajtune.models.loading import load_model
from trajtune.remote import ServerClient, ServerSampler
from trajtune.rollout import RolloutConfig, run_rollouts
from trajtune.serve import ChatService, make_server
from trajtune.tokens import SOURCE_POLICY
from trajtune.train import run


def _serve(handler_or_service):
    srv = make_server(handler_or_service, "127.0.0.1", 0) if isinstance(handler_or_service, ChatService) \
        else ThreadingHTTPServer(("127.0.0.1", 0), handler_or_service)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


@pytest.fixture()
def served(tiny_dir, tiny_tok):
    """A server over its own copy of the tiny model: (url, service)."""
    service = ChatService(load_model(str(tiny_dir)), tiny_tok, ChatRenderer(tiny_tok), name="tiny", max_tokens=16)
    srv, url = _serve(service)
    yield url, service
    srv.shutdown()
    srv.server_close()


def _http(url: str, body: dict | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"}, method="POST" if body else "GET")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_token_id_completions_round_trip_with_exact_log_probs(served, tiny_tok):
    url, service = served
    prompts = home_prompts(tiny_tok)
    status, info = _http(url + "/trajtune/info")
    assert status == 200 and info["model"] == "tiny" and info["policy_version"] == 0
    assert info["vocab_size"] == service.model.get_output_embeddings().weight.shape[0]
    body = {"prompt": prompts, "max_tokens": 8, "temperature": 0.8, "seed": 5, "logprobs": 0}
    status, out = _http(url + "/v1/completions", body)
    assert status == 200 and out["object"] == "text_completion" and len(out["choices"]) == 2
    from trajtune.tokens import SOURCE_PROMPT, TokenTrajectory

    rows = []
    for prompt, c in zip(prompts, out["choices"]):
        ids, lps = c["token_ids"], c["logprobs"]["token_logprobs"]
        assert c["prompt_token_ids"] == prompt and 1 <= len(ids) <= 8 and len(lps) == len(ids)
        assert c["finish_reason"] == ("stop" if ids[-1] in service.renderer.stop_ids() else "length")
        n = len(prompt)
        rows.append(TokenTrajectory(ids=prompt + ids, source=[SOURCE_PROMPT] * n + [SOURCE_POLICY] * len(ids),
                                    turn=[0] * (n + len(ids)), weight=[0.0] * n + [1.0] * len(ids),
                                    logprobs=[0.0] * n + lps))
    assert policy_logprob_gap(service.model, rows, 0.8) < 1e-3
    assert _http(url + "/v1/completions", body)[1]["choices"] == out["choices"]  # same seed, same samples
    single = _http(url + "/v1/completions", {**body, "prompt": prompts[0]})[1]  # one prompt as a flat id list
    assert len(single["choices"]) == 1

    for bad, needle in [({"prompt": "hello"}, "token ids"), ({"prompt": [[1, 10**9]]}, "token ids in [0,"),
                        ({"prompt": [1, 2], "n": 2}, "`n` is not supported"), ({"prompt": [1], "max_tokens": 0},
                                                                                "max_tokens"),
                        ({"prompt": [1], "stop_token_ids": "x"}, "stop_token_ids")]:
        status, err = _http(url + "/v1/completions", bad)
        assert status == 400 and needle in err["error"]["message"], (bad, err)
    status, err = _http(url + "/trajtune/load_weights", {"path": "/nonexistent/w.safetensors"})
    assert status == 400 and "cannot read weights" in err["error"]["message"]
    client = ServerClient(url + "/v1")  # the /v1 suffix is optional
    with pytest.raises(ServerError, match=r"HTTP 400: prompt 0: need a non-empty list"):
        client.complete([[]], 4, 1.0, 1.0, 0, [1])


def test_server_sampling_gives_the_local_samplers_tokens_under_greedy_decoding(served, tiny_dir, tiny_tok):
    url, service = served
    stops = service.renderer.stop_ids()
    prompts = home_prompts(tiny_tok, 3)
    local = CachedSampler(load_model(str(tiny_dir)).eval(), 0.0, 1.0, stops).turn(
        [(None, p) for p in prompts], [12, 12, 5], 0)
    remote = ServerSampler(ServerClient(url), 0.0, 1.0, stops).turn([(None, p) for p in prompts], [12, 12, 5], 0)
    for (ids, lps, ended, _), (rids, rlps, rended, sent) in zip(local, remote):
        assert rids == ids and rended == ended and max(abs(a - b) for a, b in zip(lps, rlps)) < 1e-4
    assert remote[0][3].ids == prompts[0] + remote[0][0]

    # whole multi-turn episodes: the server's continue each turn from the history it was sent
    cfg = RolloutConfig(max_turns=3, max_new_tokens=12, max_length=512, temperature=0.0, batch_size=4)
    env_tasks = make_env("home").tasks("test", 3, seed=1)
    here = run_rollouts(load_model(str(tiny_dir)), tiny_tok, lambda: make_env("home"), env_tasks, cfg)
    there = run_rollouts(load_model(str(tiny_dir)), tiny_tok, lambda: make_env("home"), env_tasks, cfg,
                         sampler=ServerSampler(ServerClient(url), 0.0, 1.0, stops))
    assert [e.tokens.ids for e in there] == [e.tokens.ids for e in here]
    assert [e.tokens.source for e in there] == [e.tokens.source for e in here]


def _rl_cfg(tiny_dir, out, *extra):
    return load_config(None, RLRunConfig, [f"model={tiny_dir}", f"output_dir={out}", "env=home",
                                            "rollout.max_turns=2", "rollout.max_new_tokens=16",
                                            "rollout.max_length=512", "rl.tasks_per_step=2", "rl.group_size=4",
                                            "rl.n_train_tasks=8", "train.steps=2", "train.lr=3e-3", "report=false",
                                            "rl.overlong={max_length: 36, cache: 32}", *extra])


def test_rl_through_the_server_stores_what_it_sampled_and_keeps_it_on_the_policy(served, tiny_dir, tmp_path,
                                                                                 monkeypatch):
    from trajtune.learner import Learner

    url, service = served
    gaps: list[float] = []
    original = Learner.train_step

    def checked(self, tts):  # the stored log-probs against the trainer's policy, before each update
        gaps.append(policy_logprob_gap(self.accelerator.unwrap_model(self.model), tts, 1.0))
        return original(self, tts)

    monkeypatch.setattr(Learner, "train_step", checked)
    out = tmp_path / "rl"
    run(_rl_cfg(tiny_dir, out, f"rollout.server={{url: {url}/v1, model: tiny}}"), quiet=True)
    assert len(gaps) == 2 and max(gaps) < 1e-3, gaps  # step 2 was sampled from the updated policy
    final = load_file(out / "final" / "model.safetensors")
    served_state = service.model.state_dict()
    assert all(torch.equal(served_state[k], v) for k, v in final.items())  # the server holds the trained weights
    assert service.version == 2
    eps = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    assert [e["metadata"]["policy_version"] for e in eps] == [0] * 8 + [1] * 8
    assert (out / "server" / "policy.safetensors").exists()
    assert not list((out / "server").glob(".*tmp*"))  # written atomically: no temporary file left


def test_a_killed_run_through_the_server_resumes_to_the_uninterrupted_result(served, tiny_dir, tmp_path):
    """The resumed run pushes its checkpoint's weights before sampling again, so the server, which
    meanwhile holds other weights (a later policy of another run), samples what it sampled then."""
    url, service = served
    server = f"rollout.server={url}"
    run(_rl_cfg(tiny_dir, tmp_path / "whole", server, "train.save_every=1"), quiet=True)
    run(_rl_cfg(tiny_dir, tmp_path / "k", server, "train.save_every=1"), quiet=True, stop_after=1)
    run(_rl_cfg(tiny_dir, tmp_path / "other", server, "train.steps=3", "seed=7"), quiet=True)  # moves the server
    run(_rl_cfg(tiny_dir, tmp_path / "k", server, "train.save_every=1"), quiet=True, resume=True)
    assert (tmp_path / "k" / "rollouts.jsonl").read_text() == (tmp_path / "whole" / "rollouts.jsonl").read_text()
    a, b = load_file(tmp_path / "k" / "final" / "model.safetensors"), load_file(
        tmp_path / "whole" / "final" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_an_unreachable_server_fails_early_with_its_url(tiny_dir, tmp_path):
    with pytest.raises(ServerError, match=r"cannot reach the generation server at http://127\.0\.0\.1:9/"):
        ServerClient("http://127.0.0.1:9/v1", timeout_s=5).info()
    out = tmp_path / "never"
    with pytest.raises(ServerError, match=r"127\.0\.0\.1:9"):
        run(_rl_cfg(tiny_dir, out, "rollout.server=http://127.0.0.1:9"), quiet=True)
    assert not out.exists()  # refused before the run directory is written
    assert ServerError.exit_code == 8 and 8 in EXIT_CODES
    from typer.testing import CliRunner

    from trajtune.cli.main import app

    cfg = tmp_path / "rl.yaml"
    cfg.write_text(f"model: {tiny_dir}\noutput_dir: {out}\nenv: home\nrollout:\n  server: http://127.0.0.1:9/v1\n")
    r = CliRunner().invoke(app, ["rl", "--config", str(cfg), "--quiet"])
    assert r.exit_code == 8 and "error: cannot reach the generation server at http://127.0.0.1:9/" in r.output, \
        r.output


class _TextOnly(BaseHTTPRequestHandler):
    """An OpenAI-style server that answers text without token ids (and knows trajtune's info route)."""

    def log_message(self, *args):
        pass

    def _send(self, code, payload):
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802
        if self.path == "/trajtune/info":
            self._send(200, {"model": "fake", "policy_version": 0, "vocab_size": 100_000})
        else:
            self._send(404, {"error": {"message": "not found"}})

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send(200, {"choices": [{"index": 0, "text": "hello", "finish_reason": "stop",
                                      "logprobs": {"tokens": ["hel", "lo"], "token_logprobs": [-0.1, -0.2]}}]})


class _NoInfo(_TextOnly):
    def do_GET(self):  # noqa: N802
        self._send(404, {"error": {"message": "not found"}})


def test_a_server_without_token_ids_or_weight_sync_is_refused(tiny_dir, tmp_path):
    srv, url = _serve(_TextOnly)
    try:
        with pytest.raises(ServerError, match="cannot return token ids; RL through it would re-tokenize text") as e:
            ServerClient(url).check(512, [1])
        assert url in str(e.value) and "trajtune serve" in str(e.value)
        with pytest.raises(ServerError, match="cannot return token ids"):
            run(_rl_cfg(tiny_dir, tmp_path / "x", f"rollout.server={url}"), quiet=True)
        assert not (tmp_path / "x").exists()
        with pytest.raises(ServerError, match="serves 'fake', not 'tiny'"):
            ServerClient(url, model="tiny").check(512, [1])
    finally:
        srv.shutdown()
        srv.server_close()
    srv, url = _serve(_NoInfo)
    try:
        with pytest.raises(ServerError, match="has no /trajtune/info: RL through a server needs one that loads"):
            ServerClient(url).check(512, [1])
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize("extra, needle", [
    (["rollout.reuse_kv_cache=false"], "does nothing with rollout.server"),
    (["rl.async_rollouts=true"], "rl.async_rollouts with rollout.server"),
    (["model.lora={r: 4}"], "model.lora is not supported"),
    (["rollout.ray={num_workers: 1}"], "rollout.ray is not supported"),
    (["rollout.server.timeout=3"], "unknown key"),
    (["rollout.server.url=localhost:8000"], "must start with http"),
])
def test_server_settings_that_would_do_nothing_or_go_wrong_are_refused(tmp_path, extra, needle):
    with pytest.raises(ConfigError, match=needle):
        _rl_cfg("m", tmp_path, "rollout.server={url: 'http://127.0.0.1:8000'}", *extra)


def test_only_rl_samples_through_a_server(tmp_path):
    from trajtune.algorithms.rft import RFTRunConfig

    with pytest.raises(ConfigError, match="rollout.server is supported for algorithm rl only, not rft"):
        load_config(None, RFTRunConfig, ["model=m", f"output_dir={tmp_path}", "env=home",
                                         "rollout.server=http://127.0.0.1:8000"])
