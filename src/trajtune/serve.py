"""``trajtune serve``: a small OpenAI-compatible chat-completions server over a Hugging Face model.

Why: so that everything that talks to an OpenAI-compatible endpoint (teacher distillation with
``trajtune data generate --policy openai:URL``, an agent framework, a judge) can use a local or
freshly trained model, and so that this path is testable without a hub or a GPU server.

The prompt is rendered with trajtune's renderer (the model's own chat template, with the same
tool-format adaptation as training), turns are sampled by the cached sampler, and tool calls are
parsed by the renderer's parser; arguments go back as JSON strings, as the API specifies. Beyond
the OpenAI fields, each response carries the exact token ids (``prompt_token_ids`` and, per
choice, ``token_ids``) and, with ``logprobs: true``, the sampling log-probability of every
generated token, so a client can keep token-exact provenance instead of re-tokenizing text.

For RL through the server (``rollout.server``, trajtune.remote) there are three more routes:

- ``POST /v1/completions`` with token-id prompts (``prompt``: a list of ids, or a list of such
  lists for a batch): per choice the sampled ``token_ids``, their ``logprobs`` (at the sampling
  temperature, before top-p, as the RL objectives recompute them) and ``finish_reason``;
- ``POST /trajtune/load_weights`` with ``{"path": FILE}``: a safetensors file on this machine
  (written by the trainer) is loaded into the served model; answers the new policy version;
- ``GET /trajtune/info``: model name, policy version, vocabulary size.

One request is generated at a time (requests are accepted concurrently and queue on a lock, which
weight loading takes too, so no sample ever mixes two policies). Standard library HTTP only; bind
to localhost unless you mean to expose the model (``load_weights`` reads any path it is given).
``trajtune.generation`` and ``trajtune.rollout`` (torch) are imported where a model is served, so
that importing this module (the judge does) stays light.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from trajtune.chat.parsers import parse_tool_calls
from trajtune.envs.adapters.openai_policy import to_openai_messages
from trajtune.formats.openai import to_ir
from trajtune.schema import Message

MAX_BODY_BYTES = 8 * 1024 * 1024


class BadRequest(ValueError):
    pass


class ChatService:
    """Model + tokenizer + renderer; ``complete(body)`` answers one chat-completions request."""

    def __init__(self, model: Any, tokenizer: Any, renderer: Any, name: str, max_tokens: int = 512):
        self.model = model.eval()
        self.tok = tokenizer
        self.renderer = renderer
        self.name = name
        self.max_tokens = max_tokens
        self.lock = threading.Lock()
        self.version = 0  # policy version: bumped by every load_weights

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            raise BadRequest("`messages` must be a non-empty list")
        # `stream` apart: True == 1 in Python, so a membership test would let `stream: true` through
        if body.get("stream") not in (None, False):
            raise BadRequest("`stream` is not supported by trajtune serve (one non-streamed choice): send "
                             "stream: false")
        if body.get("n") not in (None, 1) or isinstance(body.get("n"), bool):
            raise BadRequest("`n` is not supported by trajtune serve (one non-streamed choice)")
        try:
            traj, _ = to_ir({"messages": body["messages"], "tools": body.get("tools") or []})
        except Exception as e:  # noqa: BLE001 - the client's input: a 400 naming what is wrong
            raise BadRequest(f"messages/tools do not convert: {e}") from None
        temperature, top_p, max_new, seed = self._sampling(body, body.get("max_completion_tokens",
                                                                          body.get("max_tokens")))
        # with render.assistant_prefix (docs/ping.md) the model continues from the prefix, as in rollouts
        prompt = self.renderer.prompt_ids(traj.messages, traj.tools)
        with self.lock:
            (ids, lps, ended), = self._sample([prompt], max_new, temperature, top_p, self.renderer.stop_ids(), seed)
        text = self.tok.decode(ids[:-1] if ended else ids, skip_special_tokens=False)
        parsed = parse_tool_calls(text, self.renderer.parser or "hermes")
        message = to_openai_messages([Message(role="assistant", content=parsed.content or None,
                                              tool_calls=parsed.tool_calls or None)])[0]
        choice: dict[str, Any] = {
            "index": 0, "message": message, "token_ids": ids,
            "finish_reason": "length" if not ended else ("tool_calls" if parsed.tool_calls else "stop")}
        if body.get("logprobs"):
            choice["logprobs"] = {"content": [{"token": self.tok.decode([i]), "logprob": lp}
                                              for i, lp in zip(ids, lps)]}
        return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": int(time.time()),
                "model": self.name, "choices": [choice], "prompt_token_ids": prompt,
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                          "total_tokens": len(prompt) + len(ids)}}


    def _sampling(self, body: dict[str, Any], max_tokens: Any) -> tuple[float, float, int, int]:
        """(temperature, top_p, max new tokens, seed) of a request, checked (BadRequest)."""
        temperature = float(body.get("temperature", 1.0))
        top_p = float(body.get("top_p", 1.0))
        max_new = int(max_tokens) if max_tokens is not None else self.max_tokens
        if max_new < 1 or temperature < 0 or not 0 < top_p <= 1:
            raise BadRequest("need max_tokens ≥ 1, temperature ≥ 0 and 0 < top_p ≤ 1")
        return temperature, top_p, max_new, int(body.get("seed", 0))

    def _sample(self, prompts: list[list[int]], max_new: int, temperature: float, top_p: float,
                stops: list[int], seed: int) -> list[tuple[list[int], list[float], bool]]:
        """(ids, log-probs, ended) per prompt: the cached sampler, else generate() (hold ``self.lock``)."""
        # lazy: imports torch; judge imports this module, and eval.harness and safety.ping import judge.
        # The one sampler selection (generation.sampler_for): the model's own, the cached one, else generate()
        from trajtune.generation import sampler_for
        from trajtune.rollout import RolloutConfig, _generate

        sampler = sampler_for(self.model, self.tok, temperature=temperature, top_p=top_p, stop_ids=stops)
        if sampler is not None:
            return [(ids, lps, ended) for ids, lps, ended, _ in sampler.turn(
                [(None, p) for p in prompts], [max_new] * len(prompts), seed)]
        cfg = RolloutConfig(temperature=temperature, top_p=top_p, max_new_tokens=max_new)
        return _generate(self.model, self.tok, prompts, [max_new] * len(prompts), cfg, stops or self.renderer.stop_ids(),
                         seed)

    # -- token-id completions, weight sync and info (RL through the server) -------------------------
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    def info(self) -> dict[str, Any]:
        return {"model": self.name, "policy_version": self.version, "vocab_size": self.vocab_size(),
                "stop_token_ids": self.renderer.stop_ids()}

    def _token_prompts(self, body: dict[str, Any]) -> list[list[int]]:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and all(isinstance(x, int) and not isinstance(x, bool) for x in prompt):
            prompts = [prompt]
        elif isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
            prompts = prompt
        else:
            raise BadRequest("`prompt` must be a non-empty list of token ids or a list of such lists "
                             "(trajtune serve takes token-id prompts at /v1/completions; text goes to /v1/chat/completions)")
        vocab = self.vocab_size()
        for i, p in enumerate(prompts):
            if not p or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < vocab for x in p):
                raise BadRequest(f"prompt {i}: need a non-empty list of token ids in [0, {vocab})")
        return prompts

    def complete_tokens(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1/completions``: continue token-id prompts; exact ids and log-probs per choice."""
        prompts = self._token_prompts(body)
        for key in ("n", "best_of"):
            if body.get(key) not in (None, 1):
                raise BadRequest(f"`{key}` is not supported by trajtune serve (send the prompt several times)")
        if body.get("stream") not in (None, False):
            raise BadRequest("`stream` is not supported by trajtune serve: send stream: false")
        temperature, top_p, max_new, seed = self._sampling(body, body.get("max_tokens"))
        stops = body.get("stop_token_ids")
        if stops is None:
            stops = self.renderer.stop_ids()
        elif not isinstance(stops, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in stops):
            raise BadRequest("`stop_token_ids` must be a list of token ids")
        with self.lock:
            version = self.version
            outs = self._sample(prompts, max_new, temperature, top_p, stops, seed)
        want_lps = body.get("logprobs") is not None and body["logprobs"] is not False  # 0: the sampled token's
        choices = []
        for i, (prompt, (ids, lps, ended)) in enumerate(zip(prompts, outs)):
            choice: dict[str, Any] = {"index": i, "text": self.tok.decode(ids, skip_special_tokens=False),
                                      "token_ids": ids, "prompt_token_ids": prompt,
                                      "finish_reason": "stop" if ended else "length"}
            if want_lps:
                choice["logprobs"] = {"tokens": [self.tok.decode([t]) for t in ids], "token_logprobs": lps}
            choices.append(choice)
        n_prompt, n_out = sum(len(p) for p in prompts), sum(len(o[0]) for o in outs)
        return {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion", "created": int(time.time()),
                "model": self.name, "policy_version": version, "choices": choices,
                "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}}

    def load_weights(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /trajtune/load_weights``: ``{"path": FILE, "version": N?}``, a safetensors file of the
        model's full state (a tied output head may be left out). Every tensor is checked against the
        served model before any is copied, so a wrong file leaves the model as it was."""
        import torch
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        path = body.get("path")
        if not isinstance(path, str) or not path:
            raise BadRequest("`path` must name a safetensors file on the server's machine")
        version = body.get("version")
        if version is not None and (not isinstance(version, int) or isinstance(version, bool) or version < 0):
            raise BadRequest("`version` must be a non-negative integer")
        try:
            state = load_file(path)
        except (OSError, SafetensorError) as e:
            raise BadRequest(f"cannot read weights from {path}: {e}") from None
        own = self.model.state_dict()
        tied = {"lm_head.weight"} if getattr(self.model.config, "tie_word_embeddings", False) else set()
        unexpected = sorted(set(state) - set(own))
        missing = sorted(set(own) - set(state) - tied)
        if unexpected or missing:
            raise BadRequest(f"{path} does not match the served model {self.name}: missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]}")
        bad = [k for k, v in state.items() if tuple(v.shape) != tuple(own[k].shape)]
        if bad:
            raise BadRequest(f"{path}: shapes differ from the served model for {bad[:5]}")
        with self.lock, torch.no_grad():
            for k, v in state.items():
                own[k].copy_(v)
            self.version = version if version is not None else self.version + 1
            return {"policy_version": self.version, "model": self.name, "tensors": len(state)}


def local_service(spec: str, *, max_tokens: int = 512, device: str = "auto") -> ChatService:
    """A local model (alias, path, HF id) answered in-process as ``trajtune serve`` answers it: the
    judge and the simulated user read their model's replies through this one path."""
    from trajtune.chat.render import ChatRenderer
    from trajtune.models.loading import load_model, load_tokenizer, to_device

    tok = load_tokenizer(spec)
    model = to_device(load_model(spec, trainable=False), device)
    return ChatService(model, tok, ChatRenderer(tok), name=spec, max_tokens=max_tokens)


def make_server(service: ChatService, host: str = "127.0.0.1", port: int = 8000) -> ThreadingHTTPServer:
    """An HTTP server answering ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions``
    (token-id prompts), ``POST /trajtune/load_weights`` and ``GET /trajtune/info`` (``port`` 0 = any free
    port; ``server.server_address`` says which)."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt: str, *args: Any) -> None:  # quiet: the CLI prints its own line
            pass

        def _send(self, code: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode("utf-8")
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, code: int, message: str, kind: str) -> None:
            self._send(code, {"error": {"message": message, "type": kind, "code": code}})

        def do_GET(self) -> None:  # noqa: N802 - the http.server API
            if self.path.rstrip("/") in ("/v1/models", "/models"):
                self._send(200, {"object": "list", "data": [{"id": service.name, "object": "model",
                                                              "owned_by": "trajtune"}]})
            elif self.path.rstrip("/") == "/trajtune/info":
                self._send(200, service.info())
            else:
                self._error(404, f"no route {self.path}", "not_found")

        def do_POST(self) -> None:  # noqa: N802
            routes = {"/v1/chat/completions": service.complete, "/chat/completions": service.complete,
                      "/v1/completions": service.complete_tokens, "/completions": service.complete_tokens,
                      "/trajtune/load_weights": service.load_weights}
            answer = routes.get(self.path.rstrip("/"))
            if answer is None:
                self._error(404, f"no route {self.path}", "not_found")
                return
            n = int(self.headers.get("Content-Length") or 0)
            if n <= 0 or n > MAX_BODY_BYTES:
                self._error(400, f"need a JSON body of at most {MAX_BODY_BYTES} bytes", "invalid_request_error")
                return
            try:
                body = json.loads(self.rfile.read(n))
                if not isinstance(body, dict):
                    raise BadRequest("the body must be a JSON object")
                self._send(200, answer(body))
            except (BadRequest, json.JSONDecodeError, ValueError, TypeError) as e:
                self._error(400, str(e), "invalid_request_error")
            except Exception as e:  # noqa: BLE001 - a server bug: 500 with its message, the server stays up
                self._error(500, f"{type(e).__name__}: {e}", "server_error")

    return ThreadingHTTPServer((host, port), Handler)
