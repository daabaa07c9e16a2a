"""``trajtune merge``: combine models fine-tuned from one base into one model (trajtune.merge)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import click
import typer
from typer.core import TyperCommand

from trajtune.progress import console

_MULTI = ("--models", "--weights")


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


class MultiValueCommand(TyperCommand):
    """Lets ``--models A B C`` and ``--weights 1 0.5 2`` take several values, as docs/cli.md writes
    them: click options take one value each, so ``--models A B`` is rewritten to ``--models A
    --models B`` before parsing (a value list ends at the next option; a negative number such as
    ``--weights 1 -1`` is a value)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        out: list[str] = []
        current: str | None = None
        for a in args:
            if a.startswith("-") and not _is_number(a):
                current = a if a in _MULTI else None
                if current is None:
                    out.append(a)
                continue
            if current is not None:
                out += [current, a]
            else:
                out.append(a)
        return super().parse_args(ctx, out)


def merge_cmd(
    base: Annotated[str, typer.Option("--base", help="The model the others were fine-tuned from: a directory, "
                                                     "alias or .gguf file.")],
    models: Annotated[list[str], typer.Option("--models", help="The fine-tuned models: HF directories or LoRA "
                                                               "adapter directories (merged onto --base first); "
                                                               "several values.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output directory (an HF model dir with merge.json).")],
    method: Annotated[str, typer.Option("--method", help="ta, ties, dare, ram or ram_plus.")],
    weights: Annotated[Optional[list[float]], typer.Option("--weights", help="One factor per model, multiplying its "
                                                                             "task vector; several values.")] = None,
    lam: Annotated[float, typer.Option("--lambda", help="Scale of the merged delta: base + lambda * delta.")] = 1.0,
    density: Annotated[Optional[float], typer.Option("--density", help="ties: fraction of each task vector kept, "
                                                                       "in (0, 1] (default 0.2).")] = None,
    drop: Annotated[Optional[float], typer.Option("--drop", help="dare: drop probability in [0, 1) "
                                                                 "(default 0.9).")] = None,
    dare_base: Annotated[Optional[str], typer.Option("--dare-base", help="dare: combine with ta (default) "
                                                                         "or ties.")] = None,
    seed: Annotated[Optional[int], typer.Option("--seed", help="dare: seed of the drop masks (default 0).")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace --out if it exists.")] = False,
) -> None:
    """Merge fine-tuned models (or LoRA adapters) of one base into one model, without training.

    Each model j is read as its task vector tau_j = theta_j - theta_base. ta adds them; ties keeps
    each one's largest entries and averages those agreeing in sign; dare drops entries at random
    and rescales the rest, then ta or ties; ram / ram_plus (for RL-trained agents) average entries
    several agents changed and keep each agent's own changes. The output loads with
    from_pretrained like any model; merge.json records the method, options, inputs and how much
    changed. Formulas and advice: docs/merging.md.

    Example: trajtune merge --base runs/base --models runs/rl-home/final runs/rl-shop/final --method ram_plus --out runs/merged

    Example: trajtune merge --base smollm2-135m --models runs/a/final runs/b/final --method ties --density 0.3 --weights 1 0.5 --out runs/ties
    """
    # lazy: imports torch, which the CLI's start-up (`trajtune --help`) must not load
    from trajtune.merge import MergeOptions, iter_summary_lines, merge_models

    opts = MergeOptions(method=method, weights=weights, lam=lam, density=density, drop=drop,
                        dare_base=dare_base, seed=seed)

    def notify(message: str) -> None:
        console.print(message, soft_wrap=True)

    result = merge_models(base, models, opts, out, overwrite=overwrite, notify=notify)
    for line in iter_summary_lines(result.summary):
        console.print(line, soft_wrap=True, markup=False)
    console.print(f"merged model: {result.out}", soft_wrap=True)


def register(app: Any) -> None:
    app.command("merge", cls=MultiValueCommand)(merge_cmd)
