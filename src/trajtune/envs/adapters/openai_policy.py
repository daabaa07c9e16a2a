"""An OpenAI-compatible chat-completions endpoint as a policy (teacher models, black-box agents).

``OpenAIChatPolicy(base_url, model)`` is a callable ``(messages, tools) -> assistant Message``
for ``run_episodes``: point it at vLLM, llama.cpp, an API provider or any server that speaks
``POST {base_url}/chat/completions``, and its rollouts become IR trajectories (and SFT data).

Standard library only (``urllib``), so no client SDK is required. Tool-call arguments come back
as JSON *strings*; they are parsed with ``json.loads`` (never evaluated) into
``ToolCall.arguments``, and an unparsable string is kept verbatim in ``arguments_raw`` so the
environment can answer with an error observation. Transient failures (connection errors, 429,
5xx) are retried with exponential backoff; other HTTP errors raise ``PolicyError``, which the
agent loop records as ``termination="policy_error"``. For servers that return tool calls as
text (e.g. Hermes ``<tool_call>`` blocks), pass ``text_tool_parser="hermes"``.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from typing import Any

from trajtune.chat.parsers import parse_tool_calls
from trajtune.errors import ModelLoadError, UsageError
from trajtune.schema import Message, ToolCall, ToolSpec


class PolicyError(RuntimeError):
    """The endpoint failed or answered with something that is not a chat completion."""


def to_openai_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """IR messages in the OpenAI chat shape (arguments re-encoded as JSON strings)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        d: dict[str, Any] = {"role": m.role, "content": m.text() if m.content is not None else None}
        if m.role == "assistant" and m.tool_calls:
            d["tool_calls"] = [{
                "id": c.id, "type": "function",
                "function": {"name": c.name,
                             "arguments": json.dumps(c.arguments, ensure_ascii=False) if c.arguments is not None
                             else (c.arguments_raw or "{}")},
            } for c in m.tool_calls]
        if m.role == "tool":
            d["tool_call_id"] = m.tool_call_id
            if d["content"] is None:
                d["content"] = ""
        if m.name and m.role != "tool":
            d["name"] = m.name
        out.append(d)
    return out


def from_openai_message(msg: dict[str, Any]) -> Message:
    """An OpenAI assistant message as an IR Message (arguments parsed, never evaluated)."""
    if not isinstance(msg, dict):
        raise PolicyError(f"choice.message is {type(msg).__name__}, expected an object")
    calls = []
    for i, c in enumerate(msg.get("tool_calls") or []):
        fn = c.get("function") or {}
        raw = fn.get("arguments")
        args: dict[str, Any] | None
        if isinstance(raw, dict):
            args, raw_text = raw, None
        else:
            raw_text = raw if isinstance(raw, str) else json.dumps(raw)
            try:
                parsed = json.loads(raw_text) if raw_text.strip() else {}
                args = parsed if isinstance(parsed, dict) else None
            except json.JSONDecodeError:
                args = None
        calls.append(ToolCall(id=str(c.get("id") or ""), name=str(fn.get("name") or ""), arguments=args,
                              arguments_raw=raw_text if isinstance(raw_text, str) else None))
    content = msg.get("content")
    if isinstance(content, list):  # content parts: keep the text
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    reasoning = msg.get("reasoning_content") or msg.get("reasoning")
    return Message(role="assistant", content=content if content else None, tool_calls=calls or None,
                   reasoning_content=reasoning if isinstance(reasoning, str) else None, origin="agent")


class OpenAIChatPolicy:
    """Callable policy backed by an OpenAI-compatible endpoint (see module docstring)."""

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, api_key_env: str = "OPENAI_API_KEY",
                 temperature: float = 0.0, max_tokens: int | None = None, timeout_s: float = 60.0,
                 max_retries: int = 2, backoff_s: float = 0.5, extra_body: dict[str, Any] | None = None,
                 headers: dict[str, str] | None = None, text_tool_parser: str | None = None):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.name = f"openai:{model}"
        self._api_key = api_key if api_key is not None else os.environ.get(api_key_env)
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.extra_body = dict(extra_body or {})
        self.headers = dict(headers or {})
        self.calls = 0
        self.text_tool_parser = text_tool_parser

    def request_body(self, messages: list[Message], tools: list[ToolSpec]) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "messages": to_openai_messages(messages),
                                "temperature": self.temperature}
        if tools:
            body["tools"] = [t.to_openai() for t in tools]
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        body.update(self.extra_body)
        return body

    def post(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST one chat-completions request body and return the decoded response (retries as above;
        ``PolicyError`` when it fails). Also used on its own, e.g. by ``trajtune.judge``."""
        data = json.dumps(body).encode("utf-8")
        headers = {"Content-Type": "application/json", **self.headers}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            req = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    payload = resp.read()
                self.calls += 1
                try:
                    return json.loads(payload)
                except json.JSONDecodeError:
                    raise PolicyError(f"{self.url} answered with invalid JSON: {payload[:200]!r}") from None
            except urllib.error.HTTPError as e:
                detail = e.read()[:300].decode("utf-8", "replace")
                last = f"HTTP {e.code} from {self.url}: {detail}"
                if e.code != 429 and e.code < 500:
                    raise PolicyError(last) from None
            except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
                last = f"cannot reach {self.url}: {getattr(e, 'reason', e)}"
        raise PolicyError(f"{last} (after {self.max_retries + 1} attempts)")

    def __call__(self, messages: list[Message], tools: list[ToolSpec]) -> Message:
        resp = self.post(self.request_body(messages, tools))
        try:
            choice = resp["choices"][0]
        except (KeyError, IndexError, TypeError):
            raise PolicyError(f"response has no choices: {json.dumps(resp)[:200]}") from None
        msg = from_openai_message(choice.get("message"))
        if self.text_tool_parser and not msg.tool_calls and msg.content:
            # servers without tool-call parsing return e.g. Hermes <tool_call> blocks as text
            parsed = parse_tool_calls(msg.text(), self.text_tool_parser)
            msg.content = parsed.content or None
            msg.tool_calls = parsed.tool_calls or None
            if parsed.errors:
                msg.extra["format_errors"] = parsed.errors
        if choice.get("finish_reason"):
            msg.extra["finish_reason"] = choice["finish_reason"]
        return msg


def endpoint_policy(spec: str, model: str, temperature: float = 0.0, *, option: str = "--policy") -> OpenAIChatPolicy:
    """``openai:URL`` (a command's ``option``) → a policy on that endpoint, after checking that it
    answers ``GET URL/models``, so a wrong address fails at once with the fix rather than as a
    policy error in every episode."""
    import urllib.error
    import urllib.request

    kind, _, url = spec.partition(":")
    if kind != "openai" or not url.startswith(("http://", "https://")):
        raise UsageError(f"{option} must be openai:http(s)://HOST[:PORT]/v1 (an OpenAI-compatible endpoint), "
                         f"got {spec!r}")
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/models", timeout=10) as r:
            json.loads(r.read())
    except (urllib.error.URLError, TimeoutError, ConnectionError, ValueError) as e:
        raise ModelLoadError(f"{option} {spec}: the endpoint does not answer GET {url.rstrip('/')}/models "
                             f"({getattr(e, 'reason', e)}); is the server running (e.g. `trajtune serve --model M`)?") \
            from None
    return OpenAIChatPolicy(url, model, temperature=temperature, max_retries=1)
