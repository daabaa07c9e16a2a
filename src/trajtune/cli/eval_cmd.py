"""``trajtune eval``: evaluate a model on an environment or a benchmark (BFCL, TextWorld).

Output policy: the results JSON goes to stdout (so ``trajtune eval ... > r.json`` works); the
progress bar, warnings and a compact summary table go to stderr. ``-q`` leaves only the JSON.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from trajtune.errors import UsageError
from trajtune.progress import console

if TYPE_CHECKING:
    from trajtune.eval.harness import EvalSettings


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
    # lazy: imports torch, which the CLI's start-up (`trajtune --help`) must not load
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
        # lazy: the CLI's start-up loads only the command modules, not what they run
        from trajtune.safety.ping import load_prefix

        return load_prefix(str(file))
    if text is not None and not text:
        raise UsageError("--assistant-prefix is empty; leave it out for no prefix")
    return text


def _check_modes(resuming: bool, out: Path | None, benchmark: str | None, suite: str | None, tasks: int | None,
                 limit: int | None) -> None:
    """Options that would do nothing in this mode are refused before anything loads."""
    if resuming and out is None:
        raise UsageError("--resume and --overwrite act on --out; give --out DIR")
    _count_options(benchmark, suite, tasks, limit)


def _count_options(benchmark: str | None, suite: str | None, tasks: int | None, limit: int | None) -> None:
    """Each mode has one count option; the other one would be silently ignored (an hours-long BFCL
    run on a CPU for ``--tasks 3``), so it is refused with the option that does apply."""
    if benchmark == "bfcl" and tasks is not None and suite is None:
        raise UsageError(f"--tasks counts an environment's tasks; BFCL runs every entry of each category unless "
                         f"--limit N takes the first N (use --limit {tasks})")
    if benchmark != "bfcl" and limit is not None:
        raise UsageError(f"--limit takes the first N entries of each BFCL category; an environment's tasks are "
                         f"counted with --tasks (use --tasks {limit})")


# The options of `trajtune eval`, named once here so the command's signature stays one line per option
# (typer reads an Annotated alias exactly like an inline one: same flags, help and defaults).
_ModelOpt = Annotated[str, typer.Option("--model", "-m", help="Model alias, .gguf file, HF id or local path (a full model or a LoRA adapter dir), or openai:URL for an OpenAI-compatible endpoint.")]
_EnvOpt = Annotated[Optional[str], typer.Option("--env", "-e", help="Environment: a name (`trajtune envs list`), module:Class, an inline YAML mapping such as "
                                                 "'{gym: mymod:Game}' / '{mcp: {command: [python, srv.py], tasks_file: t.jsonl}}' / "
                                                 "'{python_tools: mymod:Tools, kwargs: {...}}', or a YAML file with one (docs/envs.md).")]
_BenchmarkOpt = Annotated[Optional[str], typer.Option("--benchmark", "-b", help="External benchmark (an eval-suite plug-in): bfcl, textworld, tau2 (τ²-bench with its official evaluator), or one an installed package adds (docs/envs.md, Plug-ins).")]
_CategoriesOpt = Annotated[Optional[str], typer.Option(
    "--categories", help="BFCL categories, comma-separated: names (simple, multiple, parallel, ...), "
                         "or groups (single_turn, multi_turn, live, non_live, all). Default: all.")]
_NTasksOpt = Annotated[Optional[int], typer.Option("--tasks", help="Held-out environment tasks to run "
                                                   "(default 64; BFCL takes --limit).")]
_SplitOpt = Annotated[str, typer.Option(help="The environment's tasks to draw: test (held out), or train for a "
                                             "validation score that leaves the test tasks unseen while choosing "
                                             "settings (pick a --seed your training did not use).")]
_LimitOpt = Annotated[Optional[int], typer.Option("--limit", help="BFCL: first N entries of each category.")]
_NOpt = Annotated[int, typer.Option("--n", help="Samples per task (for pass@k).")]
_KOpt = Annotated[Optional[list[int]], typer.Option("--k", help="pass@k values to report (repeatable).")]
_TemperatureOpt = Annotated[float, typer.Option("--temperature", "-t", help="Sampling temperature; 0 = greedy.")]
_TopPOpt = Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass.")]
_BestOfOpt = Annotated[Optional[int], typer.Option(
    "--best-of", help="Draw N candidates per task and keep the one the verifier picks.")]
_VerifierOpt = Annotated[Optional[str], typer.Option(
    "--verifier", help="Best-of-N selector: env (oracle upper bound), reward, majority (default), first, "
                       "or package.module:factory.")]
_WorkersOpt = Annotated[int, typer.Option("--workers", "-w", help="Environments stepped in parallel.")]
_MaxTurnsOpt = Annotated[Optional[int], typer.Option(help="Turn limit per episode (default: the environment's).")]
_MaxNewTokensOpt = Annotated[int, typer.Option(help="Token limit per assistant turn.")]
_MaxLengthOpt = Annotated[Optional[int], typer.Option(
    help="Token limit per episode. Default: the model's context length; a larger value is clamped to it "
         "(with a warning).")]
_MaskObsOpt = Annotated[int, typer.Option(
    "--mask-observations-at", help="Observation masking, the baseline of context folding: when the active "
                                   "context passes this many tokens, every tool result but the latest becomes a "
                                   "placeholder (0: off; docs/envs.md, fold).")]
_BatchSizeOpt = Annotated[int, typer.Option(help="Episodes generated together.")]
_ParserOpt = Annotated[str, typer.Option(help="Tool-call parser; auto = the one of the render tool format.")]
_TemplateOpt = Annotated[Optional[Path], typer.Option(
    "--template", help="Jinja chat template file to use instead of the tokenizer's own.")]
_SetOpt = Annotated[Optional[list[str]], typer.Option(
    "--set", help="Render option: --set render.tool_format=hermes (repeatable; see `trajtune doctor`).")]
_AssistantPrefixOpt = Annotated[Optional[str], typer.Option(
    "--assistant-prefix", help="Text put right after the assistant header of every agent turn (a prefix "
                               "injection guard; same as --set render.assistant_prefix=TEXT; docs/ping.md).")]
_AssistantPrefixFileOpt = Annotated[Optional[Path], typer.Option(
    "--assistant-prefix-file", help="A ping.json from `trajtune ping`: its best prefix is the assistant prefix.")]
_DeviceOpt = Annotated[str, typer.Option(help="Where the model runs: auto (GPU if there is one), cpu, cuda, cuda:1, ...")]
_EnvArgOpt = Annotated[Optional[list[str]], typer.Option("--env-arg", help="Environment argument key=value (repeatable).")]
_SeedOpt = Annotated[int, typer.Option(help="Task and sampling seed.")]
_OutOpt = Annotated[Optional[Path], typer.Option("--out", "-o", help="Directory for run.json, episodes.jsonl, results.json.")]
_ResumeOpt = Annotated[bool, typer.Option("--resume", help="Continue the evaluation in --out, skipping finished episodes.")]
_OverwriteOpt = Annotated[bool, typer.Option("--overwrite", help="Replace the evaluation in --out.")]
_QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="Only the results JSON on stdout: no progress bar, "
                                                             "no summary table.")]
_EndpointModelOpt = Annotated[str, typer.Option(
    "--endpoint-model", help="With --model openai:URL: the model name sent to the endpoint.")]
_ReportOpt = Annotated[bool, typer.Option("--report/--no-report", help="With --out: write --out/report.html (see "
                                                                       "`trajtune report`) at the end.")]
_JudgeOpt = Annotated[Optional[str], typer.Option(
    "--judge", help="An LLM judge scores every episode: openai:URL (an OpenAI-compatible endpoint, e.g. "
                    "`trajtune serve`) or a local model (alias, path, HF id) run in-process. Adds metrics.judge "
                    "and metadata.judge per episode (docs/eval.md).")]
_JudgeModelOpt = Annotated[Optional[str], typer.Option(
    "--judge-model", help="With --judge openai:URL: the model name sent to the judge (default: default).")]
_JudgeRubricOpt = Annotated[Optional[Path], typer.Option(
    "--judge-rubric", help="A text/Markdown rubric file for the judge (default: a built-in 0-10 rubric for agent "
                           "trajectories).")]
_JudgeMaxTokensOpt = Annotated[Optional[int], typer.Option(
    "--judge-max-tokens", help="Token limit of the judge's reply (default 256).")]
_ExperiencesOpt = Annotated[Optional[Path], typer.Option(
    "--experiences", help="Put the lessons of a tfgrpo run (its directory or experiences.json) in the system "
                          "prompt, as the run's rollouts had them (docs/algorithms.md, Training-free GRPO).")]
_BayesLoraOpt = Annotated[Optional[int], typer.Option(
    "--bayes-lora", help="BayesLoRA: K stochastic passes per episode with dropout on in the LoRA layers only "
                         "(--model must be a LoRA adapter trained with lora.dropout > 0). Adds "
                         "metrics.uncertainty and metadata.uncertainty per episode (docs/probes.md).")]
_SuiteOpt = Annotated[Optional[str], typer.Option(
    "--suite", help="safety: also run the safety environment (harmful requests to refuse, benign twins to do; "
                    "--tasks of them) next to --env (default home) and report harmful compliance, refusal rate, "
                    "benign success and over-refusal (docs/safety.md).")]
_RefusalJudgeOpt = Annotated[Optional[str], typer.Option(
    "--refusal-judge", help="Who decides whether the agent refused in the safety environment: openai:URL|MODEL "
                            "or a local model (default: phrase rules). Judge failures fall back to the rules and "
                            "are counted.")]



def eval_(
    model: _ModelOpt,
    env: _EnvOpt = None,
    benchmark: _BenchmarkOpt = None,
    categories: _CategoriesOpt = None,
    n_tasks: _NTasksOpt = None,
    split: _SplitOpt = "test",
    limit: _LimitOpt = None,
    n: _NOpt = 1,
    k: _KOpt = None,
    temperature: _TemperatureOpt = 0.0,
    top_p: _TopPOpt = 1.0,
    best_of: _BestOfOpt = None,
    verifier: _VerifierOpt = None,
    workers: _WorkersOpt = 8,
    max_turns: _MaxTurnsOpt = None,
    max_new_tokens: _MaxNewTokensOpt = 256,
    max_length: _MaxLengthOpt = None,
    mask_observations_at: _MaskObsOpt = 0,
    batch_size: _BatchSizeOpt = 16,
    parser: _ParserOpt = "auto",
    template: _TemplateOpt = None,
    set_: _SetOpt = None,
    assistant_prefix: _AssistantPrefixOpt = None,
    assistant_prefix_file: _AssistantPrefixFileOpt = None,
    device: _DeviceOpt = "auto",
    env_arg: _EnvArgOpt = None,
    seed: _SeedOpt = 0,
    out: _OutOpt = None,
    resume: _ResumeOpt = False,
    overwrite: _OverwriteOpt = False,
    quiet: _QuietOpt = False,
    endpoint_model: _EndpointModelOpt = "default",
    report: _ReportOpt = True,
    judge: _JudgeOpt = None,
    judge_model: _JudgeModelOpt = None,
    judge_rubric: _JudgeRubricOpt = None,
    judge_max_tokens: _JudgeMaxTokensOpt = None,
    experiences: _ExperiencesOpt = None,
    bayes_lora: _BayesLoraOpt = None,
    suite: _SuiteOpt = None,
    refusal_judge: _RefusalJudgeOpt = None,
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
    Example: trajtune eval --model runs/fold/sft/final --env fold --env-arg env=home --env-arg kwargs='{"chores": 8}' --max-length 2048   (context folding)
    """
    from trajtune.eval.run import run_eval  # imports torch; kept off the CLI's start-up

    _check_modes(resume or overwrite, out, benchmark, suite, n_tasks, limit)
    env_kwargs = _env_kwargs(env_arg)
    render, prefix = _render_options(set_, assistant_prefix, assistant_prefix_file)
    settings = _eval_settings(dict(
        model=model, env=env, benchmark=benchmark,
        categories=[c.strip() for c in categories.split(",") if c.strip()] if categories else None,
        env_kwargs=env_kwargs, tasks=64 if n_tasks is None else n_tasks, split=split, limit=limit, n=n, ks=k or [1],
        temperature=temperature, top_p=top_p, best_of=best_of, verifier=verifier, seed=seed, max_turns=max_turns,
        max_new_tokens=max_new_tokens, max_length=max_length, parser=parser, device=device, batch_size=batch_size,
        mask_observations_at=mask_observations_at, workers=workers, template=str(template) if template else None,
        render=render, judge=judge, judge_model=judge_model, judge_rubric=str(judge_rubric) if judge_rubric else None,
        judge_max_tokens=judge_max_tokens, bayes_lora=bayes_lora, suite=suite, refusal_judge=refusal_judge),
        experiences)
    backend = _endpoint_backend(settings, endpoint_model, temperature, workers,
                                prompt_options=template is not None or bool(set_) or prefix is not None)
    results = run_eval(settings, out_dir=out, resume=resume, overwrite=overwrite, quiet=quiet, backend=backend)
    _write_results(results, out, quiet, report)


def _render_options(set_: list[str] | None, text: str | None, file: Path | None) -> tuple[dict[str, Any], str | None]:
    """The ``render`` mapping from ``--set render.*`` with the assistant prefix, wherever it was given, in it."""
    render = render_overrides(set_)
    prefix = assistant_prefix_text(text, file, render)
    if prefix is not None:
        render["assistant_prefix"] = prefix
    return render, prefix


def _eval_settings(fields: dict[str, Any], experiences: Path | None) -> EvalSettings:
    """The command's options as ``EvalSettings``: an ``--env`` spec is resolved to its registered name
    and arguments, and a tfgrpo run's lessons are loaded, before anything runs."""
    # lazy: the CLI's start-up loads only the command modules, not what they run
    from trajtune.eval.harness import EvalSettings

    if fields["env"] is not None:
        from trajtune.config import env_from_cli  # config imports torch; kept off the CLI's start-up

        spec = env_from_cli(fields["env"], fields["env_kwargs"])
        fields["env"], fields["env_kwargs"] = spec.name, spec.kwargs
    settings = EvalSettings(**fields)
    if experiences is not None:
        # lazy: the CLI's start-up loads only the command modules, not what they run
        from trajtune.envs.adapters.experiences import load_experiences

        settings.experiences = load_experiences(experiences)
    return settings


def _endpoint_backend(settings: EvalSettings, endpoint_model: str, temperature: float, workers: int,
                      prompt_options: bool) -> Any:
    """The backend of an ``openai:URL`` model (None for a local one). An endpoint renders its own
    prompts, so options that shape a local model's prompt are refused rather than ignored."""
    if not settings.model.startswith("openai:"):
        return None
    # lazy: the CLI's start-up loads only the command modules, not what they run
    from trajtune.envs.adapters.openai_policy import endpoint_policy
    from trajtune.eval.backends import endpoint_backend

    if prompt_options or settings.mask_observations_at:
        raise UsageError("--template, --set render.*, --assistant-prefix(-file) and --mask-observations-at shape "
                         "the prompt of a local model; an endpoint renders its own")
    settings.parser = "hermes"
    return endpoint_backend(endpoint_policy(settings.model, endpoint_model, temperature, option="--model"),
                            workers=workers)


def _write_results(results: dict[str, Any], out: Path | None, quiet: bool, report: bool) -> None:
    """Summary on stderr, then the HTML report, then the results JSON on stdout (the last thing written,
    so ``trajtune eval ... > r.json`` gets the JSON alone)."""
    _print_summary(results, quiet)
    if out is not None and report:
        # lazy: the CLI's start-up loads only the command modules, not what they run
        from trajtune.report import report_after_run

        report_after_run(out, quiet)
    typer.echo(json.dumps(_shown(results), indent=1, default=str, ensure_ascii=False))


def _print_summary(results: dict[str, Any], quiet: bool) -> None:
    """The summary tables on stderr (not with -q), and a warning about unreadable judge replies, which
    is printed even with -q: a judge that cannot be read must not pass unnoticed."""
    if not quiet:
        console.print(summary_table(results))
        if "safety" in results:
            console.print(safety_table(results))
    failures = (results.get("metrics", {}).get("judge") or {}).get("parse_failures", 0)
    if failures:
        console.print(f"[yellow]warning:[/yellow] the judge's reply had no score for {failures} of "
                      f"{results['metrics']['judge']['episodes']} episodes (counted in metrics.judge.parse_failures; "
                      "see metadata.judge.error in the episodes)", highlight=False, soft_wrap=True)


def _shown(results: dict[str, Any]) -> dict[str, Any]:
    """The results JSON printed on stdout: without the settings and the best-of selections, which
    run.json and results.json keep."""
    shown = {k: v for k, v in results.items() if k != "settings"}
    if "best_of" in shown:
        shown["best_of"] = {k: v for k, v in shown["best_of"].items() if k != "selected"}
    return shown


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
