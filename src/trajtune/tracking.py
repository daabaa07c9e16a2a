"""Experiment tracking (``tracking: [tensorboard, trackio, wandb]`` in a run config).

Why: people compare runs in the dashboard they already use. The run directory stays the record
(``metrics.jsonl``, ``report.html``); a tracker mirrors it: the config once, every logged step's
numeric metrics, and the final evaluation as a table. Each backend is an optional package (the
``tracking`` extra) checked before training starts, so a missing one is a one-line error, not a
crash after an hour of training.

Where they write:

- ``tensorboard``: ``OUTPUT_DIR/tensorboard`` (``tensorboard --logdir OUTPUT_DIR/tensorboard``);
- ``wandb``: offline, ``OUTPUT_DIR/wandb`` (``wandb sync OUTPUT_DIR/wandb/offline-run-*`` uploads
  it; ``WANDB_MODE=online`` logs live instead), project ``WANDB_PROJECT`` or ``trajtune``;
- ``trackio``: its local database (``TRACKIO_DIR``, by default in the Hugging Face cache), project
  ``trajtune``; ``trackio show --project trajtune`` opens the dashboard.

The run name is the output directory's name. Backends' own console chatter goes to stderr, so a
command's stdout stays its result.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trajtune.errors import ConfigError

BACKENDS = {"tensorboard": "tensorboard", "trackio": "trackio", "wandb": "wandb"}  # name -> import


def check_installed(backends: list[str]) -> None:
    """Refuse, before anything runs, a backend whose package is missing."""
    for b in backends:
        if importlib.util.find_spec(BACKENDS[b]) is None:
            raise ConfigError(f"tracking: {b} is not installed; pip install 'trajtune[tracking]' (or pip install {b})")


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with contextlib.redirect_stdout(sys.stderr):
        yield


def _numeric(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v)) and k != "step"}


class Tracker:
    """Fans ``log`` / ``log_table`` / ``finish`` out to the configured backends."""

    def __init__(self, backends: list[str], out: Path, config: dict[str, Any]):
        check_installed(backends)
        self.backends = list(backends)
        self.out = Path(out)
        name = self.out.resolve().name
        self._tb: Any = None
        self._wandb: Any = None
        self._trackio: Any = None
        with _quiet():
            if "tensorboard" in backends:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(log_dir=str(self.out / "tensorboard"))
                self._tb.add_text("config", "```yaml\n" + json.dumps(config, indent=1, default=str) + "\n```", 0)
            if "wandb" in backends:
                import wandb

                os.environ.setdefault("WANDB_SILENT", "true")
                (self.out / "wandb").mkdir(parents=True, exist_ok=True)
                self._wandb = wandb.init(mode=os.environ.get("WANDB_MODE", "offline"), dir=str(self.out),
                                         project=os.environ.get("WANDB_PROJECT", "trajtune"), name=name,
                                         config=config, reinit="create_new")
            if "trackio" in backends:
                import trackio

                self._trackio = trackio.init(project="trajtune", name=name, config=config, auto_log_cpu=False,
                                             auto_log_gpu=False)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        values = _numeric(metrics)
        if not values:
            return
        with _quiet():
            if self._tb is not None:
                for k, v in values.items():
                    self._tb.add_scalar(k, v, step)
                self._tb.flush()
            if self._wandb is not None:
                self._wandb.log(values, step=step)
            if self._trackio is not None:
                self._trackio.log(values, step=step)

    def log_table(self, name: str, step: int, rows: dict[str, Any]) -> None:
        """A final evaluation: a metric/value table, and its numbers as scalars ``name/metric``."""
        values = _numeric(rows)
        with _quiet():
            if self._tb is not None:
                table = "| metric | value |\n|---|---|\n" + "".join(f"| {k} | {v:.6g} |\n" for k, v in values.items())
                self._tb.add_text(name, table, step)
            if self._wandb is not None:
                import wandb

                self._wandb.log({name: wandb.Table(columns=["metric", "value"],
                                                   data=[[k, v] for k, v in values.items()])}, step=step)
            if self._trackio is not None:
                import trackio

                self._trackio.log({name: trackio.Table(data=[[k, v] for k, v in values.items()],
                                                       columns=["metric", "value"])}, step=step)
        self.log(step, {f"{name}/{k}": v for k, v in values.items()})

    def finish(self) -> None:
        with _quiet():
            if self._tb is not None:
                self._tb.close()
            if self._wandb is not None:
                self._wandb.finish()
            if self._trackio is not None:
                from trackio import context_vars

                self._trackio.finish()
                if context_vars.current_run.get() is self._trackio:  # else trackio finishes it again at exit
                    context_vars.current_run.set(None)
