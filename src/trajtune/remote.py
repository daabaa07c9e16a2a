"""RL rollouts sampled by a generation server (``rollout.server``), with token-exact provenance.

Why: on a GPU machine generation belongs in a serving engine, not in the training process. The
learner keeps the agent loop (environments, parsing, rendering observations) and asks the server
only for one thing: continue these token ids. So:

- ``ServerClient`` speaks HTTP (standard library only) to an OpenAI-compatible server: token-id
  prompts to ``POST /v1/completions``, and trajtune's two extra routes, ``GET /trajtune/info`` and
  ``POST /trajtune/load_weights`` (``trajtune serve`` has all three). Every failure is a
  ``ServerError`` naming the URL and what went wrong.
- ``ServerSampler`` has the cached sampler's ``turn`` (prompt ids in; sampled ids, log-probs and
  whether the turn ended out), so ``run_rollouts`` stores exactly the ids and log-probs the server
  returned. A server that returns text without token ids is refused: re-tokenizing its text could
  give other ids than the ones sampled, and the policy would be trained on tokens it never chose.
- ``WeightSync`` writes the policy's weights to one safetensors file in the run directory
  (atomically: a temporary file, then a rename) and has the server load them, after every
  optimizer step and before the first sampling (also after a resume), so every episode comes from
  the current policy; the server answers the policy version, which must be the step.

The server reads the weights file from disk, so it runs on the same machine (or sees the same
file system). Only full weights are synced (no LoRA adapters), from one training process.
"""

from __future__ import annotations

import json
import math
import os
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trajtune.errors import ServerError

NO_TOKEN_IDS = ("this server cannot return token ids; RL through it would re-tokenize text, which trajtune refuses "
                "(the policy must be trained on exactly the tokens it sampled); use `trajtune serve --model M`, or a "
                "server that returns token ids and log-probs (vLLM: return_token_ids, or "
                "return_tokens_as_token_ids with logprobs)")


class ServerClient:
    """One generation server, at ``url`` (``http(s)://HOST:PORT``, with or without ``/v1``)."""

    def __init__(self, url: str, model: str | None = None, timeout_s: float = 300.0):
        root = url.rstrip("/")
        self.root = root[:-3] if root.endswith("/v1") else root
        self.model = model
        self.timeout_s = timeout_s

    def request(self, method: str, route: str, body: dict[str, Any] | None = None,
                if_missing: str | None = None) -> dict[str, Any]:
        """``route``'s JSON answer; every failure a ServerError naming the URL (``if_missing``: the
        message when the server has no such route, HTTP 404)."""
        url = self.root + route
        data = json.dumps(body).encode("utf-8") if body is not None else None
        req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                payload = r.read()
        except urllib.error.HTTPError as e:
            if e.code == 404 and if_missing is not None:
                raise ServerError(if_missing) from None
            raise ServerError(f"{method} {url}: HTTP {e.code}: {_server_message(e)}") from None
        except (urllib.error.URLError, ConnectionError, TimeoutError, socket.timeout) as e:
            reason = getattr(e, "reason", None) or e
            raise ServerError(f"cannot reach the generation server at {url}: {reason}; is it running "
                              "(`trajtune serve --model M --port P`), and is rollout.server.url right?") from None
        try:
            out = json.loads(payload)
        except json.JSONDecodeError:
            raise ServerError(f"{method} {url}: the answer is not JSON: {payload[:200]!r}") from None
        if not isinstance(out, dict):
            raise ServerError(f"{method} {url}: the answer is not a JSON object: {payload[:200]!r}")
        return out

    def info(self) -> dict[str, Any]:
        """``GET /trajtune/info``; a server without it cannot follow the policy, so RL refuses it."""
        info = self.request("GET", "/trajtune/info", if_missing=(
            f"{self.root} has no /trajtune/info: RL through a server needs one that loads the policy's weights "
            "after every update (POST /trajtune/load_weights), as `trajtune serve` does; a server that cannot "
            "would sample from a stale policy"))
        for key in ("model", "policy_version", "vocab_size"):
            if key not in info:
                raise ServerError(f"GET {self.root}/trajtune/info: the answer has no {key!r}: {json.dumps(info)[:200]}")
        return info

    def check(self, vocab_size: int, stop_ids: list[int]) -> dict[str, Any]:
        """Fail early: the server answers, serves the configured model with a large enough vocabulary,
        and a one-token probe comes back with token ids and log-probs. Returns its info."""
        info = self.info()
        if self.model is not None and info["model"] != self.model:
            raise ServerError(f"{self.root} serves {info['model']!r}, not {self.model!r} (rollout.server.model)")
        if int(info["vocab_size"]) < vocab_size:
            raise ServerError(f"{self.root} serves a model with {info['vocab_size']} token ids, fewer than the "
                              f"trained model's {vocab_size}: it is another model")
        self.complete([[stop_ids[0]]], 1, 0.0, 1.0, 0, stop_ids)
        return info

    def complete(self, prompts: list[list[int]], max_tokens: int, temperature: float, top_p: float, seed: int,
                 stop_ids: list[int]) -> list[tuple[list[int], list[float], str]]:
        """Continue each prompt: (sampled ids, their log-probs, finish reason) per prompt, in order."""
        body = {"model": self.model, "prompt": prompts, "max_tokens": max_tokens, "temperature": temperature,
                "top_p": top_p, "seed": seed, "stop_token_ids": stop_ids, "logprobs": 0,
                "return_token_ids": True, "skip_special_tokens": False}
        if self.model is None:
            del body["model"]
        out = self.request("POST", "/v1/completions", body)
        url = self.root + "/v1/completions"
        choices = out.get("choices")
        if not isinstance(choices, list) or len(choices) != len(prompts):
            raise ServerError(f"POST {url}: expected {len(prompts)} choices, got "
                              f"{len(choices) if isinstance(choices, list) else json.dumps(out)[:200]}")
        choices = sorted(choices, key=lambda c: c.get("index", 0) if isinstance(c, dict) else 0)
        return [_parse_choice(c, url) for c in choices]

    def load_weights(self, path: Path, version: int) -> int:
        """Have the server load ``path`` as policy version ``version``; returns the version it reports."""
        got = self.request("POST", "/trajtune/load_weights", {"path": str(path), "version": version})
        if got.get("policy_version") != version:
            raise ServerError(f"POST {self.root}/trajtune/load_weights: the server reports policy version "
                              f"{got.get('policy_version')!r}, expected {version}")
        return version


def _server_message(e: urllib.error.HTTPError) -> str:
    raw = e.read()[:1000].decode("utf-8", "replace")
    try:
        err = json.loads(raw).get("error")
        return str(err.get("message") if isinstance(err, dict) else err or raw)
    except (json.JSONDecodeError, AttributeError):
        return raw or str(e.reason)


def _parse_choice(c: Any, url: str) -> tuple[list[int], list[float], str]:
    if not isinstance(c, dict):
        raise ServerError(f"POST {url}: a choice is not an object: {c!r}"[:300])
    lp = c.get("logprobs") if isinstance(c.get("logprobs"), dict) else {}
    ids = c.get("token_ids")
    if ids is None and isinstance(lp.get("tokens"), list) and lp["tokens"] and \
            all(isinstance(t, str) and t.startswith("token_id:") for t in lp["tokens"]):
        ids = [int(t.split(":", 1)[1]) for t in lp["tokens"]]  # vLLM's return_tokens_as_token_ids
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise ServerError(f"{url}: {NO_TOKEN_IDS}")
    lps = lp.get("token_logprobs")
    if lps is None and isinstance(lp.get("content"), list):  # the chat shape
        lps = [x.get("logprob") if isinstance(x, dict) else None for x in lp["content"]]
    if not isinstance(lps, list) or len(lps) != len(ids) or \
            not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in lps):
        raise ServerError(f"{url}: the completion has no log-probability for every sampled token (got "
                          f"{json.dumps(lp)[:120] if lp else 'none'}); RL needs the sampling log-probs to take its "
                          "ratio, and recomputing them locally would hide a server that samples another policy")
    if not ids:
        raise ServerError(f"{url}: the server returned an empty completion (no token ids)")
    return ids, [float(x) for x in lps], str(c.get("finish_reason") or "")


@dataclass
class Sent:
    """What the server has seen of one episode: its whole token sequence so far (the server keeps
    no state, so each turn sends it all). Stands where the cached sampler keeps a RowCache."""

    ids: list[int]

    @property
    def n(self) -> int:
        return len(self.ids)


class ServerSampler:
    """``turn`` like ``generation.CachedSampler.turn``, sampled by the server."""

    def __init__(self, client: ServerClient, temperature: float, top_p: float, stop_ids: list[int]):
        self.client = client
        self.temperature = temperature
        self.top_p = top_p
        self.stop_ids = list(stop_ids)

    def turn(self, rows: list[tuple[Sent | None, list[int]]], max_new: list[int],
             seed: int) -> list[tuple[list[int], list[float], bool, Sent]]:
        """One turn per row: ``rows`` are (what the server saw, tokens added since). Rows with the same
        room go in one request (the API has one ``max_tokens`` per request)."""
        prompts = [(sent.ids if sent is not None else []) + new for sent, new in rows]
        out: list[tuple[list[int], list[float], bool, Sent] | None] = [None] * len(rows)
        stops = set(self.stop_ids)
        for k, m in enumerate(sorted(set(max_new))):
            idx = [i for i, x in enumerate(max_new) if x == m]
            got = self.client.complete([prompts[i] for i in idx], m, self.temperature, self.top_p,
                                       (seed + k) % (2**63), self.stop_ids)
            for i, (ids, lps, finish) in zip(idx, got):
                ended = ids[-1] in stops
                if len(ids) > m or (not ended and len(ids) < m) or (ended and stops & set(ids[:-1])):
                    raise ServerError(f"{self.client.root}/v1/completions: {len(ids)} tokens (finish_reason "
                                      f"{finish!r}) for max_tokens {m} and stop ids {self.stop_ids}: the server did "
                                      "not stop at exactly the stop token or the length, so the turn's tokens are not "
                                      "the ones trajtune asked for (a server that drops the stop token from "
                                      "token_ids, or stops at other tokens, cannot be used for RL)")
                out[i] = (ids, lps, ended, Sent(prompts[i] + ids))
        return out  # type: ignore[return-value]


def policy_state(model: Any) -> dict[str, Any]:
    """The model's full weights as contiguous CPU tensors, a tied output head left out (the server
    ties it again)."""
    state = model.state_dict()
    if getattr(getattr(model, "config", None), "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}


class WeightSync:
    """Keeps the server's weights equal to the trainer's: ``push`` writes them to ``path`` (atomically)
    and has the server load them; ``ensure`` pushes when the server does not hold ``step``'s policy."""

    def __init__(self, client: ServerClient, path: Path):
        self.client = client
        self.path = Path(path).resolve()
        self.version: int | None = None  # the policy version the server holds, as far as we know

    def push(self, step: int, model: Any) -> None:
        from safetensors.torch import save_file

        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        save_file(policy_state(model), str(tmp))
        os.replace(tmp, self.path)
        self.version = self.client.load_weights(self.path, step)

    def ensure(self, step: int, model: Any) -> None:
        if self.version != step:
            self.push(step, model)


class ServerSynced:
    """An experience source whose sampling runs on the server: before a step samples, the server is
    made to hold that step's policy (the first step and the first after a resume; the learner's
    ``on_weights`` hook keeps it current after every update)."""

    def __init__(self, inner: Any, sync: WeightSync):
        self.inner, self.sync = inner, sync

    def __getattr__(self, name: str) -> Any:  # state_dict / close / ... of the wrapped source
        if name in ("inner", "sync"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    def batch(self, step: int, model: Any) -> Any:
        self.sync.ensure(step, model)
        return self.inner.batch(step, model)
