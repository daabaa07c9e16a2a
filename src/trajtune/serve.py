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

One request is generated at a time (requests are accepted concurrently and queue on a lock).
Standard library HTTP only; bind to localhost unless you mean to expose the model.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

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
        from trajtune.generation import supports

        self.cached = supports(model)  # the cached sampler, else generate()

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        from trajtune.chat.parsers import parse_tool_calls
        from trajtune.envs.adapters.openai_policy import to_openai_messages
        from trajtune.formats.openai import to_ir
        from trajtune.generation import CachedSampler
        from trajtune.rollout import RolloutConfig, _generate
        from trajtune.schema import Message

        if not isinstance(body.get("messages"), list) or not body["messages"]:
            raise BadRequest("`messages` must be a non-empty list")
        for key in ("n", "stream"):
            if body.get(key) not in (None, 1, False):
                raise BadRequest(f"`{key}` is not supported by trajtune serve (one non-streamed choice)")
        try:
            traj, _ = to_ir({"messages": body["messages"], "tools": body.get("tools") or []})
        except Exception as e:  # noqa: BLE001 - the client's input: a 400 naming what is wrong
            raise BadRequest(f"messages/tools do not convert: {e}") from None
        temperature = float(body.get("temperature", 1.0))
        top_p = float(body.get("top_p", 1.0))
        given = body.get("max_completion_tokens", body.get("max_tokens"))
        max_new = int(given) if given is not None else self.max_tokens
        if max_new < 1 or temperature < 0 or not 0 < top_p <= 1:
            raise BadRequest("need max_tokens ≥ 1, temperature ≥ 0 and 0 < top_p ≤ 1")
        seed = int(body.get("seed", 0))
        prompt = self.renderer.encode(self.renderer.prompt_text(traj.messages, traj.tools))
        stops = self.renderer.stop_ids()
        with self.lock:
            if self.cached:
                ids, lps, ended, _ = CachedSampler(self.model, temperature, top_p, stops).turn(
                    [(None, prompt)], [max_new], seed)[0]
            else:
                cfg = RolloutConfig(temperature=temperature, top_p=top_p, max_new_tokens=max_new)
                ids, lps, ended = _generate(self.model, self.tok, [prompt], [max_new], cfg, stops, seed)[0]
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


def make_server(service: ChatService, host: str = "127.0.0.1", port: int = 8000) -> ThreadingHTTPServer:
    """An HTTP server answering ``GET /v1/models`` and ``POST /v1/chat/completions`` (``port`` 0 =
    any free port; ``server.server_address`` says which)."""

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
            else:
                self._error(404, f"no route {self.path}", "not_found")

        def do_POST(self) -> None:  # noqa: N802
            if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
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
                self._send(200, service.complete(body))
            except (BadRequest, json.JSONDecodeError, ValueError, TypeError) as e:
                self._error(400, str(e), "invalid_request_error")
            except Exception as e:  # noqa: BLE001 - a server bug: 500 with its message, the server stays up
                self._error(500, f"{type(e).__name__}: {e}", "server_error")

    return ThreadingHTTPServer((host, port), Handler)
