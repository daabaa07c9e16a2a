"""Self-play with both seats trained: TextArena's TicTacToe, the tiny model, win rate against the frozen start.

1. data: self-play games (``opponent: self``) in which both seats play a minimax-optimal move, drawn at
   random among the equally good ones (seeded per game, so the games differ); every one is a draw;
2. SFT of a fresh tiny model (``micro`` preset, a tokenizer of its own) on them: the start;
3. GRPO from the start with LoRA in self-play, each episode giving a training row and a group
   baseline per seat, with the seat's reward from the game (win 1, draw 0, loss -1); the frozen start
   is never in these games. Two arms: `shared`, one adapter plays and learns both seats; and
   `role_adapters` (`rl.role_adapters`), each seat its own adapter, trained on its own turns;
4. the trained policy against the frozen start: one model, two adapters (the trained one and a zero
   one, which is the start itself), each playing one seat through the roles machinery, both seat
   orders, sampled at the rollout temperature (TicTacToe starts from the same empty board every time,
   so greedy games would all be one game). "Before" is the start against itself. With an adapter per
   seat, each seat's adapter plays that seat against the frozen start.

Settings were fixed before the runs and not tuned on the evaluation games.

    OMP_NUM_THREADS=1 python benchmarks/selfplay_tictactoe.py --seeds 0 1 --out runs/selfplay-ttt

Prints a table and writes benchmarks/results/selfplay_tictactoe.json. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import time
from pathlib import Path
from typing import Any

from _tiny_runs import apply_sets, tiny_sft

ENV = {"name": "textarena", "kwargs": {"game": "TicTacToe-v0", "opponent": "self"}}
P: dict[str, Any] = {
    "n_train": 400, "preset": "micro", "vocab_size": 1024, "sft_steps": 300, "sft_lr": 1e-3, "batch_size": 8,
    "max_length": 2048, "max_new_tokens": 8, "max_turns": 12, "rl_steps": 30, "rl_lr": 5e-4, "lora_r": 16,
    "temperature": 1.0, "tasks_per_step": 8, "group_size": 8, "eval_games": 100,
}


def _env() -> Any:
    from trajtune.envs.registry import make_env

    return make_env(ENV["name"], **ENV["kwargs"])


def _data(out: Path, seed: int) -> list[Any]:
    from trajtune.envs.runner import run_episode
    from trajtune.plugins.textarena_env import tictactoe_move
    from trajtune.schema import Message

    env, trajs = _env(), []
    for task in env.tasks("train", P["n_train"], seed=seed):
        rng = random.Random(f"{seed}-{task.seed}")
        traj = run_episode(env, task, lambda m, t: Message(role="assistant", content=f"[{tictactoe_move(m, rng)}]"),
                           max_turns=P["max_turns"])
        assert traj.outcome and traj.outcome.success and traj.reward == 0.0  # perfect play: a draw
        trajs.append(traj)
    return trajs


def _sft(out: Path, seed: int) -> Path:
    return tiny_sft(out, _data(out, seed), seed=seed, vocab_size=P["vocab_size"], preset=P["preset"],
                    steps=P["sft_steps"], lr=P["sft_lr"], batch_size=P["batch_size"], max_length=P["max_length"],
                    tokenizer_episodes=200) / "final"


ARMS = {"shared": False, "role_adapters": True}  # arm -> rl.role_adapters


def _rl(start: Path, out: Path, seed: int, role_adapters: bool) -> Path:
    from trajtune.algorithms.rl import RLRunConfig
    from trajtune.train import run_rl

    run_rl(RLRunConfig.model_validate({
        "model": {"name_or_path": str(start), "lora": {"r": P["lora_r"], "alpha": 2 * P["lora_r"]}},
        "output_dir": str(out), "seed": seed, "env": ENV, "report": False,
        "rollout": {"max_turns": P["max_turns"], "max_new_tokens": P["max_new_tokens"],
                    "max_length": P["max_length"], "temperature": P["temperature"], "batch_size": 64},
        "rl": {"estimator": "grpo", "tasks_per_step": P["tasks_per_step"], "group_size": P["group_size"],
               "n_train_tasks": 512, "drop_equal_groups": True, "role_adapters": role_adapters},
        "train": {"steps": P["rl_steps"], "lr": P["rl_lr"], "schedule": "constant", "warmup_steps": 3,
                  "micro_batch_size": 16},
    }))
    return out / "final"


def _play(model: Any, tok: Any, seats: dict[str, str] | None, seed: int) -> dict[str, list[float | None]]:
    """``eval_games`` self-play games; ``seats`` maps player0/player1 to the model's adapters (None: the
    model plays both). Returns each seat's rewards."""
    from trajtune.eval.run import evaluate
    from trajtune.models.adapters import ROLES_ATTR, peft_model
    from trajtune.rollout import RolloutConfig

    if seats is not None:
        peft_model(model).__dict__[ROLES_ATTR] = dict(seats)
    ro = RolloutConfig(max_turns=P["max_turns"], max_new_tokens=P["max_new_tokens"], max_length=P["max_length"],
                       temperature=P["temperature"], batch_size=50)
    tasks = _env().tasks("test", P["eval_games"], seed=seed)
    _, episodes = evaluate(model, tok, _env, tasks, ro, seed=10_000 + seed)
    out: dict[str, list[float | None]] = {"player0": [], "player1": []}
    for e in episodes:
        rr = e.tokens.meta.get("role_rewards") or {}  # none: the game was cut (turns, length) before a verdict
        for s in out:
            out[s].append(float(rr[s]) if s in rr else None)
    return out


def _record(rewards: list[float | None]) -> dict[str, float]:
    n = len(rewards)
    done = [r for r in rewards if r is not None]
    return {"win": sum(r >= 1 for r in done) / n, "draw": sum(r == 0 for r in done) / n,
            "loss": sum(r < 0 for r in done) / n, "unfinished": (n - len(done)) / n, "games": n}


def _against_start(trained: Path, tok: Any, seed: int) -> dict[str, Any]:
    """The trained policy in each seat (its own adapter for that seat, when it has one per seat)
    against the frozen start in the other."""
    from trajtune.algorithms.registry import load_trained
    from trajtune.models.adapters import peft_model, role_adapters

    model = load_trained(str(trained))
    pm = peft_model(model)
    own = role_adapters(model) or {"player0": "default", "player1": "default"}
    pm.add_adapter("frozen", copy.deepcopy(pm.peft_config["default"]))  # LoRA's B starts at zero: the start
    pm.set_adapter("default")
    first = _play(model, tok, {"player0": own["player0"], "player1": "frozen"}, seed)
    second = _play(model, tok, {"player0": "frozen", "player1": own["player1"]}, seed + 1)
    return {"after": _record(first["player0"] + second["player1"]), "as_player0": _record(first["player0"]),
            "as_player1": _record(second["player1"])}


def run_seed(seed: int, out: Path) -> dict[str, Any]:
    from trajtune.algorithms.registry import load_trained
    from trajtune.models.loading import load_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    prev = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
    seconds = dict(prev.get("seconds", {}))
    t0 = time.time()
    start = out / "sft" / "final" if (out / "sft" / "final").exists() else _sft(out, seed)
    seconds.setdefault("sft", round(time.time() - t0, 1))
    tok = load_tokenizer(str(start))
    base = _play(load_trained(str(start)), tok, None, seed)
    res: dict[str, Any] = {"seed": seed, "before": _record(base["player0"] + base["player1"]), "arms": {}}
    for arm, flag in ARMS.items():
        final = out / f"rl-{arm}" / "final"
        if not final.exists():
            t1 = time.time()
            _rl(start, out / f"rl-{arm}", seed, flag)
            seconds[f"rl-{arm}"] = round(time.time() - t1, 1)
        res["arms"][arm] = _against_start(final, tok, seed)
    res["seconds"] = seconds
    (out / "summary.json").write_text(json.dumps(res, indent=1))
    return res


def _ending(messages: list[dict[str, Any]]) -> str:
    last = messages[-1] if messages else {}
    text = str(last.get("content") or "")
    if last.get("role") != "user" or not text.startswith("[GAME]") or "to move]" in text:
        return "cut (turn or length limit)"
    low = text.lower()
    if "occupied" in low:
        return "a seat played an occupied cell"
    if "draw" in low:
        return "draw"
    if "invalid" in low or "must be" in low:
        return "another invalid move"
    return "three in a row" if ("win" in low or "won" in low) else "other"


def endings(out: Path, seeds: list[int]) -> dict[str, Any]:
    """How the self-play training games ended, in the first and the last two RL steps of each arm
    (from the run's rollouts.jsonl)."""
    table: dict[str, Any] = {}
    for seed in seeds:
        for arm in ARMS:
            path = out / f"s{seed}" / f"rl-{arm}" / "rollouts.jsonl"
            if not (out / f"s{seed}" / f"rl-{arm}" / "final").exists():  # not run, or still running
                continue
            rows = [json.loads(line) for line in path.read_text().splitlines()]
            last = max(r["step"] for r in rows)
            for name, part in (("first_steps", [r for r in rows if r["step"] <= 2]),
                               ("last_steps", [r for r in rows if r["step"] >= last - 1])):
                counts: dict[str, int] = {}
                for r in part:
                    k = _ending(r["messages"])
                    counts[k] = counts.get(k, 0) + 1
                share = {k: round(v / len(part), 3) for k, v in sorted(counts.items(), key=lambda kv: -kv[1])}
                table.setdefault(str(seed), {}).setdefault(arm, {})[name] = share
                print(f"seed {seed} {arm:<14} {name:<11} " + ", ".join(f"{k} {v:.0%}" for k, v in share.items()))
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--out", type=Path, default=Path("runs/selfplay-ttt"))
    ap.add_argument("--collect", action="store_true", help="only read the seeds' summaries back")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="change a setting of P (JSON values)")
    ap.add_argument("--result", default="selfplay_tictactoe.json", help="file name under benchmarks/results")
    a = ap.parse_args()
    shown = apply_sets(ap, a.set, P)
    runs = [json.loads((a.out / f"s{s}" / "summary.json").read_text()) if a.collect else run_seed(s, a.out / f"s{s}")
            for s in a.seeds]
    cell = "{win:.0%} / {draw:.0%} / {loss:.0%} / {unfinished:.0%}".format
    print("win / draw / loss / unfinished, against the frozen start (before: the start itself)")
    print(f"{'seed':<5} {'before':>24} " + " ".join(f"{'after, ' + arm:>24}" for arm in ARMS))
    for r in runs:
        print(f"{r['seed']:<5} {cell(**r['before']):>24} "
              + " ".join(f"{cell(**r['arms'][arm]['after']):>24}" for arm in ARMS if arm in r["arms"]))
    dest = Path(__file__).parent / "results" / a.result
    dest.write_text(json.dumps({"settings": P, "env": ENV, "runs": runs, "training_game_endings": endings(a.out, a.seeds),
                                "command": f"python benchmarks/selfplay_tictactoe.py --seeds "
                                           f"{' '.join(map(str, a.seeds))} --out {a.out} {shown}".strip()}, indent=1))
    print(f"wrote {dest}")


if __name__ == "__main__":
    main()
