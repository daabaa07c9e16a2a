"""Training runs: one ``run(cfg)`` for every algorithm.

The config's ``algorithm:`` picks a registered algorithm (``trajtune.algorithms.registry``), whose
recipe supplies the experience source (with its transforms) and the objective; this module only
wires them to the one learner, manages the run directory (refuse, resume, compare configs) and
writes the artifacts.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from trajtune import distributed as dist
from trajtune import sharding
from trajtune.algorithms.registry import Recipe, RunContext, get_algorithm
from trajtune.algorithms.sft import iter_data  # noqa: F401  (re-exported: trajtune.train.iter_data)
from trajtune.chat.doctor import check_template
from trajtune.chat.render import ChatRenderer, RenderConfig, RenderError
from trajtune.config import DataSpec, RunBase, dump_config
from trajtune.envs.registry import make_env
from trajtune.eval.run import evaluate
from trajtune.errors import ConfigError, Interrupted, RankFailed, RunDirError, UsageError
from trajtune.learner import (
    Learner,
    LearnerConfig,
    checkpoint_step,
    is_peft,
    latest_checkpoint,
    remove_interrupted_writes,
    set_seed,
)
from trajtune.models.loading import load_model, load_tokenizer
from trajtune.models.reference import AdapterReference
from trajtune.models.resolve import resolve_model
from trajtune.plots import plot_metrics
from trajtune.progress import bar, console
from trajtune.report import report_after_run
from trajtune.rollout import RolloutConfig
from trajtune.schema import atomic_write_text
from trajtune.tracking import Tracker, check_installed
from trajtune.vllm_backend import attach as attach_vllm
from trajtune.vllm_backend import check_available as check_vllm_available


@dataclass
class RunState:
    """What an output directory holds, so a command can refuse, continue or report it correctly."""

    path: Path
    status: Literal["new", "foreign", "started", "checkpointed", "finished"]
    step: int = 0  # the latest checkpoint's step, or the finished run's step
    kind: str | None = None  # the algorithm ("sft", "rl", "rft", "dpo") from run.json


def inspect_run_dir(path: str | Path) -> RunState:
    """``new`` (absent or empty), ``foreign`` (not a trajtune run), ``started`` (killed before its first
    checkpoint), ``checkpointed`` (unfinished, resumable) or ``finished`` (final model and result.json)."""
    p = Path(path)
    if not p.exists() or not any(p.iterdir()):
        return RunState(p, "new")
    if not (p / "config.yaml").exists():
        return RunState(p, "foreign")
    kind = None
    if (p / "run.json").exists():
        kind = json.loads((p / "run.json").read_text()).get("kind")
    if (p / "result.json").exists() and (p / "final").is_dir():
        return RunState(p, "finished", int(json.loads((p / "result.json").read_text()).get("step", 0)), kind)
    ckpt = latest_checkpoint(p / "checkpoints")
    if ckpt is not None:
        return RunState(p, "checkpointed", checkpoint_step(ckpt), kind)
    return RunState(p, "started", 0, kind)


def check_run_dir(path: str | Path, overwrite: bool = False, resume: bool = False) -> RunState:
    """Refuse to clobber an existing run unless told: --overwrite replaces it, --resume continues it.

    Called before any expensive or writing work, so a refused run leaves nothing behind. The message
    says what the directory holds and which flag does what with it."""
    if overwrite and resume:
        raise UsageError("--overwrite and --resume exclude each other")
    if Path(path).exists() and not Path(path).is_dir():
        raise RunDirError(f"output directory {path} is an existing file, not a directory; choose another "
                          "output_dir (or move the file)")
    st = inspect_run_dir(path)
    p = st.path
    if st.status == "started" and not resume and _only_start_files(p):
        return RunState(p, "new")  # it failed before anything was trained or mined: the fixed rerun may start
    if resume:
        if st.status == "new":
            raise RunDirError(f"--resume: {p} has no run to resume; run without --resume to start one")
        if st.status == "foreign":
            raise RunDirError(f"--resume: {p} is not a trajtune run directory (no config.yaml); nothing to resume")
        return st
    if st.status == "new" or overwrite:
        return st
    if st.status == "finished":
        why = (f"holds a finished run (step {st.step}); pass --overwrite to replace it, or train further in a new "
               f"run with --set model={p / 'final'} --set output_dir=NEW_DIR")
    elif st.status == "checkpointed":
        why = (f"holds an unfinished run (latest checkpoint: step {st.step}); pass --resume to continue it, "
               "or --overwrite to delete it and start again")
    elif st.status == "started":
        why = ("holds a run that stopped before its first checkpoint; pass --resume to start it again from "
               "step 0 in place, or --overwrite to delete it and start again")
    else:
        why = "is not empty; pass --overwrite to replace it or choose another output_dir"
    raise RunDirError(f"output directory {p} already exists and {why}")


#: What a run writes before its first step (``_write_common``): a directory holding only these lost
#: nothing when the run failed (a bad model file, a wrong option), so a rerun may replace it.
START_FILES = frozenset({"config.yaml", "run.json"})


def _only_start_files(p: Path) -> bool:
    return {x.name for x in p.iterdir()} <= START_FILES


def prepare_run_dir(path: str | Path, overwrite: bool = False, resume: bool = False) -> Path:
    p = check_run_dir(path, overwrite, resume).path
    if resume:
        return p
    if p.exists() and any(p.iterdir()):
        shutil.rmtree(p)
    p.mkdir(parents=True, exist_ok=True)
    return p


#: Keys a resume may change silently: the run directory is found through output_dir, so a moved
#: directory (or a config that names it differently) is still the same run.
RESUME_FREE_KEYS = {"output_dir"}


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict) or not d:
        return {prefix: d} if prefix else {}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def config_diff(old: dict[str, Any], new: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Dotted key -> (old, new) for every value that differs (absent keys count as None)."""
    a, b = _flatten(old), _flatten(new)
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b))
            if k not in RESUME_FREE_KEYS and a.get(k) != b.get(k)}


def format_diff(diff: dict[str, tuple[Any, Any]]) -> str:
    return "\n".join(f"  {k}: {json.dumps(o, default=str)} → {json.dumps(n, default=str)}" for k, (o, n) in diff.items())


def check_resume_config(st: RunState, cfg: RunBase, kind: str,
                        allow_change: bool) -> dict[str, tuple[Any, Any]]:
    """Compare the requested config with the run's config.yaml; refuse a silent change.

    Returns the accepted diff (empty when nothing changed). Raises RunDirError when the run is of
    another kind, when the config changed without ``allow_change``, or when a finished run would have
    to be continued (its final model has no optimizer state to continue from)."""
    p = st.path
    if st.kind is not None and st.kind != kind:
        raise RunDirError(f"--resume: {p} holds a {st.kind} run, not {kind}")
    old = yaml.safe_load((p / "config.yaml").read_text()) or {}
    try:  # fill keys a newer trajtune added (with their defaults), so only real changes show
        old = type(cfg).model_validate(old).model_dump(mode="json")
    except ValueError:  # a config.yaml an older version wrote with keys since removed: compare as stored
        pass
    diff = config_diff(old, cfg.model_dump(mode="json"))
    if st.status == "finished" and diff:
        raise RunDirError(f"--resume: {p} holds a finished run (step {st.step}) and the config differs from its "
                          f"config.yaml:\n{format_diff(diff)}\na finished run is not continued; train further in a "
                          f"new run with --set model={p / 'final'} --set output_dir=NEW_DIR")
    if diff and not allow_change:
        raise RunDirError(f"--resume: the config differs from {p / 'config.yaml'}:\n{format_diff(diff)}\n"
                          "resume with the same config, or pass --allow-config-change to apply the new values "
                          "from the resumed step on (the change is logged in config_changes.jsonl)")
    if diff and cfg.train.steps < st.step:
        raise RunDirError(f"--resume: train.steps ({cfg.train.steps}) is below the step of the latest checkpoint "
                          f"({st.step})")
    return diff


def record_config_change(out: Path, cfg: Any, step: int, diff: dict[str, tuple[Any, Any]]) -> None:
    """Append the accepted change to config_changes.jsonl and make config.yaml hold the values in force."""
    line = json.dumps({"step": step, "time": time.time(),
                       "changes": {k: {"old": o, "new": n} for k, (o, n) in diff.items()}}, default=str)
    with (out / "config_changes.jsonl").open("a", encoding="utf-8") as f:
        f.write(line + "\n")
    atomic_write_text(out / "config.yaml", dump_config(cfg))


def open_run(cfg: RunBase, kind: str, overwrite: bool, resume: bool,
             allow_change: bool) -> tuple[RunState, dict[str, tuple[Any, Any]]]:
    """All run-directory checks, before any model is loaded: refusals, config comparison on resume."""
    if allow_change and not resume:
        raise UsageError("--allow-config-change only applies with --resume")
    st = check_run_dir(cfg.output_dir, overwrite, resume)
    if not resume:  # a new run, or one --overwrite replaces
        return RunState(st.path, "new"), {}
    return st, check_resume_config(st, cfg, kind, allow_change)


def learner_config(cfg: RunBase, recipe: Recipe) -> LearnerConfig:
    """The learner's settings: train.* (the LearnerConfig settings TrainSpec is built from), with what
    the algorithm decides (its micro-batch, PPO epochs and mini-batches) and the run's seed."""
    return LearnerConfig(**{**cfg.train.runtime_kwargs(), "micro_batch_size": recipe.micro_batch_size,
                            "epochs": recipe.epochs, "mini_batches": recipe.mini_batches, "seed": cfg.seed})


def _eval_hook(cfg: RunBase, tok: Any, renderer: ChatRenderer, rollout: RolloutConfig):
    if cfg.eval is None or cfg.eval.env is None:
        return None
    ev = cfg.eval
    env_name, kwargs = ev.env.name, ev.env.kwargs
    tasks = make_env(env_name, **kwargs).tasks("test", ev.n_tasks, seed=ev.seed)
    ro = RolloutConfig(**{**rollout.__dict__, "temperature": ev.temperature})

    def hook(step: int, model: Any) -> dict[str, float]:
        m, _ = evaluate(model, tok, lambda: make_env(env_name, **kwargs), tasks, ro, n=ev.n_samples, ks=ev.k,
                        seed=ev.seed, renderer=renderer)
        return {k: v for k, v in m.items() if isinstance(v, float)}

    return hook


def _eval_rollout(cfg: RunBase) -> RolloutConfig:
    """Rollout settings for the in-run evaluation: the run's own (rl, rft, dpo), else SFT's defaults."""
    spec = getattr(cfg, "rollout", None)
    if spec is not None:
        return spec.to_config()
    return RolloutConfig(max_length=cfg.data.max_length)  # the other settings: RolloutConfig's defaults


def check_chat_template(tok: Any, config: RenderConfig, model: str) -> None:
    """Refuse, before any training, a chat template that would mis-mask (the `trajtune doctor` checks)."""
    report = check_template(tok, config=config)
    if not report.ok:
        why = "; ".join(f"{c.name}: {c.detail}" for c in report.failures)
        raise RenderError(f"the chat template of {model} fails conformance checks ({why}); "
                          f"see `trajtune doctor --model {model}`")


def _write_common(out: Path, cfg: Any, kind: str) -> None:
    atomic_write_text(out / "config.yaml", dump_config(cfg))
    atomic_write_text(out / "run.json", json.dumps({"kind": kind, "started": time.time()}))


def _env_flag(name: str) -> bool:
    import os

    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")


def check_launcher(cfg: RunBase) -> None:
    """An ``accelerate launch`` FSDP or DeepSpeed config is not applied by accelerate here (the learner
    runs its own loop, ``trajtune.sharding``): say so rather than train unsharded under its name."""
    if _env_flag("ACCELERATE_USE_DEEPSPEED"):
        raise ConfigError("accelerate launched this run with a DeepSpeed config, which trajtune does not apply; "
                          "set train.sharding: fsdp to shard the model (PyTorch FSDP2), and launch without the "
                          "DeepSpeed config")
    if _env_flag("ACCELERATE_USE_FSDP") and cfg.train.sharding != "fsdp":
        raise ConfigError("accelerate launched this run with an FSDP config, but train.sharding is none (the config's "
                          "settings are not read by trajtune): set train.sharding: fsdp")


def check_processes(cfg: RunBase) -> None:
    """Refuse, before any process group is joined, what does not run on several processes."""
    check_launcher(cfg)
    world = dist.world_size()
    if world <= 1:
        return
    dist.timeout_s()  # a bad TRAJTUNE_DIST_TIMEOUT_S fails here, on every rank alike
    rollout = getattr(cfg, "rollout", None)
    if getattr(rollout, "ray", None) is not None:
        raise ConfigError(f"rollout.ray with {world} processes is not supported: every rank would start its own "
                          "Ray workers; run the Ray rollout workers from a single process, or drop rollout.ray")
    if getattr(rollout, "server", None) is not None:
        raise ConfigError(f"rollout.server with {world} processes is not supported: every rank would push its weights "
                          "to the server; launch a single process")
    if getattr(rollout, "vllm", None) is not None:
        raise ConfigError(f"rollout.vllm with {world} processes is not supported: every rank would start its own "
                          "vLLM engine on the GPU; launch a single process")
    rl = getattr(cfg, "rl", None)
    if getattr(rl, "async_rollouts", False):
        raise ConfigError(f"rl.async_rollouts with {world} processes is not supported (its background sampler would "
                          "interleave collectives with training); drop it, or launch a single process")


def check_adapter_choice(cfg: RunBase) -> None:
    """``model`` naming a LoRA adapter directory together with a new ``model.lora`` would leave it
    unclear which adapter trains (and a fresh adapter saved on top of a merged one would not load
    back without it), so the user chooses."""
    if cfg.model.lora is None:
        return
    src = resolve_model(cfg.model.name_or_path)
    if src.kind == "dir" and (Path(src.path) / "adapter_config.json").exists():
        raise ConfigError(f"model {cfg.model.name_or_path!r} is a LoRA adapter directory and model.lora asks for a new "
                          "adapter: drop model.lora to go on training that adapter (its saved weights are then the "
                          "reference), or merge it first (trajtune export --model DIR --out MERGED) and train a new "
                          "adapter on the merged model")


def run(cfg: RunBase, *, overwrite: bool = False, resume: bool = False, quiet: bool = False,
        allow_config_change: bool = False, stop_after: int | None = None) -> dict[str, Any]:
    """Train any registered algorithm: its config's ``algorithm:`` picks the recipe; everything else
    (run directory, resume, the learner, final model, result.json) is the same for all of them."""
    algo = get_algorithm(cfg.algorithm)
    kind = algo.name
    check_processes(cfg)
    dist.init(sharded=cfg.train.sharding == "fsdp")
    quiet = quiet or not dist.is_main()
    if cfg.train.sharding == "fsdp" and dist.world_size() == 1 and not quiet:
        console.print(UNSHARDED_NOTE, highlight=False, soft_wrap=True)
    if cfg.tracking:
        check_installed(cfg.tracking)  # before anything is written or loaded
    check_vllm_available(cfg)  # rollout.vllm: vLLM importable and a CUDA GPU, before anything is written
    st, diff = open_run(cfg, kind, overwrite, resume, allow_config_change)
    dist.barrier()  # every rank has checked the directory before rank 0 changes it
    if st.status == "finished":
        result = _already_finished(st, quiet)
        dist.finish()
        return result
    check_adapter_choice(cfg)
    set_seed(cfg.seed)
    tok = load_tokenizer(cfg.model.name_or_path, cfg.model.chat_template)
    data = getattr(cfg, "data", None)
    # error masking writes train_on's choice into per-message flags (algorithms/error_mask.py)
    train_on = (("hint" if data.mask_errors or data.critical_steps is not None else data.train_on)
                if isinstance(data, DataSpec) else "hint")
    renderer = ChatRenderer(tok, cfg.render.to_render_config(train_on=train_on))
    check_chat_template(tok, renderer.config, cfg.model.name_or_path)
    ctx = RunContext(tokenizer=tok, renderer=renderer, quiet=quiet)
    prepared = algo.prepare(cfg, ctx)
    if dist.is_main():
        out = _start_run(cfg, kind, st, diff, overwrite, resume)
    else:
        out = Path(cfg.output_dir)
    dist.barrier()
    ctx.out = out
    dtype = model_dtype(cfg)
    ctx.model = _load_policy(cfg, st, out, dtype)

    def reference() -> Any:
        if is_peft(ctx.model):  # the step-0 policy is inside the LoRA model: no second copy (models/reference.py)

            return AdapterReference(ctx.model, fresh=cfg.model.lora is not None)
        ref = load_model(cfg.model.name_or_path, dtype=dtype, trainable=False).eval().requires_grad_(False)
        return sharding.shard(ref) if dist.sharded() else ref  # sharded like the policy: no full copy per rank

    ctx.load_reference = reference
    recipe = algo.build(cfg, ctx, prepared)
    if getattr(getattr(cfg, "rollout", None), "vllm", None) is not None:  # every rollout of the run through vLLM
        recipe = attach_vllm(recipe, cfg, ctx.model, out / "vllm", quiet)
    hook = _eval_hook(cfg, tok, renderer, _eval_rollout(cfg))
    tracker = None
    if cfg.tracking and dist.is_main():
        tracker = Tracker(cfg.tracking, out, cfg.model_dump(mode="json"))
    learner = Learner(ctx.model, tok, recipe.objective, recipe.source, learner_config(cfg, recipe), out,
                      eval_hook=hook, on_weights=recipe.on_weights, stop_after=stop_after,
                      on_step=tracker.log if tracker else None)
    learner.step_logs.extend(recipe.step_logs)
    try:
        result = _train_and_finish(learner, cfg, out, kind, st, quiet, hook, recipe)
        if tracker is not None and isinstance(result.get("eval"), dict):
            tracker.log_table("final_eval", learner.step, result["eval"])
        dist.finish()
        return result
    finally:
        if tracker is not None:
            tracker.finish()


#: What a 1-process run of a ``train.sharding: fsdp`` config says (it trains as ``none`` does).
UNSHARDED_NOTE = ("[yellow]warning:[/yellow] train.sharding: fsdp with one process: nothing to shard, so the model "
                  "trains unsharded (launch several processes to shard it; docs/distributed.md)")


def model_dtype(cfg: RunBase) -> str:
    """The dtype the policy (and a reference model) loads in: ``model.dtype``, except that fsdp trains
    float32 parameters, so ``auto`` loads a half-precision checkpoint in float32 there (on one process
    too, so that a 1-process run of the config computes what the sharded run equals)."""
    return "float32" if cfg.train.sharding == "fsdp" and cfg.model.dtype == "auto" else cfg.model.dtype


def _load_policy(cfg: RunBase, st: RunState, out: Path, dtype: str) -> Any:
    """The model to train, sharded across the ranks when the run is (before the recipe is built, so
    its reference model and rollouts see the sharded model). A model that does not load leaves a new
    run directory as it found it."""
    try:
        model = load_model(cfg.model.name_or_path, lora=cfg.model.lora, dtype=dtype,
                           gradient_checkpointing=cfg.train.gradient_checkpointing)
    except BaseException:
        if dist.is_main() and st.status == "new" and out.is_dir() and _only_start_files(out):
            shutil.rmtree(out)
        raise
    return sharding.shard(model) if dist.sharded() else model


def run_sft(cfg: Any, **kwargs: Any) -> dict[str, Any]:
    """``run`` for an SFT config (the ``trajtune sft`` alias)."""
    return run(cfg, **kwargs)


def run_rl(cfg: Any, **kwargs: Any) -> dict[str, Any]:
    """``run`` for an RL config (the ``trajtune rl`` alias)."""
    return run(cfg, **kwargs)


def _already_finished(st: RunState, quiet: bool) -> dict[str, Any]:
    """--resume on a finished run with an unchanged config: nothing to train; report its result."""
    if not quiet:
        console.print(f"{st.path} already finished at step {st.step}; nothing to resume (result.json below)",
                      soft_wrap=True)
    return {**json.loads((st.path / "result.json").read_text()), "already_finished": True}


def _start_run(cfg: Any, kind: str, st: RunState, diff: dict[str, tuple[Any, Any]], overwrite: bool,
               resume: bool) -> Path:
    """Create (or keep, on resume) the run directory; write the config, or record an accepted change.

    The environments are made first, so an unknown name or bad argument (EnvError) is refused
    before anything is written."""
    if cfg.eval is not None and cfg.eval.env is not None:
        make_env(cfg.eval.env.name, **cfg.eval.env.kwargs)
    out = prepare_run_dir(cfg.output_dir, overwrite, resume)
    if not resume:
        _write_common(out, cfg, kind)
    elif diff:
        record_config_change(out, cfg, st.step, diff)
    return out


def _resume(learner: Learner, quiet: bool) -> None:
    """Continue from the latest checkpoint, or from step 0 when the run died before its first one.

    First (rank 0) the leftovers of writes the crash interrupted are removed: temp files and
    directories of atomic writes, and a torn last line of the step logs (with a warning)."""
    if dist.is_main():
        removed = remove_interrupted_writes(learner.out)
        if removed:
            learner.resume_warnings.append(
                f"removed {len(removed)} temp file(s) of writes the interrupted run did not finish: "
                + ", ".join(str(p.relative_to(learner.out)) for p in removed[:5]) + (" ..." if len(removed) > 5 else ""))
    dist.barrier()
    if learner.latest_checkpoint() is not None:
        learner.resume()
    else:
        learner.restart()
        if not quiet:
            console.print(f"no checkpoint in {learner.out}: the run stopped before its first one; starting again "
                          "from step 0", soft_wrap=True)
    for warning in learner.resume_warnings:
        console.print(f"[yellow]warning:[/yellow] {warning}", highlight=False, soft_wrap=True)


def _train_and_finish(learner: Learner, cfg: RunBase, out: Path, kind: str, st: RunState,
                      quiet: bool, hook: Any, recipe: Recipe) -> dict[str, Any]:
    """The loop with its progress bar, then the artifacts: final model, plot, result.json."""
    if st.status in ("started", "checkpointed"):
        _resume(learner, quiet)
        if recipe.on_resume is not None:
            recipe.on_resume(learner.step)
    shown = recipe.shown
    try:
        with bar(kind, cfg.train.steps, enabled=not quiet) as adv:
            adv(learner.step)
            last = learner.fit(lambda s, r: adv(1, **{k: r.get(k, 0.0) for k in shown}))
    except KeyboardInterrupt:
        ckpt = learner.latest_checkpoint()
        kept = (f"its latest checkpoint is step {checkpoint_step(ckpt)}" if ckpt is not None
                else "there is no checkpoint yet, so it starts again from step 0")
        raise Interrupted(f"interrupted at step {learner.step}; continue with --resume ({kept}; "
                          f"run dir {out})") from None
    if learner.step < cfg.train.steps:  # stopped early (testing aid): leave a resumable checkpoint only
        learner.save_checkpoint()
        return {"step": learner.step, "stopped": True}
    try:
        final = learner.save_final(out / "final")
    except RankFailed as e:
        raise learner.rank_lost(e, learner.step) from None
    result: dict[str, Any] = {"step": learner.step, "final": str(final), **recipe.result, "last": last}
    # sharded weights: every rank takes part in the evaluation's forward passes; rank 0 keeps the result
    evaluated = hook(learner.step, learner.model) if hook is not None and dist.sharded() else None
    if not dist.is_main():  # rank 0 evaluates and writes the artifacts
        return result
    if recipe.on_final is not None:
        recipe.on_final(final)
    if recipe.plot is not None:
        name, keys, title = recipe.plot
        plot_metrics(out / "metrics.jsonl", out / name, list(keys), title)
    if hook is not None:
        result["eval"] = evaluated if evaluated is not None else hook(learner.step, learner.model)
    atomic_write_text(out / "result.json", json.dumps(result, indent=1, default=str))
    if not quiet:
        console.print(f"[green]{kind.upper()} done[/green]: {final}")
    if cfg.report:
        report_after_run(out, quiet)
    return result
