"""A real model in a multi-turn environment: SmolLM2-135M on ``home``, LoRA SFT, then GRPO from an
under-trained checkpoint, with the per-turn failure analysis.

Why ``home``: its ``copy`` and ``toggle`` tasks need two tool turns and a final answer, the second
call depending on what the first one observed, and it is verifiable on state. Its rendered expert
episode is about 570 SmolLM2 tokens; ``trip`` and ``workspace`` episodes are 1400-1800, which puts
a two-seed run out of reach of 2 CPU cores in one session.

Stages, each resumable (a finished one is read back):

1. ``n_train`` expert trajectories of the training split (the scripted expert);
2. the base model on ``n_test`` held-out tasks (the test split: other seeds, never trained on);
3. LoRA SFT (the real demo's settings: r 16, lr 3e-4, batches of 4), a checkpoint every
   ``save_every`` steps, then the final adapter on the held-out tasks;
4. the under-trained checkpoint, chosen by a rule on *training* tasks as the tiny demo does: the
   checkpoints are probed oldest first on ``probe_tasks`` tasks of the SFT data, and the chosen one
   is the last before the first that solves at least ``weak_max_success`` of them (GRPO can only
   reinforce what the policy sometimes samples, so a checkpoint that never succeeds is skipped:
   below ``weak_min_success`` it is not a candidate). By default the probe is greedy and scores
   success; ``probe_temperature`` samples it as RL will, ``probe_reward`` scores a reward term instead
   (e.g. ``explained``), ``weak_min_kind`` also asks that much of every task kind, and ``weak_first``
   chooses the first candidate instead (the least trained checkpoint RL can learn every kind from);
5. GRPO from it on fresh training tasks (outcome reward: the episode's success), then the held-out
   tasks again.

Every evaluated episode stays in the run directory; the failure analysis compares each failed
episode with the scripted expert's episode for the same task and reports the first assistant turn
that differs and how (no call, an unparsable call, the wrong tool, the wrong room or device, the
wrong state, a call where the expert answered, no final answer).

    python benchmarks/real_multiturn.py --out runs/real-home-s0 --seed 0
    python benchmarks/real_multiturn.py --out runs/real-home-s0 --seed 0 --arms gigpo   # GiGPO arm
    python benchmarks/real_multiturn.py --table runs/real-home-s0 runs/real-home-s1
    python benchmarks/real_multiturn.py --out runs/real-home-why-s0 --seed 0 --arms grpo grounded \
      --set env_kwargs='{"rationale": true}' --set max_new_tokens=96   # the expert states its reading
    python benchmarks/real_multiturn.py --out runs/real-home-why-t07-s0 --seed 0 --arms explained explained_batch \
      --set env_kwargs='{"rationale": true}' --set max_new_tokens=96 --set rl_temperature=0.7  # pay the sentence
    python benchmarks/real_multiturn.py --table runs/real-home-why-t07-s0 runs/real-home-why-t07-s1 \
      --json benchmarks/results/real_multiturn_rationale_t07.json   # other settings: another file
    python benchmarks/real_multiturn.py --out runs/real-home-why-first-s0 --seed 0 --arms explained_batch \
      --set env_kwargs='{"rationale": true}' --set max_new_tokens=96 --set rl_temperature=0.7 \
      --set probe_temperature=0.7 --set probe_reward='"explained"' --set weak_min_kind=0.05 \
      --set weak_first=true   # the least trained checkpoint whose sampled episodes are paid on every kind

When the turn with a wrong state also wrote text (as ``home``'s ``rationale`` expert does), the
failure says where the sentence went wrong: it misreads the state, reads right but concludes wrong,
or the call contradicts a right sentence.

The same stages run on another environment with ``--set env=NAME --set env_kwargs=JSON`` (e.g.
``reasoning_gym``, single-turn: ``--set max_turns=1``); its failures are then counted from the
episodes' reward terms (``answer_failures``; ``tau2``: ``tau2_failures``), or for any other environment
(e.g. ``textarena``) from how each failed episode ended (``outcome_failures``), instead of against the
home expert. ``--arms`` with no arm stops after SFT (no probe, no under-trained checkpoint), e.g.

    python benchmarks/real_multiturn.py --out runs/real-tau2-s0 --seed 0 --arms --set env='"tau2"' \
      --set env_kwargs='{"policy": false}' --set n_train=30 --set n_test=20 --set sft_steps=15 \
      --set save_every=5 --set max_length=7168 --set max_new_tokens=128 --set max_turns=16 --set micro_batch_size=1 --set eval_batch_size=8

Writes ``summary.json`` in the run directory; ``--table`` prints the seeds side by side and writes
``benchmarks/results/real_multiturn.json`` (another environment: ``real_ENV.json``). A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

DEFAULTS: dict[str, Any] = {
    "model": "smollm2-135m",
    "env": "home",
    "env_kwargs": {},
    "n_train": 200,
    "n_test": 100,
    "sft_steps": 40,
    "save_every": 2,
    "batch_size": 4,
    "lr": 3e-4,
    "lora_r": 16,
    "lora_alpha": 32,
    "max_length": 768,
    "max_new_tokens": 64,
    "max_turns": 4,
    "eval_batch_size": 16,
    "probe_tasks": 32,
    "probe_temperature": 0.0,
    "probe_reward": "success",
    "weak_max_success": 0.6,
    "weak_min_success": 0.05,
    "weak_min_kind": 0.0,
    "weak_first": False,
    "rl_steps": 16,
    "rl_tasks_per_step": 4,
    "rl_group_size": 8,
    "rl_lr": 2e-4,
    "rl_temperature": 1.0,
    "n_val": 0,
    "micro_batch_size": 0,
}
# settings added after runs were made with the others: an older run's settings.json is read with their
# defaults (those runs were home runs without validation)
LATER = {k: DEFAULTS[k] for k in ("env", "env_kwargs", "n_val", "micro_batch_size", "probe_temperature",
                                   "probe_reward", "weak_min_kind", "weak_first")}


def _eval(model: Path | str, out: Path, p: dict[str, Any], seed: int, split: str = "test",
          tasks: int | None = None, temperature: float = 0.0) -> dict[str, Any]:
    """Success on the environment's tasks of ``split`` (greedy unless ``temperature``); a finished
    evaluation is read back."""
    from trajtune.eval.harness import EvalSettings
    from trajtune.eval.run import run_eval
    from trajtune.eval.store import RESULTS_FILE

    if (out / RESULTS_FILE).exists():
        return json.loads((out / RESULTS_FILE).read_text())["metrics"]  # type: ignore[no-any-return]
    settings = EvalSettings(model=str(model), env=p["env"], env_kwargs=p["env_kwargs"], tasks=tasks or p["n_test"],
                            split=split, seed=seed,
                            max_turns=p["max_turns"], max_new_tokens=p["max_new_tokens"],
                            max_length=p["max_length"], batch_size=p["eval_batch_size"], temperature=temperature)
    return run_eval(settings, out_dir=out, resume=out.exists())["metrics"]  # type: ignore[no-any-return]


def sft_config(base: str, out: Path, p: dict[str, Any], seed: int) -> Any:
    from trajtune.algorithms.sft import SFTRunConfig

    return SFTRunConfig.model_validate({
        "model": {"name_or_path": base, "dtype": "float32",
                  "lora": {"r": p["lora_r"], "alpha": p["lora_alpha"], "target_modules": "all-linear"}},
        "output_dir": str(out / "sft"), "seed": seed, "report": False,
        "data": {"path": str(out / "data" / "train.jsonl"), "format": "ir", "max_length": p["max_length"]},
        "train": {"steps": p["sft_steps"], "lr": p["lr"], "batch_size": p["batch_size"],
                  "micro_batch_size": p["micro_batch_size"] or p["batch_size"],
                  "warmup_steps": max(1, p["sft_steps"] // 10),
                  "save_every": p["save_every"], "keep_last": p["sft_steps"] // p["save_every"] + 1},
    })


# RL arms from the same under-trained checkpoint, the same tasks and the same rollout budget:
# stage directory, summary key, what the arm changes in ``rl``, and its learning rate as a multiple
# of rl_lr. grpo_2lr is GiGPO's control: with an outcome reward and γ = 1, GiGPO's turn-0 step
# group is the whole group, so its first turn trains with twice GRPO's advantage. grounded is GRPO
# whose reward is home's ``grounded`` term (success only when the devices the task depends on were
# read before being switched), against the blind-set shortcut GRPO learned on seed 1. explained
# (home with rationale: true only) pays a grounded success whose dependent calls came with the
# right sentence, against RL dropping the sentence. explained_batch is the same reward with the
# batch as baseline (REINFORCE++, no group dropped): a copy/toggle group in which every episode
# failed has zero advantage under GRPO, so only the set tasks' groups trained the shared first call
# (toward set_device, which is blind on the other kinds); against the batch's mean, such a group's
# episodes are pushed down.
ARMS: dict[str, tuple[str, str, dict[str, Any], float]] = {
    "grpo": ("rl", "weak_rl", {}, 1.0),
    "gigpo": ("rl-gigpo", "weak_rl_gigpo", {"credit": "gigpo", "gigpo": {"step_weight": 1.0}}, 1.0),
    "grpo_2lr": ("rl-grpo-2lr", "weak_rl_grpo_2lr", {}, 2.0),
    "grpo_quarter_lr": ("rl-grpo-lr0.25", "weak_rl_grpo_lr0.25", {}, 0.25),
    "grpo_tenth_lr": ("rl-grpo-lr0.1", "weak_rl_grpo_lr0.1", {}, 0.1),
    "grounded": ("rl-grounded", "weak_rl_grounded", {"reward": {"terms": {"info.grounded": 1.0}}}, 1.0),
    "explained": ("rl-explained", "weak_rl_explained", {"reward": {"terms": {"info.explained": 1.0}}}, 1.0),
    "explained_batch": ("rl-explained-batch", "weak_rl_explained_batch",
                        {"reward": {"terms": {"info.explained": 1.0}}, "estimator": "reinforce_pp",
                         "drop_equal_groups": False}, 1.0),
}
LABELS = {"grpo": "GRPO", "gigpo": "GiGPO", "grpo_2lr": "GRPO at 2× lr", "grpo_quarter_lr": "GRPO at lr/4",
          "grpo_tenth_lr": "GRPO at lr/10", "grounded": "GRPO, grounded reward",
          "explained": "GRPO, explained reward", "explained_batch": "REINFORCE++, explained reward"}


def rl_config(start: Path, out: Path, p: dict[str, Any], seed: int, arm: str = "grpo") -> Any:
    """GRPO on fresh training tasks (seed + 1000: tasks the SFT data did not draw), continuing the
    checkpoint's adapter; the reward is the episode's outcome. ``arm`` gigpo adds GiGPO's step
    advantages from anchor states (same episodes, same budget)."""
    from trajtune.algorithms.rl import RLRunConfig

    stage_dir, _, extra, lr_factor = ARMS[arm]
    return RLRunConfig.model_validate({
        "model": {"name_or_path": str(start), "dtype": "float32"},
        "output_dir": str(out / stage_dir), "seed": seed + 1000, "report": False,
        "env": {"name": p["env"], "kwargs": p["env_kwargs"]},
        "rollout": {"max_turns": p["max_turns"], "max_new_tokens": p["max_new_tokens"], "max_length": p["max_length"],
                    "temperature": p["rl_temperature"], "batch_size": p["rl_tasks_per_step"] * p["rl_group_size"]},
        "rl": {"estimator": "grpo", "tasks_per_step": p["rl_tasks_per_step"], "group_size": p["rl_group_size"],
               "n_train_tasks": p["rl_steps"] * p["rl_tasks_per_step"], "drop_equal_groups": True, **extra},
        "train": {"steps": p["rl_steps"], "lr": p["rl_lr"] * lr_factor, "schedule": "constant", "warmup_steps": 0,
                  "micro_batch_size": p["rl_group_size"],
                  "save_every": 4 if p["rl_steps"] > 4 else 0},
    })


def choose_weak(probed: dict[int, float], p: dict[str, Any],
                by_kind: dict[int, dict[str, float]] | None = None) -> int | None:
    """The rule of stage 4 on probed training scores per step: the last candidate before the first
    checkpoint at ``weak_max_success`` or above (None: no checkpoint qualifies). A candidate scores at
    least ``weak_min_success`` overall and, with ``weak_min_kind``, at least that on every task kind
    (``by_kind``): RL learns a kind only from groups in which some episode of that kind is paid. With
    ``weak_first`` the first candidate is chosen: the least trained checkpoint that qualifies."""
    chosen = None
    for step in sorted(probed):
        if probed[step] >= p["weak_max_success"]:
            break
        kinds = (by_kind or {}).get(step, {})
        if probed[step] >= p["weak_min_success"] and all(v >= p["weak_min_kind"] for v in kinds.values()):
            chosen = step
            if p["weak_first"]:
                break
    return chosen


def _task_kind(ep: dict[str, Any], env: str) -> str:
    """A probed episode's task kind (``home``: copy, set, toggle; any other environment: one kind)."""
    if env != "home":
        return "all"
    from trajtune.envs.home import make_task

    return str(make_task(int(ep["metadata"]["seed"]), ep["metadata"]["split"]).data["kind"])


def probe_scores(eval_dir: Path, p: dict[str, Any]) -> tuple[float, dict[str, float]]:
    """A probe's score, overall and per task kind: each episode's success, or with ``probe_reward``
    NAME the reward term ``info.NAME`` it reported (e.g. home's ``explained``), so that the rule sees
    what the RL arm will be paid for; with ``probe_temperature`` the episodes are sampled as RL samples
    them, where greedy success can hide a checkpoint whose sampled episodes are never paid."""
    eps = [json.loads(line) for line in (eval_dir / "episodes.jsonl").read_text().splitlines()]

    def score(ep: dict[str, Any]) -> float:
        if p["probe_reward"] == "success":
            return float(bool((ep.get("outcome") or {}).get("success")))
        return float((ep["metadata"].get("reward_info") or {}).get(p["probe_reward"], 0.0))

    kinds: dict[str, list[float]] = {}
    for ep in eps:
        kinds.setdefault(_task_kind(ep, p["env"]), []).append(score(ep))
    overall = sum(sum(v) for v in kinds.values()) / max(1, len(eps))
    return overall, {k: sum(v) / len(v) for k, v in sorted(kinds.items())}


def _weak(out: Path, p: dict[str, Any],
          seed: int) -> tuple[Path | None, dict[int, float], dict[int, dict[str, float]]]:
    ckpts = sorted((out / "sft" / "checkpoints").glob("step-*"), key=lambda c: int(c.name.split("-")[1]))
    probed: dict[int, float] = {}
    by_kind: dict[int, dict[str, float]] = {}
    for c in ckpts:  # oldest first; stop at the first that solves enough of the probe
        step = int(c.name.split("-")[1])
        probe_dir = out / "probe" / c.name
        _eval(c, probe_dir, p, seed, split="train", tasks=p["probe_tasks"], temperature=p["probe_temperature"])
        probed[step], by_kind[step] = probe_scores(probe_dir, p)
        if probed[step] >= p["weak_max_success"]:
            break
        if p["weak_first"] and choose_weak(probed, p, by_kind) is not None:
            break  # later checkpoints cannot change the choice
    step = choose_weak(probed, p, by_kind)  # weak_min_kind 0: every kind passes, the overall rule alone
    return (None if step is None else out / "sft" / "checkpoints" / f"step-{step:06d}"), probed, by_kind


def run(out: Path, p: dict[str, Any], seed: int, arms: tuple[str, ...] = ("grpo",)) -> dict[str, Any]:
    from trajtune.progress import StageClock
    from trajtune.envs.registry import make_env
    from trajtune.models.resolve import resolve_model
    from trajtune.schema import atomic_write_text, write_trajectories
    from trajtune.train import run_rl, run_sft

    if p["probe_reward"] != "success" and p["probe_reward"] not in getattr(
            make_env(p["env"], **p["env_kwargs"]), "reward_terms", ()):
        sys.exit(f"probe_reward {p['probe_reward']!r}: {p['env']} with {p['env_kwargs']} does not report it; "
                 "use success or one of the environment's reward terms (home: observed, grounded; "
                 "explained with rationale: true)")
    if p["weak_min_kind"] and p["env"] != "home":
        sys.exit("weak_min_kind needs task kinds, which only home's tasks have here; leave it at 0")
    out.mkdir(parents=True, exist_ok=True)
    settings_file = out / "settings.json"
    # n_val only adds evaluations, so a finished run can be validated later; any other change is refused
    if settings_file.exists() and ({**LATER, **json.loads(settings_file.read_text()), "n_val": p["n_val"]}
                                   != {**p, "seed": seed}):
        sys.exit(f"{out} was started with other settings ({settings_file}); use another --out")
    atomic_write_text(settings_file, json.dumps({**p, "seed": seed}, indent=1))
    base = str(resolve_model(p["model"]).path)
    stage = StageClock()
    # a later invocation with other arms keeps what earlier ones measured
    prev = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
    s: dict[str, Any] = {k: v for k, v in prev.items() if k.startswith(("weak_rl", "val_weak_rl"))}
    s.update({"settings": p, "seed": seed})
    with stage("data"):
        data = out / "data" / "train.jsonl"
        if not data.exists():
            env = make_env(p["env"], **p["env_kwargs"])
            write_trajectories(data, [make_env(p["env"], **p["env_kwargs"]).expert(t)
                                      for t in env.tasks("train", p["n_train"], seed=seed)])
    with stage("eval_base"):
        s["base"] = _eval(base, out / "eval-base", p, seed)["success"]

    def train_then_eval(name: str, key: str, train: Any, cfg: Any) -> None:
        """A training stage (finished: read back; started: resumed), then its final model held out."""
        with stage(name):
            if not (out / name / "final").exists():
                train(cfg, resume=(out / name).exists())
        with stage(f"eval_{name}"):
            s[key] = _eval(out / name / "final", out / f"eval-{name}", p, seed)["success"]
        validate(out / name / "final", name, key)

    def validate(model: Path, name: str, key: str) -> None:
        """With n_val: the model's success on n_val training-split tasks of seed + 500 (neither the SFT
        tasks nor the RL tasks), which is what chooses among RL arms (never the test split)."""
        if p["n_val"]:
            with stage(f"val_{name}"):
                s[f"val_{key}"] = _eval(model, out / f"val-{name}", p, seed + 500, split="train",
                                        tasks=p["n_val"])["success"]

    train_then_eval("sft", "sft", run_sft, sft_config(base, out, p, seed))
    if not arms:  # SFT only: no under-trained checkpoint to look for
        weak, probed, by_kind = None, {}, {}
    else:
        with stage("probe"):
            weak, probed, by_kind = _weak(out, p, seed)
    s["probe_train_success"] = {str(k): v for k, v in probed.items()}
    s["probe_by_kind"] = {str(k): v for k, v in by_kind.items()}
    if weak is None:
        s["weak_step"] = None
    else:
        s["weak_step"] = int(weak.name.split("-")[1])
        with stage("eval_weak"):
            s["weak"] = _eval(weak, out / "eval-weak", p, seed)["success"]
        validate(weak, "weak", "weak")
        for arm in arms:
            stage_dir, key, _, _ = ARMS[arm]
            train_then_eval(stage_dir, key, run_rl, rl_config(weak, out, p, seed, arm))
    s["failures"] = {name: failures(out / f"eval-{name}", p["env"]) for name in ("sft", "weak", *(a[0] for a in ARMS.values()))
                     if (out / f"eval-{name}").exists()}
    s["seconds"], s["peak_rss_mb_by_stage"] = stage_figures(stage.times, stage.peak, prev)
    # the stages' work, across invocations (a stage whose figures were lost counts nothing)
    s["wall_seconds"] = round(sum(v for v in s["seconds"].values() if v is not None), 1)
    atomic_write_text(out / "summary.json", json.dumps(s, indent=1))
    return s


def stage_figures(times: dict[str, float], peaks: dict[str, float],
                  prev: dict[str, Any]) -> tuple[dict[str, float | None], dict[str, float | None]]:
    """Per stage, the seconds and peak RSS of the invocation that did its work. A stage read back
    took ~0 s here: it keeps an earlier summary's figures, and where there are none (the invocation
    that did it was stopped before writing its summary) it gets None, not the ~0 s of reading it
    back; a stage this invocation did not reach keeps its earlier figures too."""
    seconds = dict(prev.get("seconds", {}))
    peak = dict(prev.get("peak_rss_mb_by_stage", {}))
    for k, v in times.items():
        if v >= 1.0:
            seconds[k], peak[k] = v, peaks.get(k)
        elif k not in seconds:
            seconds[k], peak[k] = None, None
    return seconds, peak


def _turn_issue(agent: dict[str, Any] | None, expert: dict[str, Any]) -> str | None:
    """How an agent's assistant turn differs from the expert's (None: it does not)."""
    want = (expert.get("tool_calls") or [None])[0]
    if agent is None:
        return "no final answer (turns ran out)" if want is None else "no call (turns ran out)"
    calls = agent.get("tool_calls") or []
    if want is None:
        return "a call where the expert answered" if calls else None
    if not calls:
        return "unparsable call" if agent.get("extra", {}).get("parse_errors") else "text instead of a call"
    got = calls[0]
    if len(calls) > 1:
        return "several calls in one turn"
    if got["name"] != want["name"]:
        return f"wrong tool ({got['name']} for {want['name']})"
    ga, wa = got.get("arguments") or {}, want["arguments"]
    if set(ga) != set(wa):
        return "wrong argument names"
    if (ga["room"], ga["device"]) != (wa["room"], wa["device"]):
        return "wrong room or device"
    if ga.get("state") != wa.get("state"):
        return "wrong state"
    return None


def _sentence_issue(text: str, d: dict[str, Any]) -> str:
    """Where a wrong state went wrong when the turn also said something (``home``'s ``rationale``
    expert says "The attic fan is on, so the office fan must be on."): the restated reading, the
    conclusion, or the call that contradicts a right conclusion."""
    from trajtune.envs.home import rationale_issue, read_room

    issue = rationale_issue(text, d["initial"][read_room(d)][d["device"]], d["goal"])
    return f" ({issue or 'call contradicts a right sentence'})"


def _failed_episodes(eval_dir: Path) -> list[dict[str, Any]]:
    """The evaluated episodes (JSON records) that did not succeed."""
    eps = [json.loads(line) for line in (eval_dir / "episodes.jsonl").read_text().splitlines()]
    return [ep for ep in eps if not (ep.get("outcome") or {}).get("success")]


def failures(eval_dir: Path, env: str = "home") -> dict[str, int]:
    """Failed held-out episodes by the first assistant turn that differs from the expert's, and how
    (``turn N: issue``); ``kind`` counts are in ``by_kind``. Another environment: ``reasoning_gym`` by
    what its reward terms say (``answer_failures``), any other by how episodes ended (``outcome_failures``)."""
    from trajtune.envs.home import HomeEnv, make_task

    if env == "reasoning_gym":
        return answer_failures(eval_dir)
    if env == "tau2":
        return tau2_failures(eval_dir)
    if env != "home":
        return outcome_failures(eval_dir)
    counts: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    for ep in _failed_episodes(eval_dir):
        seed = int(ep["id"].split("-")[2])
        task = make_task(seed, "test")
        expert = [m for m in HomeEnv().expert(task).model_dump()["messages"] if m["role"] == "assistant"]
        agent = [m for m in ep["messages"] if m["role"] == "assistant"]
        kinds[task.data["kind"]] += 1
        for i, want in enumerate(expert):
            issue = _turn_issue(agent[i] if i < len(agent) else None, want)
            if issue == "wrong state" and agent[i].get("content"):
                issue += _sentence_issue(agent[i]["content"], task.data)
            if issue:
                counts[f"turn {i + 1}: {issue}"] += 1
                break
        else:
            counts["matches the expert, yet failed"] += 1
    return {**dict(sorted(counts.items())), **{f"by_kind/{k}": v for k, v in sorted(kinds.items())}}


def answer_failures(eval_dir: Path) -> dict[str, int]:
    """Failed single-answer episodes (``reasoning_gym``): no answer tags, cut off at the token limit,
    a wrong or a partly right answer (from the episode's ``answer_format`` and ``answer_score``)."""
    counts: Counter[str] = Counter()
    for ep in _failed_episodes(eval_dir):
        terms = ep["metadata"].get("reward_info", {})
        cut = (ep.get("outcome") or {}).get("termination") == "length"
        if not terms.get("answer_format"):
            counts["no <answer> tags" + (" (cut off at the token limit)" if cut else "")] += 1
        else:
            counts["partly right answer" if terms.get("answer_score", 0) > 0 else "wrong answer"] += 1
    return dict(sorted(counts.items()))


def tau2_failures(eval_dir: Path) -> dict[str, int]:
    """Failed τ²-bench episodes: cut off (token limit, turn limit: scored 0 whatever the database), or
    finished with the database unlike the gold one and/or the required information unsaid (the
    episode's ``tau2_db`` and ``tau2_communicate`` terms)."""
    counts: Counter[str] = Counter()
    for ep in _failed_episodes(eval_dir):
        why = (ep.get("outcome") or {}).get("termination") or "unknown"
        if why != "done":
            counts[f"cut off ({why})"] += 1
            continue
        terms = ep["metadata"].get("reward_info", {})
        wrong = [name for key, name in (("tau2_db", "database differs from gold"),
                                        ("tau2_communicate", "required information not said")) if not terms.get(key)]
        counts["finished: " + (" and ".join(wrong) or "unscored component")] += 1
    return dict(sorted(counts.items()))


def outcome_failures(eval_dir: Path) -> dict[str, int]:
    """Failed episodes of any other environment (e.g. ``textarena``): how the episode ended, and the
    first line of the environment's last message (a game's verdict: an invalid move, out of turns)."""
    counts: Counter[str] = Counter()
    for ep in _failed_episodes(eval_dir):
        why = (ep.get("outcome") or {}).get("termination") or "unknown"
        last = ep["messages"][-1]
        if last["role"] != "assistant" and isinstance(last.get("content"), str) and last["content"].strip():
            said = re.sub(r"\d+", "N", last["content"].strip().splitlines()[0])[:90]  # numbers vary by game
            why += f": {said}"
        counts[why] += 1
    return dict(sorted(counts.items()))


def table(runs: list[Path], dest: Path | None = None) -> None:
    sums = [json.loads((r / "summary.json").read_text()) for r in runs]
    seeds = " / ".join(str(s["seed"]) for s in sums)

    def row(label: str, key: str) -> str:
        return f"| {label} | " + " / ".join("–" if s.get(key) is None else f"{s[key]:.0%}" for s in sums) + " |"

    env = sums[0]["settings"].get("env", "home")
    kwargs = sums[0]["settings"].get("env_kwargs") or {}
    shown = env + (" " + json.dumps(kwargs) if kwargs else "")
    print(f"| held-out `{shown}`, {sums[0]['settings']['n_test']} tasks | seeds {seeds} |\n|---|---|")
    print(row("base model", "base"))
    print(row(f"after LoRA SFT ({sums[0]['settings']['sft_steps']} steps)", "sft"))
    print("| under-trained checkpoint (step) | " + " / ".join(str(s["weak_step"]) for s in sums) + " |")
    print(row("under-trained checkpoint", "weak"))
    ran = [a for a in ARMS if any(s.get(ARMS[a][1]) is not None for s in sums)]
    for a in ran:
        print(row(f"under-trained + {LABELS[a]} ({sums[0]['settings']['rl_steps']} steps)", ARMS[a][1]))
    if any(s.get("val_weak") is not None for s in sums):
        n_val = sums[0]["settings"]["n_val"]
        print(row(f"validation ({n_val} training-split tasks): under-trained", "val_weak"))
        for a in ran:
            print(row(f"validation: + {LABELS[a]}", f"val_{ARMS[a][1]}"))
        picks = [max((a for a in ran if s.get(f"val_{ARMS[a][1]}") is not None),
                     key=lambda a, s=s: s[f"val_{ARMS[a][1]}"], default=None) for s in sums]  # ties: the first
        print("| **the RL arm chosen on validation, held out** | " + " / ".join(
            "–" if a is None else f"**{s[ARMS[a][1]]:.0%}** ({LABELS[a]})" for a, s in zip(picks, sums)) + " |")
    keys = sorted({k for s in sums for f in s["failures"].values() for k in f})
    stages = [st for st in ("sft", "weak", *(a[0] for a in ARMS.values())) if all(st in s["failures"] for s in sums)]
    print("\n| failed episodes: first turn that differs from the expert | " + " | ".join(stages) + " |")
    print("|---|" + "---|" * len(stages))
    for k in keys:
        print(f"| {k} | " + " | ".join(" / ".join(str(s["failures"][st].get(k, 0)) for s in sums) for st in stages) + " |")
    for s in sums:
        print(f"seed {s.get('seed')}: seconds {s['seconds']}  peak RSS MB {s['peak_rss_mb_by_stage']}  "
              f"probe {s['probe_train_success']}  by kind {s.get('probe_by_kind', {})}")
    name = "real_multiturn" if env == "home" else f"real_{env}"  # another environment: its own file
    if env == "home" and kwargs:  # home with other settings: its own file, e.g. real_multiturn_rationale.json
        name += "_" + "_".join(k if v is True else f"{k}-{v}" for k, v in sorted(kwargs.items()))
    dest = dest or Path(__file__).parent / "results" / f"{name}.json"
    dest.write_text(json.dumps({str(r): s for r, s in zip(runs, sums)}, indent=1) + "\n")
    print(f"wrote {dest}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="run directory (resumed when it exists)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help=f"override a setting (JSON value), e.g. --set sft_steps=60; settings: {sorted(DEFAULTS)}")
    ap.add_argument("--table", type=Path, nargs="+", help="print finished runs side by side")
    ap.add_argument("--json", type=Path, help="with --table: write the runs' summaries here instead of "
                    "results/real_multiturn[_ENV_KWARGS].json (runs that differ in other settings)")
    ap.add_argument("--arms", nargs="*", choices=sorted(ARMS), default=["grpo"],
                    help="RL arms from the under-trained checkpoint (default: grpo); none: stop before RL")
    a = ap.parse_args()
    if a.table:
        return table(a.table, a.json)
    if a.json:
        ap.error("--json goes with --table")
    if a.out is None:
        ap.error("--out (or --table) is required")
    p = dict(DEFAULTS)
    for item in a.set:
        name, _, value = item.partition("=")
        if name not in DEFAULTS:
            ap.error(f"unknown setting {name!r}; known: {sorted(DEFAULTS)}")
        try:
            p[name] = json.loads(value)
        except json.JSONDecodeError:
            p[name] = value  # a bare string, e.g. --set model=/path/to/model
    s = run(a.out, p, a.seed, tuple(a.arms))
    print(json.dumps({k: s.get(k) for k in ("base", "sft", "weak_step", "weak", *(a[1] for a in ARMS.values()),
                                            "seconds")}, indent=1))


if __name__ == "__main__":
    main()
