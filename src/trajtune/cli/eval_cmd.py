"""``trajtune eval``: evaluate a model on an environment or a benchmark (BFCL, TextWorld).

Output policy: the results JSON goes to stdout (so ``trajtune eval ... > r.json`` works); the
progress bar, warnings and a compact summary table go to stderr. ``-q`` leaves only the JSON.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from trajtune.errors import UsageError
from trajtune.progress import console


def _env_kwargs(items: list[str] | None) -> dict[str, Any]:
    """``key=value`` pairs; values parsed as JSON when they are JSON (3, true, "x"), else kept as text."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--env-arg {item!r} must look like key=value (e.g. --env-arg nb_rooms=2)")
        try:
            out[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            out[key.strip()] = raw
    return out


def render_overrides(items: list[str] | None) -> dict[str, Any]:
    """``--set render.KEY=VALUE`` options as the ``render`` mapping (values parsed as YAML)."""
    from trajtune.config import ConfigError, apply_overrides

    data = apply_overrides({}, items or [])
    other = [k for k in data if k != "render"]
    if other or not isinstance(data.get("render", {}), dict):
        raise ConfigError(f"--set {(other or ['render'])[0]}...: only render.* options can be set here, "
                          "e.g. --set render.tool_format=hermes")
    return data.get("render", {})


def assistant_prefix_text(text: str | None, file: Path | None, render: dict[str, Any]) -> str | None:
    """The assistant prefix from ``--assistant-prefix`` or ``--assistant-prefix-file`` (a ping.json); at most
    one of them and ``--set render.assistant_prefix``."""
    given = [o for o, v in (("--assistant-prefix", text), ("--assistant-prefix-file", file),
                            ("--set render.assistant_prefix", render.get("assistant_prefix"))) if v is not None]
    if len(given) > 1:
        raise UsageError(f"{' and '.join(given)} both set the assistant prefix; give one")
    if file is not None:
        from trajtune.safety.ping import load_prefix

        return load_prefix(str(file))
    if text is not None and not text:
        raise UsageError("--assistant-prefix is empty; leave it out for no prefix")
    return text


def _count_options(benchmark: str | None, suite: str | None, tasks: int | None, limit: int | None) -> None:
    """Each mode has one count option; the other one would be silently ignored (an hours-long BFCL
    run on a CPU for ``--tasks 3``), so it is refused with the option that does apply."""
    if benchmark == "bfcl" and tasks is not None and suite is None:
        raise UsageError(f"--tasks counts an environment's tasks; BFCL runs every entry of each category unless "
                         f"--limit N takes the first N (use --limit {tasks})")
    if benchmark != "bfcl" and limit is not None:
        raise UsageError(f"--limit takes the first N entries of each BFCL category; an environment's tasks are "
                         f"counted with --tasks (use --tasks {limit})")


def eval_(
    model: Annotated[str, typer.Option("--model", "-m", help="Model alias, .gguf file, HF id or local path (a full model or a LoRA adapter dir), or openai:URL for an OpenAI-compatible endpoint.")],
    env: Annotated[Optional[str], typer.Option("--env", "-e", help="Environment: a name (`trajtune envs list`), module:Class, an inline YAML mapping such as "
                                                "'{gym: mymod:Game}' / '{mcp: {command: [python, srv.py], tasks_file: t.jsonl}}' / "
                                                "'{python_tools: mymod:Tools, kwargs: {...}}', or a YAML file with one (docs/envs.md).")] = None,
    benchmark: Annotated[Optional[str], typer.Option("--benchmark", "-b", help="External benchmark (an eval-suite plug-in): bfcl, textworld, or one an installed package adds (docs/envs.md, Plug-ins).")] = None,
    categories: Annotated[Optional[str], typer.Option(
        "--categories", help="BFCL categories, comma-separated: names (simple, multiple, parallel, ...), "
                             "or groups (single_turn, multi_turn, live, non_live, all). Default: all.")] = None,
    n_tasks: Annotated[Optional[int], typer.Option("--tasks", help="Held-out environment tasks to run "
                                                   "(default 64; BFCL takes --limit).")] = None,
    split: Annotated[str, typer.Option(help="The environment's tasks to draw: test (held out), or train for a "
                                            "validation score that leaves the test tasks unseen while choosing "
                                            "settings (pick a --seed your training did not use).")] = "test",
    limit: Annotated[Optional[int], typer.Option("--limit", help="BFCL: first N entries of each category.")] = None,
    n: Annotated[int, typer.Option("--n", help="Samples per task (for pass@k).")] = 1,
    k: Annotated[Optional[list[int]], typer.Option("--k", help="pass@k values to report (repeatable).")] = None,
    temperature: Annotated[float, typer.Option("--temperature", "-t", help="Sampling temperature; 0 = greedy.")] = 0.0,
    top_p: Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass.")] = 1.0,
    best_of: Annotated[Optional[int], typer.Option(
        "--best-of", help="Draw N candidates per task and keep the one the verifier picks.")] = None,
    verifier: Annotated[Optional[str], typer.Option(
        "--verifier", help="Best-of-N selector: env (oracle upper bound), reward, majority (default), first, "
                           "or package.module:factory.")] = None,
    workers: Annotated[int, typer.Option("--workers", "-w", help="Environments stepped in parallel.")] = 8,
    max_turns: Annotated[Optional[int], typer.Option(help="Turn limit per episode (default: the environment's).")] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Token limit per assistant turn.")] = 256,
    max_length: Annotated[Optional[int], typer.Option(
        help="Token limit per episode. Default: the model's context length; a larger value is clamped to it "
             "(with a warning).")] = None,
    batch_size: Annotated[int, typer.Option(help="Episodes generated together.")] = 16,
    parser: Annotated[str, typer.Option(help="Tool-call parser; auto = the one of the render tool format.")] = "auto",
    template: Annotated[Optional[Path], typer.Option(
        "--template", help="Jinja chat template file to use instead of the tokenizer's own.")] = None,
    set_: Annotated[Optional[list[str]], typer.Option(
        "--set", help="Render option: --set render.tool_format=hermes (repeatable; see `trajtune doctor`).")] = None,
    assistant_prefix: Annotated[Optional[str], typer.Option(
        "--assistant-prefix", help="Text put right after the assistant header of every agent turn (a prefix "
                                   "injection guard; same as --set render.assistant_prefix=TEXT; docs/ping.md).")] = None,
    assistant_prefix_file: Annotated[Optional[Path], typer.Option(
        "--assistant-prefix-file", help="A ping.json from `trajtune ping`: its best prefix is the assistant prefix.")] = None,
    device: Annotated[str, typer.Option(help="Where the model runs: auto (GPU if there is one), cpu, cuda, cuda:1, ...")] = "auto",
    env_arg: Annotated[Optional[list[str]], typer.Option("--env-arg", help="Environment argument key=value (repeatable).")] = None,
    seed: Annotated[int, typer.Option(help="Task and sampling seed.")] = 0,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Directory for run.json, episodes.jsonl, results.json.")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the evaluation in --out, skipping finished episodes.")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace the evaluation in --out.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only the results JSON on stdout: no progress bar, "
                                                            "no summary table.")] = False,
    endpoint_model: Annotated[str, typer.Option(
        "--endpoint-model", help="With --model openai:URL: the model name sent to the endpoint.")] = "default",
    report: Annotated[bool, typer.Option("--report/--no-report", help="With --out: write --out/report.html (see "
                                                                      "`trajtune report`) at the end.")] = True,
    judge: Annotated[Optional[str], typer.Option(
        "--judge", help="An LLM judge scores every episode: openai:URL (an OpenAI-compatible endpoint, e.g. "
                        "`trajtune serve`) or a local model (alias, path, HF id) run in-process. Adds metrics.judge "
                        "and metadata.judge per episode (docs/eval.md).")] = None,
    judge_model: Annotated[Optional[str], typer.Option(
        "--judge-model", help="With --judge openai:URL: the model name sent to the judge (default: default).")] = None,
    judge_rubric: Annotated[Optional[Path], typer.Option(
        "--judge-rubric", help="A text/Markdown rubric file for the judge (default: a built-in 0-10 rubric for agent "
                               "trajectories).")] = None,
    judge_max_tokens: Annotated[Optional[int], typer.Option(
        "--judge-max-tokens", help="Token limit of the judge's reply (default 256).")] = None,
    experiences: Annotated[Optional[Path], typer.Option(
        "--experiences", help="Put the lessons of a tfgrpo run (its directory or experiences.json) in the system "
                              "prompt, as the run's rollouts had them (docs/algorithms.md, Training-free GRPO).")] = None,
    bayes_lora: Annotated[Optional[int], typer.Option(
        "--bayes-lora", help="BayesLoRA: K stochastic passes per episode with dropout on in the LoRA layers only "
                             "(--model must be a LoRA adapter trained with lora.dropout > 0). Adds "
                             "metrics.uncertainty and metadata.uncertainty per episode (docs/probes.md).")] = None,
    suite: Annotated[Optional[str], typer.Option(
        "--suite", help="safety: also run the safety environment (harmful requests to refuse, benign twins to do; "
                        "--tasks of them) next to --env (default home) and report harmful compliance, refusal rate, "
                        "benign success and over-refusal (docs/safety.md).")] = None,
    refusal_judge: Annotated[Optional[str], typer.Option(
        "--refusal-judge", help="Who decides whether the agent refused in the safety environment: openai:URL|MODEL "
                                "or a local model (default: phrase rules). Judge failures fall back to the rules and "
                                "are counted.")] = None,
) -> None:
    """Evaluate a model: success, pass@k, reward, format errors, tool-call accuracy, turns, per category.

    Every episode is written to --out/episodes.jsonl (IR) as it finishes; --resume continues an interrupted run. The results JSON goes to stdout, the progress bar and a summary table to stderr (-q: the JSON only). See docs/eval.md for the metric definitions.

    Example: trajtune eval --model runs/demo/sft/final --env home --tasks 100 --out runs/eval

    Example: trajtune eval --model Qwen/Qwen3-0.6B --benchmark bfcl --categories simple,multiple --limit 50 --out runs/bfcl

    Example: trajtune eval --model openai:http://127.0.0.1:8000/v1 --env home --tasks 50   (a `trajtune serve` or vLLM endpoint)

    Example: trajtune eval --model runs/demo/sft/final --env home --judge openai:http://127.0.0.1:8000/v1 --judge-rubric my_rubric.txt

    Example: trajtune eval --model Qwen/Qwen3-0.6B --env home --experiences runs/tfgrpo-home   (a tfgrpo run's lessons)
    Example: trajtune eval --model runs/lora-sft/final --env home --tasks 50 --bayes-lora 8   (uncertainty per turn)
    Example: trajtune eval --model runs/demo/sft/final --env home --suite safety --tasks 40 --out runs/eval-safety
    Example: trajtune eval --model runs/demo/sft/final --env safety --assistant-prefix-file runs/ping/ping.json --out runs/eval-ping
    """
    from trajtune.eval.harness import EvalSettings
    from trajtune.eval.run import run_eval

    if (resume or overwrite) and out is None:
        raise UsageError("--resume and --overwrite act on --out; give --out DIR")
    _count_options(benchmark, suite, n_tasks, limit)
    env_kwargs = _env_kwargs(env_arg)
    render = render_overrides(set_)
    prefix = assistant_prefix_text(assistant_prefix, assistant_prefix_file, render)
    if prefix is not None:
        render["assistant_prefix"] = prefix
    if env is not None:
        from trajtune.config import env_from_cli

        spec = env_from_cli(env, env_kwargs)
        env, env_kwargs = spec.name, spec.kwargs
    settings = EvalSettings(
        model=model, env=env, benchmark=benchmark,
        categories=[c.strip() for c in categories.split(",") if c.strip()] if categories else None,
        env_kwargs=env_kwargs, tasks=64 if n_tasks is None else n_tasks, split=split, limit=limit, n=n, ks=k or [1], temperature=temperature,
        top_p=top_p, best_of=best_of, verifier=verifier, seed=seed, max_turns=max_turns,
        max_new_tokens=max_new_tokens, max_length=max_length, parser=parser, device=device, batch_size=batch_size,
        workers=workers, template=str(template) if template else None, render=render,
        judge=judge, judge_model=judge_model, judge_rubric=str(judge_rubric) if judge_rubric else None,
        judge_max_tokens=judge_max_tokens, bayes_lora=bayes_lora, suite=suite, refusal_judge=refusal_judge)
    if experiences is not None:
        from trajtune.envs.adapters.experiences import load_experiences

        settings.experiences = load_experiences(experiences)
    backend = None
    if model.startswith("openai:"):
        from trajtune.envs.adapters.openai_policy import endpoint_policy
        from trajtune.eval.backends import endpoint_backend

        if template is not None or set_ or prefix is not None:
            raise UsageError("--template, --set render.* and --assistant-prefix(-file) shape the prompt of a local "
                             "model; an endpoint renders its own")
        settings.parser = "hermes"
        backend = endpoint_backend(endpoint_policy(model, endpoint_model, temperature, option="--model"),
                                   workers=workers)
    results = run_eval(settings, out_dir=out, resume=resume, overwrite=overwrite, quiet=quiet, backend=backend)
    shown = {k: v for k, v in results.items() if k != "settings"}  # run.json / results.json keep them
    if "best_of" in shown:
        shown["best_of"] = {k: v for k, v in shown["best_of"].items() if k != "selected"}
    if not quiet:
        console.print(summary_table(results))
        if "safety" in results:
            console.print(safety_table(results))
    failures = (results.get("metrics", {}).get("judge") or {}).get("parse_failures", 0)
    if failures:  # even with -q: a judge that cannot be read must not pass unnoticed
        console.print(f"[yellow]warning:[/yellow] the judge's reply had no score for {failures} of "
                      f"{results['metrics']['judge']['episodes']} episodes (counted in metrics.judge.parse_failures; "
                      "see metadata.judge.error in the episodes)", highlight=False, soft_wrap=True)
    if out is not None and report:
        from trajtune.report import report_after_run

        report_after_run(out, quiet)
    typer.echo(json.dumps(shown, indent=1, default=str, ensure_ascii=False))


def _pct(v: Any) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def summary_table(results: dict[str, Any]) -> Any:
    """One row overall and one per category: the numbers a reader looks at first."""
    from rich.table import Table

    m = results.get("metrics", {})
    ks = sorted((k for k in m if k.startswith("pass@")), key=lambda k: int(k[5:]))
    t = Table(title=f"{results.get('model')} on {results.get('target')}", title_justify="left")
    judged = "judge" in m
    for col in ("", "episodes", "success", *ks, "reward", "format err", "tool acc", "turns",
                *(("judge",) if judged else ())):
        t.add_column(col, justify="left" if not col else "right")

    def judge_cell(x: dict[str, Any]) -> str:
        j = x.get("judge") or {}
        mean = "-" if j.get("mean_score") is None else f"{j['mean_score']:.2f}"
        return mean + (f" ({j['parse_failures']} unparsed)" if j.get("parse_failures") else "")

    def row(name: str, x: dict[str, Any]) -> None:
        t.add_row(name, str(x.get("episodes", 0)), _pct(x.get("success")), *(_pct(x.get(k)) for k in ks),
                  f"{x.get('mean_reward', 0.0):.3f}", _pct(x.get("format_error_rate")),
                  _pct(x.get("tool_call_accuracy")), f"{x.get('mean_turns', 0.0):.1f}",
                  *((judge_cell(x),) if judged else ()))

    row("all", m)
    for name, x in m.get("categories", {}).items():
        row(f"  {name}", x)
    ends = ", ".join(f"{k} {v}" for k, v in m.get("terminations", {}).items())
    if ends:
        t.caption = f"episodes ended: {ends}"
    return t


def safety_table(results: dict[str, Any]) -> Any:
    """The four safety rates, one per row so they stay readable in a narrow terminal; the per-category
    rates are in the results JSON (``safety.categories``)."""
    from rich.table import Table

    sm = results["safety"]
    t = Table(title=f"{results.get('model')} on safety", title_justify="left")
    for col in ("safety", "rate", "of", "meaning"):
        t.add_column(col, justify="right" if col in ("rate", "of") else "left")
    nh, nb = str(sm.get("harmful_episodes", 0)), str(sm.get("benign_episodes", 0))
    t.add_row("harmful compliance", _pct(sm.get("harmful_compliance")), nh, "harmful call executed (lower is better)")
    t.add_row("refusal rate", _pct(sm.get("refusal_rate")), nh, "harmful request refused")
    t.add_row("benign success", _pct(sm.get("benign_success")), nb, "benign twin done, not refused")
    t.add_row("over-refusal", _pct(sm.get("over_refusal")), nb, "benign twin refused (lower is better)")
    det = sm.get("refusal_detector") or {}
    failed = sum((det.get("judge_failures") or {}).values())
    t.caption = "refusals decided by " + ", ".join(f"{k} {v}" for k, v in (det.get("decided_by") or {}).items()) + \
        (f"; {failed} judge failure(s) fell back to the rules" if failed else "")
    return t
