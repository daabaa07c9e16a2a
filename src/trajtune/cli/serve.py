"""``trajtune serve``: an OpenAI-compatible chat-completions endpoint over a model (trajtune.serve)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from trajtune.cli.eval_cmd import render_overrides
from trajtune.errors import UsageError, require_at_least
from trajtune.progress import console


def serve_cmd(
    model: str = typer.Option(..., "--model", "-m", help="Model alias, .gguf file, HF id or local directory "
                                                         "(a full model or a LoRA adapter dir)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind; the default accepts local clients only."),
    port: int = typer.Option(8000, "--port", help="TCP port (0: any free port, printed at start)."),
    template: Optional[Path] = typer.Option(None, "--template", help="Jinja chat template file replacing the "
                                                                     "tokenizer's."),
    set_: Optional[list[str]] = typer.Option(None, "--set", help="Render option as in training: "
                                                                 "--set render.tool_format=hermes (repeatable)."),
    max_tokens: int = typer.Option(512, "--max-tokens", help="Default completion length when a request "
                                                                    "gives none."),
) -> None:
    """Serve a model as an OpenAI-compatible endpoint: POST /v1/chat/completions, GET /v1/models.

    Prompts are rendered with the model's chat template as in training, tool calls parsed by the
    same parser; responses add the exact token ids (prompt_token_ids, choices[0].token_ids) and,
    with "logprobs": true, each generated token's sampling log-probability. One request is
    generated at a time. Stop with Ctrl-C.

    For RL through the server (rollout.server, docs/algorithms.md): POST /v1/completions takes
    token-id prompts and answers token ids and log-probs; POST /trajtune/load_weights loads the
    trainer's weights file (a path on this machine); GET /trajtune/info names the model and its
    policy version.

    Example: trajtune serve --model runs/sft-home/final --port 8000

    Example: trajtune data generate --env home --n 50 --policy openai:http://127.0.0.1:8000/v1 -o teacher.jsonl
    """
    # lazy: imports torch, which the CLI's start-up (`trajtune --help`) must not load
    from trajtune.chat.render import ChatRenderer
    from trajtune.config import load_render
    from trajtune.models.loading import load_model, load_tokenizer
    from trajtune.serve import ChatService, make_server
    from trajtune.train import check_chat_template

    require_at_least(("--max-tokens", max_tokens, 1))
    _check_port(host, port)  # before the model loads: a taken port is known in a millisecond
    config = load_render(render_overrides(set_)).to_render_config()
    tok = load_tokenizer(model, str(template) if template is not None else None)
    renderer = ChatRenderer(tok, config)
    check_chat_template(tok, renderer.config, model)
    service = ChatService(load_model(model, trainable=False), tok, renderer, name=model, max_tokens=max_tokens)
    try:
        server = make_server(service, host, port)
    except OSError as e:  # taken between the check and now
        raise _port_error(host, port, e) from None
    h, p = server.server_address[:2]
    console.print(f"serving {model} at http://{h}:{p}/v1 (POST /v1/chat/completions, /v1/completions); Ctrl-C stops", soft_wrap=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        console.print("stopped")
    finally:
        server.server_close()


def _port_error(host: str, port: int, e: OSError) -> UsageError:
    return UsageError(f"cannot serve on {host}:{port}: {e.strerror or e}; stop what uses the port, or choose "
                      "another --port (0 picks a free one)")


def _check_port(host: str, port: int) -> None:
    """Bind ``host:port`` as the server will (address reuse on, as http.server sets it) and let go."""
    import socket

    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise UsageError(f"cannot serve on {host}:{port}: unknown host ({e.strerror})") from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as e:
            raise _port_error(host, port, e) from None
