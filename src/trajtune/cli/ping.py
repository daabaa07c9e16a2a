"""``trajtune ping``: search a prefix injection guard (``trajtune.safety.ping``, docs/ping.md).

The command parses and prints: a table row per round on stderr as the search goes, the result
JSON on stdout; the search and ``ping.json`` are the library's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from trajtune.cli.eval_cmd import _env_kwargs, render_overrides
from trajtune.progress import console


def ping_cmd(
    model: Annotated[str, typer.Option("--model", "-m", help="Model alias, HF id or local path (a full model or a LoRA adapter dir).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory for ping.json (best prefix, scores, history).")],
    env: Annotated[str, typer.Option("--env", "-e", help="Environment whose tasks set data['harmful'] and whose steps "
                                                          "report info['refused'].")] = "safety",
    env_arg: Annotated[Optional[list[str]], typer.Option("--env-arg", help="Environment argument key=value (repeatable).")] = None,
    proposer: Annotated[str, typer.Option(
        "--proposer", help="Who writes candidates: template (built-in guard phrasings), policy (the model itself), "
                           "or openai:URL|MODEL (an OpenAI-compatible endpoint).")] = "template",
    rounds: Annotated[int, typer.Option("--rounds", help="Search rounds.")] = 20,
    candidates: Annotated[int, typer.Option("--candidates", help="Candidates proposed and scored per round.")] = 5,
    benign_n: Annotated[int, typer.Option("--benign-n", help="Benign tasks each candidate is scored on.")] = 8,
    harmful_n: Annotated[int, typer.Option("--harmful-n", help="Harmful tasks each candidate is scored on.")] = 8,
    baseline: Annotated[bool, typer.Option("--baseline/--no-baseline", help="Also score the model without a prefix "
                                                                            "(reported as baseline).")] = True,
    max_turns: Annotated[Optional[int], typer.Option(help="Turn limit per episode (default: the environment's).")] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Token limit per assistant turn.")] = 256,
    max_length: Annotated[Optional[int], typer.Option(help="Token limit per episode (default: the model's context).")] = None,
    temperature: Annotated[float, typer.Option("--temperature", "-t", help="Sampling temperature; 0 = greedy.")] = 0.0,
    batch_size: Annotated[int, typer.Option(help="Episodes generated together.")] = 16,
    workers: Annotated[int, typer.Option("--workers", "-w", help="Environments stepped in parallel.")] = 8,
    template: Annotated[Optional[Path], typer.Option("--template", help="Jinja chat template file to use instead of "
                                                                         "the tokenizer's own.")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Render option: --set render.tool_format=hermes "
                                                                    "(repeatable).")] = None,
    device: Annotated[str, typer.Option(help="Where the model runs: auto, cpu, cuda, cuda:1, ...")] = "auto",
    seed: Annotated[int, typer.Option(help="Task, proposal and sampling seed.")] = 0,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace a ping.json already in --out.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only the result JSON on stdout.")] = False,
) -> None:
    """Search a prefix injection guard (PING): a sentence put after the assistant header of every agent turn.

    Each round the proposer offers --candidates prefixes conditioned on the best so far; each is scored by eval episodes with it on --benign-n benign tasks (solved and not refused) and --harmful-n harmful ones (refused): score = mean benign + mean harmful (0..2). A table row per round shows the best so far. The best prefix, its scores and the whole history go to --out/ping.json; use it with `trajtune eval --assistant-prefix-file DIR/ping.json`. See docs/ping.md.

    Example: trajtune ping --model runs/sft/final --env safety --rounds 20 --candidates 5 --out runs/ping

    Example: trajtune ping --model Qwen/Qwen3-0.6B --proposer 'openai:http://127.0.0.1:8000/v1|default' --out runs/ping
    """
    # lazy: imports torch, which the CLI's start-up (`trajtune --help`) must not load
    from trajtune.config import env_from_cli
    from trajtune.safety.ping import PingSettings, run_ping

    kwargs = _env_kwargs(env_arg)
    spec = env_from_cli(env, kwargs)
    settings = PingSettings(
        model=model, env=spec.name, env_kwargs=spec.kwargs, proposer=proposer, rounds=rounds, candidates=candidates,
        benign_n=benign_n, harmful_n=harmful_n, baseline=baseline, seed=seed, max_turns=max_turns,
        max_new_tokens=max_new_tokens, max_length=max_length, temperature=temperature, batch_size=batch_size,
        workers=workers, device=device, template=str(template) if template else None, render=render_overrides(set_))

    def on_round(summary: dict[str, Any]) -> None:
        if not quiet:
            console.print(round_line(summary), highlight=False, soft_wrap=True)

    if not quiet:
        console.print(f"{'round':>5}  {'best':>5}  {'benign':>6}  {'harmful':>7}  {'scored':>6}  {'unusable':>8}",
                      highlight=False)
    result = run_ping(settings, out, overwrite=overwrite, on_round=on_round)
    if not quiet:
        base = result.get("baseline")
        if base:
            console.print(f"baseline (no prefix): {base['score']:.3f} (benign {base['benign']:.3f}, harmful "
                          f"{base['harmful']:.3f})", highlight=False)
        best = result["best"]
        console.print(f"best: {best['score']:.3f} (benign {best['benign']:.3f}, harmful {best['harmful']:.3f}) "
                      f"{best['prefix']!r} -> {result['path']}", highlight=False, soft_wrap=True)
    base = result.get("baseline")
    if base and result["best"]["score"] <= base["score"]:  # said even with --quiet: the prefix would hurt
        console.print(f"[yellow]warning:[/] no prefix scored above the model without one ({result['best']['score']:.3f} "
                      f"<= {base['score']:.3f}); injecting the best one would make this model worse")
    shown = {k: result[k] for k in ("best", "baseline", "proposer", "proposer_failures", "rounds", "path")}
    typer.echo(json.dumps(shown, indent=1, ensure_ascii=False))


def round_line(s: dict[str, Any]) -> str:
    """One row of the per-round table: the best so far (score, benign, harmful), what was scored."""
    def num(v: Any, width: int) -> str:
        return f"{v:>{width}.3f}" if isinstance(v, (int, float)) else f"{'-':>{width}}"

    return (f"{s['round']:>5}  {num(s['best_score'], 5)}  {num(s['benign'], 6)}  {num(s['harmful'], 7)}  "
            f"{s['scored']:>6}  {s['failures']:>8}")
