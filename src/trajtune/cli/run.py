"""The training commands: sft, rl, demo (and the registration of `eval`, defined in ``cli.eval_cmd``).

They parse arguments, load and validate configs and call into ``trajtune.train`` / ``trajtune.demo``.
User errors (bad config, missing path, existing output) become one clear message and exit code 2.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from trajtune.progress import console


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn the errors a user can fix into one message and exit 2, instead of a traceback."""
    from trajtune.chat.render import RenderError
    from trajtune.config import ConfigError
    from trajtune.models.loading import ModelLoadError
    from trajtune.schema import OutputError, RecordError

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (ConfigError, RecordError, RenderError, ModelLoadError, FileExistsError, FileNotFoundError,
                OutputError, KeyError, ValueError) as e:
            msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
            console.print(f"[bold red]error:[/bold red] {msg}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None

    return wrapper


ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="YAML run config (see examples/).")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", help="Override a config key: --set train.lr=3e-4 (repeatable).")]
OverwriteOpt = Annotated[bool, typer.Option("--overwrite", help="Replace an existing output directory.")]
ResumeOpt = Annotated[bool, typer.Option("--resume", help="Continue from the latest checkpoint in the output directory.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")]


def sft(config: ConfigOpt, set_: SetOpt = None, overwrite: OverwriteOpt = False, resume: ResumeOpt = False,
        quiet: QuietOpt = False) -> None:
    """Supervised fine-tuning on trajectories (assistant tokens only; full or LoRA).

    Example: trajtune sft --config examples/sft_home.yaml --set train.steps=200
    """
    from trajtune.config import SFTRunConfig, load_config
    from trajtune.train import run_sft

    cfg = load_config(config, SFTRunConfig, set_ or [])
    result = run_sft(cfg, overwrite=overwrite, resume=resume, quiet=quiet)
    console.print_json(json.dumps({k: v for k, v in result.items() if k != "last"}, default=str))


def rl(config: ConfigOpt, set_: SetOpt = None, overwrite: OverwriteOpt = False, resume: ResumeOpt = False,
       quiet: QuietOpt = False) -> None:
    """Online multi-turn RL (GRPO, Dr. GRPO, RLOO, REINFORCE++) in an environment.

    Example: trajtune rl --config examples/rl_home.yaml --set rl.group_size=8
    """
    from trajtune.config import RLRunConfig, load_config
    from trajtune.train import run_rl

    cfg = load_config(config, RLRunConfig, set_ or [])
    result = run_rl(cfg, overwrite=overwrite, resume=resume, quiet=quiet)
    console.print_json(json.dumps({k: v for k, v in result.items() if k != "last"}, default=str))


def demo(
    out: Annotated[Path, typer.Option("--out", "-o", help="Run directory.")] = Path("runs/demo"),
    overwrite: OverwriteOpt = False,
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
    """Build a tiny model locally, SFT it on expert trajectories, GRPO it, evaluate each stage.

    Needs no network. Writes configs, metrics.jsonl, checkpoints, eval JSON and PNG plots to --out,
    and summary.json with the success rates.

    Example: trajtune demo --out runs/demo --overwrite
    """
    from trajtune.config import apply_overrides
    from trajtune.demo import run_demo

    extra = apply_overrides({}, set_ or [])
    nested = [k for k, v in extra.items() if isinstance(v, dict)]
    if nested:
        raise ValueError(f"--set {nested[0]}...: demo settings are flat keys, e.g. --set rl_lr=2e-4")
    run_demo(out, overwrite=overwrite, seed=seed, **{"n_train": n_train, "n_test": n_test, "sft_steps": sft_steps,
                                                     "weak_sft_steps": weak_sft_steps, "rl_steps": rl_steps, **extra})


def register(app: typer.Typer) -> None:
    app.command("sft")(user_errors(sft))
    app.command("rl")(user_errors(rl))
    from trajtune.cli.eval_cmd import eval_

    app.command("eval")(user_errors(eval_))
    app.command("demo")(user_errors(demo))
