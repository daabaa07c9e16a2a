"""Training runs: assemble source + transforms + objective + learner from a validated config.

SFT and RL are the same loop with different experience sources and objectives; this module only
wires them together, manages the run directory and writes the artifacts.
"""

from __future__ import annotations

import json
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trajtune.algorithms.batch import fit_length
from trajtune.algorithms.grpo import PolicyGradientObjective
from trajtune.algorithms.sft import SFTObjective
from trajtune.chat.render import ChatRenderer, RenderConfig, RenderError
from trajtune.config import RLRunConfig, SFTRunConfig, dump_config
from trajtune.envs.base import make_env
from trajtune.formats import LoadStats, load_any
from trajtune.eval.run import evaluate
from trajtune.experience import DatasetSource, RolloutSource
from trajtune.learner import Learner, LearnerConfig, set_seed
from trajtune.models.loading import load_model, load_tokenizer
from trajtune.plots import plot_metrics
from trajtune.progress import bar, console
from trajtune.rollout import RolloutConfig
from trajtune.schema import Trajectory, atomic_write_text
from trajtune.validate import record_check


class RunDirError(FileExistsError):
    pass


def check_run_dir(path: str | Path, overwrite: bool = False, resume: bool = False) -> Path:
    """Refuse to clobber an existing run unless told: --overwrite replaces it, --resume continues it.

    Called before any expensive or writing work, so a refused run leaves nothing behind."""
    p = Path(path)
    if overwrite and resume:
        raise RunDirError("--overwrite and --resume exclude each other")
    exists = p.exists() and any(p.iterdir())
    if exists and not (resume or overwrite):
        raise RunDirError(f"output directory {p} already exists and is not empty; "
                          "pass --overwrite to replace it or --resume to continue it")
    if resume and not exists:
        raise RunDirError(f"--resume: {p} has no run to resume")
    return p


def prepare_run_dir(path: str | Path, overwrite: bool = False, resume: bool = False) -> Path:
    p = check_run_dir(path, overwrite, resume)
    if resume:
        return p
    if p.exists() and any(p.iterdir()):
        shutil.rmtree(p)
    p.mkdir(parents=True, exist_ok=True)
    return p


def iter_data(path: str, fmt: str | None, skip_invalid: bool = False,
              stats: LoadStats | None = None) -> Iterator[Trajectory]:
    """Read training data in any supported format (auto-detected when ``fmt`` is None, gzip read
    directly), refusing what `trajtune data validate` rejects (or, with ``skip_invalid``, skipping
    it and counting it in ``stats``)."""
    yield from load_any(path, format=fmt, skip_invalid=skip_invalid, stats=stats, check=record_check(path))


def learner_config(cfg: SFTRunConfig | RLRunConfig, micro: int) -> LearnerConfig:
    t = cfg.train
    return LearnerConfig(steps=t.steps, lr=t.lr, weight_decay=t.weight_decay, warmup_steps=t.warmup_steps,
                         schedule=t.schedule, min_lr_ratio=t.min_lr_ratio, max_grad_norm=t.max_grad_norm,
                         micro_batch_size=micro, save_every=t.save_every, keep_last=t.keep_last,
                         eval_every=t.eval_every, seed=cfg.seed)


def _eval_hook(cfg: SFTRunConfig | RLRunConfig, tok: Any, renderer: ChatRenderer, rollout: RolloutConfig):
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


def check_chat_template(tok: Any, config: RenderConfig, model: str) -> None:
    """Refuse, before any training, a chat template that would mis-mask (the `trajtune doctor` checks)."""
    from trajtune.chat.doctor import check_template

    report = check_template(tok, config=config)
    if not report.ok:
        why = "; ".join(f"{c.name}: {c.detail}" for c in report.failures)
        raise RenderError(f"the chat template of {model} fails conformance checks ({why}); "
                          f"see `trajtune doctor --model {model}`")


def _write_common(out: Path, cfg: Any, kind: str) -> None:
    atomic_write_text(out / "config.yaml", dump_config(cfg))
    atomic_write_text(out / "run.json", json.dumps({"kind": kind, "started": time.time()}))


def run_sft(cfg: SFTRunConfig, *, overwrite: bool = False, resume: bool = False, quiet: bool = False,
            stop_after: int | None = None) -> dict[str, Any]:
    check_run_dir(cfg.output_dir, overwrite, resume)
    set_seed(cfg.seed)
    tok = load_tokenizer(cfg.model.name_or_path, cfg.model.chat_template)
    renderer = ChatRenderer(tok, RenderConfig(train_on=cfg.data.train_on, non_prefix=cfg.data.non_prefix))
    check_chat_template(tok, renderer.config, cfg.model.name_or_path)
    trajs = []
    load = LoadStats()
    for i, t in enumerate(iter_data(cfg.data.path, cfg.data.format, cfg.data.skip_invalid, load)):
        if cfg.data.limit and i >= cfg.data.limit:
            break
        trajs.append(t)
    if not trajs:
        raise ValueError(f"{cfg.data.path}: no training records" +
                         (f" ({load.skipped} invalid record(s) skipped: {dict(load.by_rule)})" if load.skipped else ""))
    tts = []
    dropped: Counter = Counter()  # trajectories that give no trained token: counted, never dropped silently
    with bar("render", len(trajs), enabled=not quiet) as adv:
        for t in trajs:
            try:
                samples = [s for s in renderer.render_samples(t) if any(w > 0 for w in s.weight)]
            except RenderError as e:
                raise RenderError(f"{cfg.data.path}: trajectory {t.id!r}: {e}") from None
            if not samples:
                dropped["no_assistant_turn" if all(m.role != "assistant" for m in t.messages) else "no_trained_token"] += 1
            tts.extend(samples)
            adv()
    if not tts:
        raise ValueError(f"{cfg.data.path}: none of the {len(trajs)} records has a trained token ({dict(dropped)}); "
                         "records need an assistant turn to learn (check data.train_on and the records' train flags)")
    n_rendered = len(tts)
    tts, n_cut = fit_length(tts, cfg.data.max_length, cfg.data.truncation)
    if n_rendered and not tts:
        raise ValueError(f"all {n_rendered} samples are longer than data.max_length ({cfg.data.max_length}) and "
                         "were dropped; raise data.max_length or set data.truncation: truncate")
    tts = [t for t in tts if any(w > 0 for w in t.weight)]
    if not tts:
        raise ValueError("no trajectory has a trained token (check data.train_on and the records' train flags)")
    out = prepare_run_dir(cfg.output_dir, overwrite, resume)
    if not resume:
        _write_common(out, cfg, "sft")
    model = load_model(cfg.model.name_or_path, lora=cfg.model.lora, dtype=cfg.model.dtype)
    source = DatasetSource(tts, cfg.train.batch_size, cfg.seed)
    rollout = RolloutConfig(max_length=cfg.data.max_length, max_new_tokens=128, max_turns=8, batch_size=32)
    hook = _eval_hook(cfg, tok, renderer, rollout)
    learner = Learner(model, tok, SFTObjective(cfg.train.eaft, cfg.train.eaft_top_k, cfg.train.eaft_alpha), source,
                      learner_config(cfg, min(cfg.train.micro_batch_size, cfg.train.batch_size)), out,
                      eval_hook=hook, stop_after=stop_after)
    return _train_and_finish(learner, cfg, out, "sft", resume, quiet, hook,
                             {"train_records": len(tts), "truncated_or_dropped": n_cut,
                              "invalid_skipped": load.skipped, "invalid_by_rule": dict(load.by_rule),
                              "dropped_records": dict(dropped)})


def run_rl(cfg: RLRunConfig, *, overwrite: bool = False, resume: bool = False, quiet: bool = False,
           stop_after: int | None = None) -> dict[str, Any]:
    check_run_dir(cfg.output_dir, overwrite, resume)
    set_seed(cfg.seed)
    tok = load_tokenizer(cfg.model.name_or_path, cfg.model.chat_template)
    renderer = ChatRenderer(tok)
    check_chat_template(tok, renderer.config, cfg.model.name_or_path)
    env_name, kwargs = cfg.env.name, cfg.env.kwargs
    make_env(env_name, **kwargs)  # fail fast on an unknown environment
    out = prepare_run_dir(cfg.output_dir, overwrite, resume)
    if not resume:
        _write_common(out, cfg, "rl")
    model = load_model(cfg.model.name_or_path, lora=cfg.model.lora, dtype=cfg.model.dtype)
    ref = None
    if cfg.rl.kl_coef > 0:
        ref = load_model(cfg.model.name_or_path, dtype=cfg.model.dtype, trainable=False)
        ref.eval().requires_grad_(False)
    ro = RolloutConfig(**cfg.rollout.model_dump())
    tasks = make_env(env_name, **kwargs).tasks("train", cfg.rl.n_train_tasks, seed=cfg.seed)
    episodes_path = out / "rollouts.jsonl"

    def keep_episodes(step: int, episodes: list[Any]) -> None:
        # Tagged with the optimizer step they feed (step + 1), the same number metrics.jsonl uses.
        with episodes_path.open("a") as f:
            for e in episodes:
                f.write(json.dumps({"step": step + 1, **e.trajectory.model_dump(mode="json", exclude_none=True)}) + "\n")

    source = RolloutSource(tok, lambda: make_env(env_name, **kwargs), tasks, ro, cfg.rl.tasks_per_step,
                           cfg.rl.group_size, cfg.rl.estimator, cfg.rl.drop_equal_groups, dict(cfg.rl.termination),
                           ref, cfg.seed, renderer, keep_episodes)
    objective = PolicyGradientObjective(cfg.rl.clip_low, cfg.rl.clip_high, cfg.rl.kl_coef, cfg.rl.kl_estimator,
                                        cfg.rl.aggregation, cfg.rl.norm_length,
                                        ro.temperature if ro.temperature > 0 else 1.0)
    hook = _eval_hook(cfg, tok, renderer, ro)
    learner = Learner(model, tok, objective, source, learner_config(cfg, cfg.train.micro_batch_size), out,
                      eval_hook=hook, stop_after=stop_after)
    learner.step_logs.append(episodes_path)
    return _train_and_finish(learner, cfg, out, "rl", resume, quiet, hook, {})


def _train_and_finish(learner: Learner, cfg: SFTRunConfig | RLRunConfig, out: Path, kind: str, resume: bool,
                      quiet: bool, hook: Any, extra: dict[str, Any]) -> dict[str, Any]:
    """The loop with its progress bar, then the artifacts: final model, plot, result.json."""
    if resume:
        learner.resume()
    shown = ("loss", "token_accuracy") if kind == "sft" else ("reward", "success")
    with bar(kind, cfg.train.steps, enabled=not quiet) as adv:
        adv(learner.step)
        last = learner.fit(lambda s, r: adv(1, **{k: r.get(k, 0.0) for k in shown}))
    if learner.step < cfg.train.steps:  # stopped early (testing aid): leave a resumable checkpoint only
        learner.save_checkpoint()
        return {"step": learner.step, "stopped": True}
    final = learner.save_final(out / "final")
    if kind == "sft":
        plot_metrics(out / "metrics.jsonl", out / "loss.png", ["loss", "token_accuracy"], "SFT")
    else:
        plot_metrics(out / "metrics.jsonl", out / "reward.png", ["reward", "success", "loss"], "RL")
    result: dict[str, Any] = {"step": learner.step, "final": str(final), **extra, "last": last}
    if hook is not None:
        result["eval"] = hook(learner.step, learner.model)
    atomic_write_text(out / "result.json", json.dumps(result, indent=1, default=str))
    if not quiet:
        console.print(f"[green]{kind.upper()} done[/green]: {final}")
    return result
