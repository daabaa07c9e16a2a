"""Multi-stage recipes: SFT → RFT → RL → merge → eval as one config file (``trajtune recipe``).

The agent papers train in stages (KAT-Coder: SFT, RFT, RL, merge; Klear and meow-tea-taro: SFT then
RL), and every stage's output is the next one's model. Run by hand that is a chain of commands
whose paths must be copied from one to the next, and a failure three stages in means working out
by hand what finished. A recipe names the stages once; each runs through the same code its own
command runs (``train.run``, ``eval.run.run_eval``, ``merge.merge_models``,
``models.export.export_adapter``, ``envs.expert_data``), in its own subdirectory, and
``recipe.json`` records what each stage produced. ``--resume`` skips finished stages and continues
the unfinished one from its checkpoint.

Every stage's config is validated before the first stage starts, so a typo in the last stage does
not surface after an hour of training.

(Not ``algorithms.registry.Recipe``, which is one algorithm's experience source and objective: a
recipe file here chains whole runs.)
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from trajtune.config import EnvSpec, read_config, validate_config
from trajtune.errors import ConfigError, RunDirError, UsageError
from trajtune.progress import StageClock, console
from trajtune.schema import atomic_write_text

RECIPE_FILE = "recipe.yaml"  # the recipe as run, in the output directory (a resume must match it)
STATUS_FILE = "recipe.json"  # what each finished stage produced

#: Stage kinds besides the registered training algorithms.
TOOLS = ("generate", "eval", "merge", "export")
#: Kinds whose output is a model the next stages continue from.
MAKES_MODEL = ("merge", "export")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class GenerateStage(BaseModel):
    """Expert trajectories from an environment's scripted expert (``trajtune data generate``)."""

    model_config = ConfigDict(extra="forbid")
    env: EnvSpec = Field(description="the environment: a name, or {name, kwargs}, as in a run config's env")
    n: int = Field(100, ge=1, description="number of tasks, one expert trajectory each")
    split: Literal["train", "test"] = Field("train", description="task split")
    seed: int = Field(0, ge=0, description="seed of the task generator")
    only_success: bool = Field(False, description="keep only trajectories whose outcome is a success")


class ExportStage(BaseModel):
    """A LoRA adapter merged into its base as a plain Hugging Face model (``trajtune export``)."""

    model_config = ConfigDict(extra="forbid")
    dtype: Literal["float32", "bfloat16", "float16"] | None = Field(
        None, description="dtype of the saved weights (default: the base's)")


class Stage(BaseModel):
    """One stage: a registered algorithm (sft, rl, rft, dpo, ...) or generate, eval, merge, export."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str = Field(description="the stage's name: its subdirectory of output_dir, and how later stages refer "
                                  "to it")
    run: str = Field(description="sft, rl, rft, dpo or any registered algorithm; or generate, eval, merge, export")
    from_: str | None = Field(None, alias="from", description="the earlier stage whose model this stage starts from "
                              "(default: the latest stage that made a model, else the recipe's model)")
    config: str | None = Field(None, description="training stages: a run config file (relative to the recipe); the "
                               "recipe sets its model and output_dir")
    set: dict[str, Any] = Field(default_factory=dict, description="training stages: overrides of the config, as "
                                "dotted keys (train.steps: 40)")
    data_from: str | None = Field(None, description="training stages: a generate stage whose file becomes "
                                  "data.path")
    eval: dict[str, Any] | None = Field(None, description="eval stages: `trajtune eval` settings (env, tasks, "
                                        "benchmark, max_new_tokens, ...) without model")
    generate: GenerateStage | None = Field(None, description="generate stages: the environment and tasks")
    merge: dict[str, Any] | None = Field(None, description="merge stages: `trajtune merge` options (method, "
                                         "weights, lam, density, drop, dare_base, seed)")
    models: list[str] | None = Field(None, description="merge stages: the stages whose models are merged onto the "
                                     "recipe's model (default: the latest model)")
    export: ExportStage | None = Field(None, description="export stages: options (dtype)")

    @model_validator(mode="after")
    def _sections_match_the_kind(self) -> Stage:
        """A section of another kind would be ignored: refuse it, naming the kind it belongs to."""
        if not NAME.match(self.name):
            raise ValueError(f"stage name {self.name!r}: use letters, digits, '_', '.' and '-' (it names a directory)")
        train = self.run not in TOOLS
        sections = {"eval": "eval", "generate": "generate", "merge": "merge", "models": "merge", "export": "export",
                    "config": "a training", "set": "a training", "data_from": "a training"}
        for key, kind in sections.items():
            value = getattr(self, key)
            given = bool(value) if isinstance(value, dict) else value is not None
            mine = train if kind == "a training" else self.run == kind
            if given and not mine:
                raise ValueError(f"stage {self.name!r} ({self.run}): `{key}` belongs to {kind} stage")
        for kind in ("eval", "generate", "merge"):
            if self.run == kind and getattr(self, kind) is None:
                raise ValueError(f"stage {self.name!r}: a {kind} stage needs its `{kind}:` section")
        if self.run == "generate" and self.from_ is not None:
            raise ValueError(f"stage {self.name!r}: a generate stage uses the environment's expert, not a model; "
                             "remove `from`")
        for key in ("output_dir", "model"):
            if any(k == key or k.startswith(key + ".") for k in self.set):
                raise ValueError(f"stage {self.name!r}: set.{key} is the recipe's to choose (the stage's directory, "
                                 "the previous stage's model); use `from` to pick the model")
        return self


class RecipeFile(BaseModel):
    """A recipe file: the output directory, the starting model and the stages in order."""

    model_config = ConfigDict(extra="forbid")
    output_dir: str = Field(description="the recipe's directory; each stage writes to output_dir/NAME")
    model: str | None = Field(None, description="the starting model (an alias, a directory or a hub id); without "
                              "it the first training stage's config names it")
    report: bool = Field(True, description="write output_dir/report.html (every stage on one page) at the end")
    stages: list[Stage] = Field(min_length=1, description="the stages, run in order")

    @model_validator(mode="after")
    def _references(self) -> RecipeFile:
        """Names unique; `from`, `models` and `data_from` name earlier stages of the right kind."""
        from trajtune.algorithms.registry import algorithms

        known = algorithms()
        seen: dict[str, str] = {}
        for s in self.stages:
            if s.run not in known and s.run not in TOOLS:
                raise ValueError(f"stage {s.name!r}: unknown run {s.run!r}; known: "
                                 f"{', '.join(sorted(known) + list(TOOLS))}")
            if s.name in seen:
                raise ValueError(f"two stages are named {s.name!r}; names must differ (each is a directory)")
            refs = [("from", s.from_)] + [("models", m) for m in s.models or []] + [("data_from", s.data_from)]
            for key, ref in refs:
                if ref is None:
                    continue
                if ref not in seen:
                    later = any(t.name == ref for t in self.stages)
                    raise ValueError(f"stage {s.name!r}: {key}: {ref!r} is not an earlier stage"
                                     + (" (it comes later)" if later else ""))
                if key == "data_from" and seen[ref] != "generate":
                    raise ValueError(f"stage {s.name!r}: data_from: {ref!r} is a {seen[ref]} stage, not generate")
                if key != "data_from" and not _makes_model(seen[ref]):
                    raise ValueError(f"stage {s.name!r}: {key}: {ref!r} is a {seen[ref]} stage, which makes no model")
            if s.run == "merge" and self.model is None:
                raise ValueError(f"stage {s.name!r}: merge adds task vectors to a base: set the recipe's `model`")
            seen[s.name] = s.run
        return self


def _makes_model(run: str) -> bool:
    return run not in TOOLS or run in MAKES_MODEL


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> tuple[RecipeFile, Path]:
    """The recipe and the directory its relative paths start from (the recipe file's)."""
    data, source = read_config(path, overrides)
    from trajtune.config import with_overrides

    return validate_config(data, RecipeFile, with_overrides(source, overrides)), Path(path).resolve().parent


# -- one stage's settings -------------------------------------------------------------------------

def _train_config(stage: Stage, base: Path, out: Path, model: str | None, data_path: Path | None) -> Any:
    """The stage's run config: its file and overrides, with the recipe's model and output directory."""
    from trajtune.algorithms.registry import algorithms
    from trajtune.config import with_overrides

    path = base / stage.config if stage.config else None
    sets = [f"{k}={json.dumps(v)}" for k, v in stage.set.items()]
    data, source = read_config(path, sets)
    source = f"stage {stage.name!r} ({with_overrides(source, sets)})"
    tag = data.get("algorithm", stage.run)
    if tag != stage.run:
        raise ConfigError(f"{source}: algorithm: {tag} is not the stage's run: {stage.run}")
    cls = algorithms()[stage.run].config
    data["output_dir"] = str(out / stage.name)
    if model is not None:
        data["model"] = {**data["model"], "name_or_path": model} if isinstance(data.get("model"), dict) else model
    elif "model" not in data:
        raise ConfigError(f"{source}: no model: set the recipe's `model`, or `model` in the stage's config")
    if data_path is not None:
        if "data" not in cls.model_fields:
            raise ConfigError(f"{source}: data_from: a {stage.run} run takes no data file")
        data["data"] = {**(data.get("data") or {}), "path": str(data_path)}
    return validate_config({**data, "algorithm": stage.run}, cls, source)


def _eval_settings(stage: Stage, model: str) -> Any:
    from trajtune.eval.harness import EvalSettings

    names = {f.name for f in dataclasses.fields(EvalSettings)} - {"model"}
    given = dict(stage.eval or {})
    unknown = sorted(set(given) - names)
    if "model" in given:
        raise ConfigError(f"stage {stage.name!r}: eval.model is the recipe's to choose; use `from` to pick the model")
    if unknown:
        raise ConfigError(f"stage {stage.name!r}: unknown eval setting(s) {unknown}; known: {', '.join(sorted(names))}")
    if "env" in given and isinstance(given["env"], dict):  # {name, kwargs}, as a run config writes env
        spec = EnvSpec.model_validate(given["env"])
        given["env"], given["env_kwargs"] = spec.name, {**spec.kwargs, **given.get("env_kwargs", {})}
    if bool(given.get("env")) == bool(given.get("benchmark")):
        raise ConfigError(f"stage {stage.name!r}: an eval stage needs one of eval.env or eval.benchmark")
    return EvalSettings(model=model, **given)


def _merge_options(stage: Stage) -> Any:
    from trajtune.merge import MergeOptions

    opts = validate_config(dict(stage.merge or {}), MergeOptions, f"stage {stage.name!r} merge")
    opts.check(len(stage.models or [None]))
    return opts


class _Plan:
    """Where each stage's model, data and output are, worked out before anything runs."""

    def __init__(self, recipe: RecipeFile, base: Path, out: Path):
        self.recipe, self.base, self.out = recipe, base, out
        self.models: dict[str, str] = {}  # stage -> the model it makes
        self.inputs: dict[str, str | None] = {}  # stage -> the model it starts from
        self.data: dict[str, Path] = {}  # generate stage -> its file
        self.current: str | None = recipe.model

    def model_for(self, stage: Stage) -> str | None:
        return self.models[stage.from_] if stage.from_ else self.current

    def settings(self, stage: Stage) -> Any:
        """The stage's validated settings; records what the stage will make."""
        d = self.out / stage.name
        model = self.inputs[stage.name] = self.model_for(stage)
        if stage.run == "generate":
            self.data[stage.name] = d / "data.jsonl"
            return stage.generate
        if stage.run == "eval":
            if model is None:
                raise ConfigError(f"stage {stage.name!r}: no model to evaluate yet (set the recipe's `model`)")
            return _eval_settings(stage, model)
        if stage.run == "merge":
            settings = _merge_options(stage)
            self.models[stage.name] = self.current = str(d)
            return settings
        if stage.run == "export":
            if model is None:
                raise ConfigError(f"stage {stage.name!r}: no model to export yet")
            self.models[stage.name] = self.current = str(d)
            return stage.export or ExportStage()
        cfg = _train_config(stage, self.base, self.out, model,
                            self.data[stage.data_from] if stage.data_from else None)
        self.models[stage.name] = self.current = str(d / "final")
        return cfg


# -- running ---------------------------------------------------------------------------------------

def _done(stage: Stage, d: Path) -> bool:
    """Whether the stage finished earlier (its outputs are written atomically, so present = complete)."""
    from trajtune.eval.store import RESULTS_FILE
    from trajtune.train import inspect_run_dir

    if stage.run == "generate":
        return (d / "data.jsonl").exists()
    if stage.run == "eval":
        return (d / RESULTS_FILE).exists()
    if stage.run == "merge":
        return (d / "merge.json").exists()
    if stage.run == "export":
        return (d / "export.json").exists()
    return inspect_run_dir(d).status == "finished"


def _finished_summary(stage: Stage, d: Path) -> dict[str, Any]:
    """What a stage that finished earlier produced, read back from its files."""
    from trajtune.eval.store import RESULTS_FILE

    if stage.run == "generate":
        return {"data": str(d / "data.jsonl")}
    if stage.run == "eval":
        return {"metrics": json.loads((d / RESULTS_FILE).read_text()).get("metrics", {})}
    if stage.run in MAKES_MODEL:
        return {"model": str(d)}
    result = json.loads((d / "result.json").read_text())
    return {"model": str(d / "final"), **{k: v for k, v in result.items() if k != "last"}}


def _run_stage(stage: Stage, settings: Any, d: Path, plan: _Plan, quiet: bool) -> dict[str, Any]:
    """Run one stage (continuing it when it has a checkpoint or unfinished evaluation); its summary."""
    if stage.run == "generate":
        from trajtune.envs.expert_data import write_expert_data
        from trajtune.envs.registry import make_env

        g = settings
        tasks = make_env(g.env.name, **g.env.kwargs).tasks(g.split, g.n, g.seed)
        d.mkdir(parents=True, exist_ok=True)
        stats = write_expert_data(g.env.name, g.env.kwargs, tasks, d / "data.jsonl", overwrite=True,
                                  only_success=g.only_success)
        return {"data": str(d / "data.jsonl"), "trajectories": stats.kept, "expert_successes": stats.successes,
                "tasks": stats.tasks}
    if stage.run == "eval":
        from trajtune.eval.run import run_eval

        res = run_eval(settings, out_dir=d, resume=d.exists(), quiet=quiet)
        return {"model": settings.model, "metrics": res.get("metrics", {})}
    if stage.run == "merge":
        from trajtune.merge import merge_models

        assert plan.recipe.model is not None  # the recipe's validator requires it
        sources = [plan.models[m] for m in stage.models] if stage.models else [plan.inputs[stage.name]]
        merged = merge_models(plan.recipe.model, [s for s in sources if s], settings, d, overwrite=True)
        return {"model": str(merged.out), "merged": sources}
    if stage.run == "export":
        from trajtune.models.export import export_adapter

        exported = export_adapter(plan.inputs[stage.name] or "", d, dtype=settings.dtype, overwrite=True)
        return {"model": str(exported.out)}
    from trajtune.train import inspect_run_dir, run

    st = inspect_run_dir(d)
    result = run(settings, resume=st.status in ("started", "checkpointed"), quiet=quiet)
    return {"model": str(d / "final"), **{k: v for k, v in result.items() if k != "last"}}


def _check_out(out: Path, recipe_text: str, overwrite: bool, resume: bool) -> None:
    """A new recipe never lands on other files; a resumed one must be the same recipe."""
    if overwrite and resume:
        raise UsageError("--overwrite and --resume exclude each other")
    if resume:
        saved = out / RECIPE_FILE
        if not saved.exists():
            raise RunDirError(f"--resume: {out} holds no recipe run ({RECIPE_FILE} missing); run without --resume")
        old, new = yaml.safe_load(saved.read_text()), yaml.safe_load(recipe_text)
        if old != new:
            from trajtune.train import config_diff, format_diff

            raise RunDirError(f"--resume: the recipe differs from {saved}:\n{format_diff(config_diff(old, new))}\n"
                              "resume with the same recipe, or run it into another output_dir")
        return
    if out.exists() and not out.is_dir():
        raise RunDirError(f"output_dir {out} is an existing file, not a directory")
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            what = "other files"
            if (out / RECIPE_FILE).exists():
                finished = (out / STATUS_FILE).exists() and json.loads((out / STATUS_FILE).read_text()).get("finished")
                what = "a finished recipe" if finished else "an unfinished recipe"
            raise RunDirError(f"output_dir {out} already holds {what}; pass --resume to continue a recipe, "
                              "--overwrite to replace it, or choose another output_dir")
        shutil.rmtree(out)


def plan_recipe(path: str | Path, overrides: list[str] | None = None) -> tuple[RecipeFile, _Plan, list[Any]]:
    """The recipe, where each stage's inputs and outputs will be, and every stage's validated
    settings: all of it checked, nothing run."""
    recipe, base = load_recipe(path, overrides)
    out = Path(recipe.output_dir)
    if not out.is_absolute():
        out = Path.cwd() / out
    plan = _Plan(recipe, base, out)
    return recipe, plan, [plan.settings(s) for s in recipe.stages]


def describe_plan(recipe: RecipeFile, plan: _Plan) -> dict[str, Any]:
    """What ``trajtune recipe --check`` prints: per stage, the model it starts from and what it makes."""
    rows = []
    for s in recipe.stages:
        start = None if s.run == "generate" else plan.inputs[s.name]
        makes = plan.models.get(s.name) or (str(plan.data[s.name]) if s.name in plan.data else None)
        rows.append({"stage": s.name, "run": s.run, "model": start, "makes": makes,
                     "output": str(plan.out / s.name)})
    return {"output_dir": str(plan.out), "stages": rows, "model": plan.current}


def run_recipe(path: str | Path, overrides: list[str] | None = None, *, overwrite: bool = False,
               resume: bool = False, quiet: bool = False) -> dict[str, Any]:
    """Run every stage of the recipe at ``path`` in order; returns (and writes) ``recipe.json``."""
    recipe, plan, settings = plan_recipe(path, overrides)  # every stage checked before the first runs
    out = plan.out
    recipe_text = yaml.safe_dump(recipe.model_dump(mode="json", by_alias=True), sort_keys=False)
    _check_out(out, recipe_text, overwrite, resume)
    out.mkdir(parents=True, exist_ok=True)
    if not (out / RECIPE_FILE).exists():
        atomic_write_text(out / RECIPE_FILE, recipe_text)
    status_path = out / STATUS_FILE
    status: dict[str, Any] = json.loads(status_path.read_text()) if status_path.exists() else {"stages": {}}
    clock = StageClock()
    for i, (stage, cfg) in enumerate(zip(recipe.stages, settings), start=1):
        d = out / stage.name
        if _done(stage, d):
            if not quiet:
                console.print(f"stage {i}/{len(recipe.stages)} {stage.name} ({stage.run}): finished earlier",
                              highlight=False)
            if stage.name not in status["stages"]:  # killed between the stage's end and this file's update
                status["stages"][stage.name] = {"run": stage.run, **_finished_summary(stage, d)}
                atomic_write_text(status_path, json.dumps(status, indent=1, default=str))
            continue
        if not quiet:
            console.print(f"stage {i}/{len(recipe.stages)} {stage.name} ({stage.run})", highlight=False)
        with clock(stage.name):
            summary = _run_stage(stage, cfg, d, plan, quiet)
        status["stages"][stage.name] = {"run": stage.run, "seconds": clock.times[stage.name],
                                        "peak_rss_mb": clock.peak[stage.name], **summary}
        atomic_write_text(status_path, json.dumps(status, indent=1, default=str))
    status["model"] = plan.current
    status["finished"] = True
    atomic_write_text(status_path, json.dumps(status, indent=1, default=str))
    if recipe.report:
        from trajtune.report import report_after_run

        report_after_run(out, quiet=quiet)
    return status
