"""The one training loop. It knows nothing about which algorithm runs.

An experience source hands it a list of TokenTrajectories for each step (a dataset slice for SFT,
fresh rollouts for RL, preference pairs for DPO); an objective turns micro-batches into a loss. The
learner does the rest: accelerate, gradient accumulation with exact normalisation, optional reuse of
one step's experience for several updates (PPO epochs × mini-batches), clipping, the LR schedule,
metrics, atomic checkpoints (weights, optimizer, scheduler, RNG states, step) and exact resume.

Units: consecutive trajectories that share a non-empty ``group`` form a unit (a GRPO group, a DPO
pair). Mini-batches always split between units; micro-batches split between units too when the
objective says its rows are coupled (``coupled_rows``: a pair's loss needs both rows at once).

Metrics: an objective reports each metric as a (sum, denominator) pair, and the learner reports
Σ sums / Σ denominators over the step, so every metric is exact under accumulation without the
learner knowing what it means. A plain float is a count and is summed.

Sources are deterministic functions of the step index (data order and rollout seeds are derived
from the config seed and the step), so resuming from a checkpoint replays exactly what an
uninterrupted run would have done.

Several processes: data-parallel by default (each rank trains its share of the units, gradients
summed once per update, ``distributed.py``); with a model sharded by ``trajtune.sharding`` (FSDP2,
``train.sharding: fsdp``) the same loop runs with the gradients reduce-scattered after every
backward, every rank running the same number of passes, and checkpoints gathered on rank 0.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import torch

from trajtune.algorithms.base import Objective
from trajtune import distributed as dist
from trajtune import heap, sharding
from trajtune.algorithms.batch import collate
from trajtune.algorithms.lm_head import ChunkTokens
from trajtune.tokens import TokenTrajectory
from trajtune.errors import ConfigError, DataError, RankFailed, RunDirError
from trajtune.schema import atomic_write_text, normal_permissions
from trajtune.settings import setting
from trajtune.step_in_backward import StepInBackward, clipping_refused


class ExperienceSource(Protocol):
    def batch(self, step: int, model: Any) -> tuple[list[TokenTrajectory], dict[str, float]]:
        """Experience for optimizer step ``step`` and metrics about it (reward, success, ...)."""
        ...


@dataclass
class LearnerConfig:
    """The learner's settings. Each field made with ``setting`` is also a ``train.*`` config key
    (``config.TrainSpec`` is built from these fields: declare a setting here only); the others are
    filled in by the algorithm (``train.learner_config``)."""

    steps: int = setting(100, gt=0, description="optimizer steps")
    lr: float = setting(1e-4, gt=0, description="peak learning rate (AdamW)")
    weight_decay: float = setting(0.0, ge=0, description="AdamW decoupled weight decay")
    betas: tuple[float, float] = (0.9, 0.95)
    warmup_steps: int = setting(0, ge=0, description="linear warm-up from 0 to lr over these steps")
    schedule: Literal["constant", "linear", "cosine"] = setting(
        "cosine", description="learning-rate decay after warm-up, down to lr × min_lr_ratio at the last step")
    min_lr_ratio: float = setting(0.1, ge=0, le=1, description="final learning rate as a fraction of lr (linear, "
                                                               "cosine)")
    max_grad_norm: float | None = setting(1.0, gt=0, description="clip the gradient's global norm to this; null: "
                                                                 "no clipping (the norm is still logged)")
    micro_batch_size: int = setting(16, gt=0, description="rows per forward/backward pass; gradients accumulate "
                                                          "over micro-batches with exact normalisation (the step is "
                                                          "the same)")
    step_in_backward: bool = setting(
        False, description="update each weight as soon as its gradient is complete, inside the backward pass, and "
                           "free that gradient: the gradients never all exist at once (full fine-tuning: one copy "
                           "of the weights less at peak memory). The same updates; needs max_grad_norm: null (the "
                           "global norm is unknown until the last gradient), each update's rows in one "
                           "micro-batch, and one process (docs/speed.md)")
    epochs: int = 1  # passes over one step's experience (PPO epochs)
    mini_batches: int = 1  # optimizer updates per pass; π_old stays the sampling policy throughout
    save_every: int = setting(0, ge=0, description="write a resumable checkpoint every N steps (0: only the final "
                                                   "model)")
    keep_last: int = setting(2, gt=0, description="checkpoints kept; older ones are deleted")
    log_every: int = 1
    eval_every: int = setting(0, ge=0, description="evaluate on eval.env every N steps (0: only at the end, when "
                                                   "eval is set)")
    seed: int = 0
    group_by_length: bool = setting(False, description="fill micro-batches with rows (units) of similar length, "
                                                       "so less padding is computed; the step's gradient is the "
                                                       "same")
    share_prefix: bool = setting(True, description="rows of one micro-batch that start with the same tokens (a "
                                                   "group's prompt) compute that prefix once and attend to it "
                                                   "through the KV cache; exact gradients; plain full-attention "
                                                   "models only, others fall back (docs/algorithms.md)")
    loss_chunk_tokens: ChunkTokens = setting(
        "auto", description="positions per chunk of the LM head and log-softmax in the loss (SFT, RL, DPO), so the "
                            "full [rows, positions, vocabulary] logits never exist at once; each chunk's logits are "
                            "recomputed in the backward pass. auto: chunks of at most 64 MiB of float32 logits (341 "
                            "positions at a 49 k vocabulary); 0: off, the model's logits all at once. Exact either "
                            "way; models that change their logits after the head fall back (docs/speed.md)")


def _clip(params: list[torch.Tensor], max_norm: float | None,
          clip: Callable[..., torch.Tensor] = torch.nn.utils.clip_grad_norm_) -> torch.Tensor:
    """The gradients' global norm, clipped to ``max_norm`` by ``clip``; None: measured only."""
    if max_norm is None:
        return torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    return clip(params, max_norm)


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def lr_lambda(cfg: LearnerConfig) -> Callable[[int], float]:
    def f(step: int) -> float:
        if cfg.warmup_steps and step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.schedule == "constant":
            return 1.0
        span = max(1, cfg.steps - cfg.warmup_steps)
        progress = min(1.0, (step - cfg.warmup_steps) / span)
        if cfg.schedule == "linear":
            return 1.0 - (1.0 - cfg.min_lr_ratio) * progress
        return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return f


@contextmanager
def _removed_on_error(tmp: Path) -> Iterator[None]:
    """A half-written temp directory (a full disk, a read-only folder) is removed, not left behind."""
    try:
        yield
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def truncate_step_log(path: Path, step: int) -> str | None:
    """Drop the lines a killed run wrote for steps after its last checkpoint, so a resumed run does
    not log them twice (the resumed run redoes those steps exactly). Rewritten atomically.

    A last line that is not valid JSON is the write the kill interrupted: it is dropped and the
    returned warning says so. An invalid line before the last one is corruption: DataError."""
    if not path.exists():
        return None
    lines = [(i, ln) for i, ln in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
             if ln.strip()]
    keep, warning = [], None
    for k, (i, ln) in enumerate(lines):
        try:
            rec = json.loads(ln)
        except json.JSONDecodeError:
            if k < len(lines) - 1:
                raise DataError(f"{path}:{i}: invalid JSON before the last line; the file was edited or "
                                "corrupted, so the run cannot be resumed as it is") from None
            warning = f"{path}: dropped a torn last line (line {i}, {len(ln)} characters) left by the interrupted run"
            continue
        if not isinstance(rec, dict) or rec.get("step", 0) <= step:
            keep.append(ln)
    atomic_write_text(path, "".join(ln + "\n" for ln in keep))
    return warning


def interrupted_writes(root: Path) -> list[Path]:
    """Temp files and directories an atomic write left behind when its process died before the
    rename: ``.NAME.*.tmp`` files (``schema.atomic_write_text``, ``AtomicJsonlWriter``; ``.NAME.tmp.png``
    of plots) and ``.tmp-*`` directories (checkpoints, the final model)."""
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        for d in list(dirnames):
            if d.startswith(".tmp-"):
                found.append(Path(dirpath) / d)
                dirnames.remove(d)
        found += [Path(dirpath) / f for f in filenames
                  if f.startswith(".") and (f.endswith(".tmp") or ".tmp." in f)]
    return sorted(found)


def remove_interrupted_writes(root: Path) -> list[Path]:
    """Delete ``interrupted_writes(root)`` (before a resume, on rank 0) and return what was removed."""
    found = interrupted_writes(root)
    for p in found:
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    return found


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete ``step-N`` checkpoint under ``root`` (a checkpoint is complete once renamed)."""
    ckpts = sorted(p for p in Path(root).glob("step-*") if (p / "trainer_state.json").exists())
    return ckpts[-1] if ckpts else None


def checkpoint_step(ckpt: Path) -> int:
    return int(json.loads((ckpt / "trainer_state.json").read_text())["step"])


def _add_metric(sums: dict[str, list[float]], key: str, num: float, den: float | None) -> None:
    """Accumulate one metric as [Σ sums, Σ denominators]; a count (no denominator) keeps -1 there."""
    acc = sums.setdefault(key, [0.0, -1.0 if den is None else 0.0])
    acc[0] += float(num)
    if den is not None:
        acc[1] += float(den)


def split_units(tts: list[TokenTrajectory]) -> list[list[TokenTrajectory]]:
    """Consecutive trajectories sharing a non-empty ``group`` form one unit; others stand alone."""
    units: list[list[TokenTrajectory]] = []
    for t in tts:
        if units and t.group and units[-1][-1].group == t.group:
            units[-1].append(t)
        else:
            units.append([t])
    return units


def is_peft(model: Any) -> bool:
    return hasattr(model, "peft_config")


def experience_digest(tts: list[TokenTrajectory]) -> str:
    """A digest of a step's experience (ids, weights, advantages, in order): ranks that train
    sharded weights compare it, since they must all hold the very same step."""
    h = hashlib.blake2b(digest_size=16)
    for t in tts:
        h.update(np.asarray(t.ids, dtype=np.int64).tobytes())
        h.update(np.asarray(t.weight, dtype=np.float64).tobytes())
        if t.advantages is not None:
            h.update(np.asarray(t.advantages, dtype=np.float64).tobytes())
    return h.hexdigest()


def _weights_file(ckpt: Path) -> dict[str, torch.Tensor]:
    """A saved model's tensors: ``model.safetensors``, or every shard its index names."""
    from safetensors.torch import load_file

    index = ckpt / "model.safetensors.index.json"
    if not index.exists():
        return load_file(ckpt / "model.safetensors")
    state: dict[str, torch.Tensor] = {}
    for name in sorted(set(json.loads(index.read_text())["weight_map"].values())):
        state.update(load_file(ckpt / name))
    return state


class Learner:
    def __init__(self, model: Any, tokenizer: Any, objective: Objective, source: ExperienceSource,
                 config: LearnerConfig, out_dir: str | Path, *,
                 eval_hook: Callable[[int, Any], dict[str, float]] | None = None,
                 on_step: Callable[[int, dict[str, float]], None] | None = None,
                 on_weights: Callable[[int, Any], None] | None = None,
                 stop_after: int | None = None) -> None:
        from accelerate import Accelerator

        self.cfg = config
        self.tok = tokenizer
        self.objective = objective
        self.source = source
        self.out = Path(out_dir)
        self.eval_hook = eval_hook
        self.on_step = on_step
        self.on_weights = on_weights  # told (step, unwrapped model) after each step's updates (weight sync)
        self.stop_after = stop_after  # testing aid: stop (as if killed) after this many steps
        self.accelerator = Accelerator(cpu=not torch.cuda.is_available())
        self.world, self.rank = dist.world_size(), dist.rank()
        self.sharded = sharding.is_sharded(model)  # sharded before the learner (train.py), so the
        # reference model and the recipe saw the same model; the optimizer is built on its DTensors
        # an objective may own trainable state next to the model (a value head: ``module``, saved as
        # ``module_file``); it is optimised, checkpointed, restored and saved with the model
        self.extra = getattr(objective, "module", None)
        if self.extra is not None:
            self.extra.to(self.accelerator.device)
        params = [p for p in model.parameters() if p.requires_grad]
        if self.extra is not None:
            params += [p for p in self.extra.parameters() if p.requires_grad]
        if not params:
            raise ValueError("the model has no trainable parameters")
        if self.sharded and self.extra is not None:
            raise ValueError("an objective's own trainable module (a value head) is not supported with sharded "
                             "weights (the configs refuse it: rl.credit gae / mc_critic value_weight)")
        self.params = params
        optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay, betas=config.betas)
        if self.world > 1:  # no DDP wrapper: ranks may run different numbers of micro-batches; gradients
            # are summed once per update (distributed.sum_gradients), or reduce-scattered by FSDP (sharded)
            self.model, self.optimizer = (model if self.sharded else model.to(self.accelerator.device)), optimizer
        else:
            self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(config))
        self.in_backward = self._step_in_backward(params)
        self.step = 0
        self._current = 0
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.ckpt_root = self.out / "checkpoints"
        self.metrics_path = self.out / "metrics.jsonl"
        # JSONL logs with a "step" per line; on resume, lines of steps after the checkpoint are dropped.
        self.step_logs: list[Path] = [self.metrics_path]
        self.resume_warnings: list[str] = []  # what a resume had to clean up (shown by the caller)

    def _step_in_backward(self, params: list[torch.nn.Parameter]) -> StepInBackward | None:
        if not self.cfg.step_in_backward:
            return None
        if self.cfg.max_grad_norm is not None:
            raise ConfigError(clipping_refused(self.cfg.max_grad_norm))
        if self.world > 1:
            raise ConfigError(f"train.step_in_backward needs one process (here {self.world}): the gradients must "
                              "be summed across ranks before any weight is updated; turn it off")
        # on CPU it also hands the C heap's free pages back (before each backward pass, and as gradients
        # are freed), since what it saves would otherwise stay resident
        cpu = self.accelerator.device.type == "cpu"
        return StepInBackward(self.optimizer, params, release=heap.trim if cpu else None)

    # -- checkpoints -----------------------------------------------------------------------------
    def save_checkpoint(self) -> Path:
        """Write ``checkpoints/step-N`` atomically: a temp dir, fsync'd files, then one rename.
        Rank 0 writes (every rank holds the same weights and optimizer state; sharded, every rank
        first helps gather them on rank 0); the others wait."""
        model_state, optim_state = self._gathered()
        final = self.ckpt_root / f"step-{self.step:06d}"
        # a source that prepares experience ahead (async rollouts) stores it, so resume is exact
        source_state = self.source.state_dict() if hasattr(self.source, "state_dict") else None
        if dist.is_main():
            self._write_checkpoint(final, source_state, model_state, optim_state)
        dist.barrier()
        return final

    def _gathered(self, optimizer: bool = True) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """Sharded: the full model state (trainable parameters only for an adapter, which is all a
        PEFT directory holds) and optimizer state, gathered on rank 0 (collectives: every rank calls
        this). Data-parallel: (None, None), after checking that the ranks' replicas agree."""
        if not self.sharded:
            dist.check_in_sync(self.params, self.step)
            return None, None
        with dist.peer_failures("gathering the checkpoint"):
            model_state = sharding.gather_model_state(self.model, trainable_only=is_peft(self.model))
            return model_state, sharding.gather_optimizer_state(self.model, self.optimizer) if optimizer else None

    def _write_checkpoint(self, final: Path, source_state: dict[str, Any] | None = None,
                          model_state: dict[str, Any] | None = None,
                          optim_state: dict[str, Any] | None = None) -> None:
        self.ckpt_root.mkdir(parents=True, exist_ok=True)
        tmp = self.ckpt_root / f".tmp-step-{self.step:06d}-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        model = self.accelerator.unwrap_model(self.model)
        optim = optim_state if optim_state is not None else self.optimizer.state_dict()
        with _removed_on_error(tmp):
            model.save_pretrained(tmp, state_dict=model_state)  # None: the model's own (unsharded) state
            self.tok.save_pretrained(tmp)
            self._save_extra(tmp)
            torch.save({"optimizer": optim, "scheduler": self.scheduler.state_dict(),
                        "rng": _rng_state()}, tmp / "trainer_state.pt")
            if source_state is not None:
                torch.save(source_state, tmp / "source_state.pt")
            (tmp / "trainer_state.json").write_text(json.dumps({"step": self.step, "peft": is_peft(model)}))
            normal_permissions(tmp)
            for f in (f for f in tmp.rglob("*") if f.is_file()):  # peft puts extra adapters in sub-directories
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        self._prune()

    def _save_extra(self, directory: Path) -> None:
        """The objective's own trainable state (a value head) as ``module_file`` in ``directory``: a
        separate file, so the directory stays a plain HF model that ``from_pretrained`` loads."""
        if self.extra is None:
            return
        from safetensors.torch import save_file

        state = {k: v.detach().contiguous().cpu() for k, v in self.extra.state_dict().items()}
        save_file(state, str(directory / self.objective.module_file))  # type: ignore[attr-defined]

    def _prune(self) -> None:
        ckpts = sorted(self.ckpt_root.glob("step-*"))
        for old in ckpts[: max(0, len(ckpts) - self.cfg.keep_last)]:
            shutil.rmtree(old, ignore_errors=True)

    def latest_checkpoint(self) -> Path | None:
        return latest_checkpoint(self.ckpt_root)

    def restart(self) -> None:
        """Start a run directory again from step 0 (it died before its first checkpoint): drop its step logs."""
        self.step = 0
        self._trim_step_logs()

    def _trim_step_logs(self) -> None:
        """Rank 0 trims the step logs to ``self.step`` (a torn last line is dropped, with a warning)."""
        if dist.is_main():
            for path in self.step_logs:
                warning = truncate_step_log(path, self.step)
                if warning:
                    self.resume_warnings.append(warning)
        dist.barrier()

    def apply_hyperparameters(self) -> None:
        """Make the optimizer and schedule follow ``self.cfg`` from the current step on.

        A checkpoint's optimizer state carries the lr, weight decay and betas it was saved with; after
        loading it these come from the config again, so a resume with an accepted config change
        (``--allow-config-change``) really trains with the new values. With an unchanged config the
        values are recomputed by the same expression LambdaLR uses, so exact resume is unaffected."""
        factor = lr_lambda(self.cfg)(self.scheduler.last_epoch)
        self.scheduler.base_lrs = [self.cfg.lr for _ in self.optimizer.param_groups]
        for g in self.optimizer.param_groups:
            g["initial_lr"] = self.cfg.lr
            g["lr"] = self.cfg.lr * factor
            g["weight_decay"] = self.cfg.weight_decay
            g["betas"] = self.cfg.betas
        self.scheduler._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    def resume(self, ckpt: Path | None = None) -> int:
        from safetensors.torch import load_file

        ckpt = ckpt or self.latest_checkpoint()
        if ckpt is None:
            raise RunDirError(f"no checkpoint to resume from under {self.ckpt_root}")
        with dist.peer_failures("loading the checkpoint"):  # sharded: the loads scatter the shards
            self._load_weights(ckpt)
        if self.extra is not None:
            path = ckpt / self.objective.module_file  # type: ignore[attr-defined]
            if not path.exists():
                raise RunDirError(f"checkpoint {ckpt} has no {path.name}: it was saved by a run without it; resume "
                                  "with the config that run had")
            self.extra.load_state_dict(load_file(path))
        st = torch.load(ckpt / "trainer_state.pt", weights_only=False)
        if self.sharded:  # the checkpoint holds full tensors in torch's format, whichever layout wrote it
            with dist.peer_failures("loading the checkpoint"):
                sharding.load_optimizer_state(self.model, self.optimizer, st["optimizer"])
        else:
            self.optimizer.load_state_dict(st["optimizer"])
        self.scheduler.load_state_dict(st["scheduler"])
        _set_rng_state(st["rng"])
        if (ckpt / "source_state.pt").exists() and hasattr(self.source, "load_state_dict"):
            self.source.load_state_dict(torch.load(ckpt / "source_state.pt", weights_only=False))
        self.step = checkpoint_step(ckpt)
        self.apply_hyperparameters()
        self._trim_step_logs()
        return self.step

    def _load_weights(self, ckpt: Path) -> None:
        """The checkpoint's weights (or adapters) into the model; sharded, every rank reads the full
        tensors and keeps its shard."""
        from safetensors.torch import load_file

        model = self.accelerator.unwrap_model(self.model)
        if is_peft(model):
            from peft import set_peft_model_state_dict

            for name in model.peft_config:  # peft's layout: the default adapter on top, others in sub-directories
                sub = ckpt if name == "default" else ckpt / name
                state = load_file(sub / "adapter_model.safetensors")
                if not self.sharded:
                    set_peft_model_state_dict(model, state, adapter_name=name)
                    continue
                keys = sharding.adapter_keys(model, name)
                if set(state) != set(keys):
                    raise RuntimeError(f"checkpoint {sub} does not match adapter {name!r}: missing "
                                       f"{sorted(set(keys) - set(state))}, unexpected {sorted(set(state) - set(keys))}")
                sharding.load_model_state(model, {keys[k]: v for k, v in state.items()})
            return
        state = _weights_file(ckpt)
        if self.sharded:
            expected = set(model.state_dict())
            missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
        else:
            missing, unexpected = model.load_state_dict(state, strict=False)
        tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
        if unexpected or set(missing) - tied:
            raise RuntimeError(f"checkpoint {ckpt} does not match the model: missing {missing}, unexpected {unexpected}")
        if self.sharded:
            sharding.load_model_state(model, state)

    def log(self, record: dict[str, Any]) -> None:
        if not dist.is_main():
            return
        self.out.mkdir(parents=True, exist_ok=True)
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    # -- the loop ---------------------------------------------------------------------------------
    def _micro_batches(self, tts: list[TokenTrajectory]) -> list[list[TokenTrajectory]]:
        """Micro-batches of at most ``micro_batch_size`` rows. Each micro-batch's loss sum is divided
        by the whole update's denominator, so how rows are grouped never changes the gradient (up to
        float rounding); ``group_by_length`` uses that to cut padding, longest first."""
        size = self.cfg.micro_batch_size
        coupled = getattr(self.objective, "coupled_rows", False)
        if not coupled:
            if self.cfg.group_by_length:
                tts = sorted(tts, key=len, reverse=True)
            return [tts[i:i + size] for i in range(0, len(tts), size)]
        units = split_units(tts)
        if self.cfg.group_by_length:
            units = sorted(units, key=lambda u: max(len(t) for t in u), reverse=True)
        out: list[list[TokenTrajectory]] = []
        for unit in units:  # whole units only; a unit larger than the micro-batch goes alone
            if out and len(out[-1]) + len(unit) <= size:
                out[-1].extend(unit)
            else:
                out.append(list(unit))
        return out

    def _mini_batches(self, tts: list[TokenTrajectory], epoch: int) -> list[list[TokenTrajectory]]:
        """The step's experience in ``mini_batches`` parts of whole units; from the second epoch on,
        the units are shuffled by a generator seeded from (seed, step, epoch), so resume is exact."""
        units = split_units(tts)
        if epoch > 0:
            g = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + self.step * 1_009 + epoch)
            units = [units[i] for i in torch.randperm(len(units), generator=g).tolist()]
        n = max(1, min(self.cfg.mini_batches, len(units)))
        bounds = [round(k * len(units) / n) for k in range(n + 1)]
        return [[t for u in units[bounds[k]:bounds[k + 1]] for t in u] for k in range(n)]

    def _update(self, tts: list[TokenTrajectory], sums: dict[str, list[float]]) -> tuple[float, float] | None:
        """One optimizer update on ``tts`` (accumulated over micro-batches); None when nothing is trained."""
        units = split_units(tts)
        if self.world > 1:  # this rank's share: units r, r + W, ... (whole units, like micro-batches)
            tts = [t for u in units[self.rank::self.world] for t in u]
        # sharded, prefix sharing is off: it changes how many forward passes a micro-batch takes, and
        # every rank must take the same ones; so is the chunked LM head, which calls the head outside
        # the sharded root module's forward (where FSDP gathers its weights)
        share = self.cfg.share_prefix and not self.sharded
        chunk = 0 if self.sharded else self.cfg.loss_chunk_tokens
        batches = [collate(mb, self.pad_id, share_prefix=share,
                           loss_chunk_tokens=chunk).to(self.accelerator.device)
                   for mb in self._micro_batches(tts)] if tts else []
        denom = dist.all_sum([sum(self.objective.denominator(b) for b in batches)])[0]
        if denom <= 0:
            return None
        if self.sharded:
            self._pad_passes(int(dist.all_max([float(len(batches))])[0]) - len(batches), units)
        if self.in_backward is not None and len(batches) > 1:
            raise ConfigError(f"train.step_in_backward: this update has {len(tts)} rows in {len(batches)} "
                              "micro-batches, but a weight is updated as soon as one "
                              "backward pass completes its gradient; raise train.micro_batch_size to the rows "
                              "per update, or turn step_in_backward off")
        total = 0.0
        for b in batches:
            loss, m = self.objective.loss_sum(self.model, b)
            scaled = loss / denom
            with self.in_backward.active() if self.in_backward is not None else nullcontext():
                self.accelerator.backward(scaled)
            total += float(scaled.detach())
            for k, v in m.items():
                num, den = (v if isinstance(v, tuple) else (v, None))
                _add_metric(sums, k, num, den)
        if self.in_backward is not None:  # every weight with a gradient was stepped in the backward pass
            return total, self.in_backward.grad_norm()
        if self.world > 1:
            if not self.sharded:  # sharded gradients were reduce-scattered (summed) by every backward
                dist.sum_gradients(self.params)
            total = dist.all_sum([total])[0]
            grad_norm = _clip(self.params, self.cfg.max_grad_norm)
            if hasattr(grad_norm, "full_tensor"):  # sharded: a DTensor
                grad_norm = grad_norm.full_tensor()
        else:
            clipped = self.model.parameters() if self.extra is None else \
                [*self.model.parameters(), *self.extra.parameters()]
            grad_norm = _clip(list(clipped), self.cfg.max_grad_norm, self.accelerator.clip_grad_norm_)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return total, float(grad_norm)

    def _pad_passes(self, n: int, units: list[list[TokenTrajectory]]) -> None:
        """Sharded: ``n`` more forward/backward passes on this rank, on a unit of the step with the loss
        times zero, so that it takes part in as many passes as the rank with the most micro-batches
        (each pass gathers parameters and reduce-scatters gradients on every rank). The gradient they
        add is exactly zero, so the update is the one the real micro-batches make."""
        if n <= 0:
            return
        batches = (collate(u, self.pad_id).to(self.accelerator.device) for u in units)
        b = next(x for x in batches if self.objective.denominator(x) > 0)  # one exists: denom > 0
        for _ in range(n):
            loss, _ = self.objective.loss_sum(self.model, b)
            self.accelerator.backward(loss * 0.0)

    def train_step(self, tts: list[TokenTrajectory]) -> dict[str, float]:
        """All updates of one step: ``epochs`` × ``mini_batches`` optimizer steps (1 × 1 by default),
        then one scheduler step. Loss and grad norm are the means over the updates."""
        self.model.train()
        sums: dict[str, list[float]] = {}
        results = []
        for epoch in range(self.cfg.epochs):
            for mb in self._mini_batches(tts, epoch):
                r = self._update(mb, sums)
                if r is not None:
                    results.append(r)
        if self.world > 1:  # metrics of every rank's share
            merged: dict[str, list[float]] = {}
            for part in dist.all_gather(sums):
                for k, (num, den) in part.items():
                    _add_metric(merged, k, num, None if den < 0 else den)
            sums = merged
        if not results:
            self.optimizer.zero_grad(set_to_none=True)
            return {"loss": 0.0, "skipped": 1.0}
        self.scheduler.step()
        out = {"loss": sum(r[0] for r in results) / len(results),
               "grad_norm": sum(r[1] for r in results) / len(results),
               "lr": self.scheduler.get_last_lr()[0], "sequences": float(len(tts))}
        if len(results) > 1:
            out["updates"] = float(len(results))
        for k, (num, den) in sums.items():
            if den < 0:  # a count
                out[k] = num
            elif den > 0:
                out[k] = num / den
        return out

    def fit(self, progress: Callable[[int, dict[str, float]], None] | None = None) -> dict[str, float]:
        try:
            return self._fit(progress)
        finally:
            if hasattr(self.source, "close"):  # a background sampler stops with the loop
                self.source.close()

    def _fit(self, progress: Callable[[int, dict[str, float]], None] | None) -> dict[str, float]:
        set_seed(self.cfg.seed + self.step)
        try:
            with dist.peer_failures("a sharded forward or backward pass"):
                return self._loop(progress)
        except RankFailed as e:  # a collective failed: say which step, and where --resume continues
            raise self.rank_lost(e, self._current) from None

    def rank_lost(self, err: RankFailed, step: int) -> RankFailed:
        """``err`` (a lost rank) as the one-line message naming the step and the last checkpoint."""
        ckpt = self.latest_checkpoint()
        return dist.describe_loss(err, step, checkpoint_step(ckpt) if ckpt is not None else None)

    def _loop(self, progress: Callable[[int, dict[str, float]], None] | None) -> dict[str, float]:
        last: dict[str, float] = {}
        done_here = 0
        while self.step < self.cfg.steps:
            self._current = self.step + 1  # the step being built, trained and maybe saved
            dist.crash_for_test(self._current)
            t0 = time.time()
            tts, src_metrics = self.source.batch(self.step, self.accelerator.unwrap_model(self.model))
            if self.sharded:
                dist.check_same_experience(experience_digest(tts), self._current)
            m = self.train_step(tts) if tts else {"loss": 0.0, "skipped": 1.0}
            self.step += 1
            done_here += 1
            if self.on_weights is not None:
                self.on_weights(self.step, self.accelerator.unwrap_model(self.model))
            rec: dict[str, Any] = {"step": self.step, **src_metrics, **m, "seconds": round(time.time() - t0, 4)}
            if self.eval_hook and self.cfg.eval_every and self.step % self.cfg.eval_every == 0 \
                    and self.step < self.cfg.steps:
                rec.update({f"eval/{k}": v for k, v in self.eval_hook(self.step, self.model).items()})
            if self.step % max(1, self.cfg.log_every) == 0 or self.step == self.cfg.steps:
                self.log(rec)
            last = rec
            if progress:
                progress(self.step, rec)
            if self.on_step:
                self.on_step(self.step, rec)
            if self.cfg.save_every and self.step % self.cfg.save_every == 0 and self.step < self.cfg.steps:
                self.save_checkpoint()
            if self.stop_after is not None and done_here >= self.stop_after:
                return last
        return last

    def save_final(self, path: str | Path) -> Path:
        """Save the trained model (or adapter) and tokenizer as a loadable HF directory, atomically
        (rank 0; the others wait)."""
        path = Path(path)
        model_state, _ = self._gathered(optimizer=False)
        if not dist.is_main():
            dist.barrier()
            return path
        tmp = path.parent / f".tmp-{path.name}-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        model = self.accelerator.unwrap_model(self.model)
        with _removed_on_error(tmp):
            model.save_pretrained(tmp, state_dict=model_state)
            self.tok.save_pretrained(tmp)
            self._save_extra(tmp)
            normal_permissions(tmp)
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
        dist.barrier()
        return path
