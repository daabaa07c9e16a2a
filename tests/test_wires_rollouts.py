"""Wires that only real rollouts exercise, through ``trajtune.train.run`` with a tiny model that ends
its turns (``wire_fixtures.train_talker``) in environments whose verdicts are recomputed here by hand
(``wire_envs``): EEF picking failed experts by task id and supervising the beneficial segment, RFT
keeping only verified successes, DPO pairing a success with a failure of the same task, dynamic
sampling training only informative groups, and a curriculum promoting after several steps."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from model_fixtures import perturbed_copy
from wire_envs import reply_is_even

from trajtune.algorithms.registry import load_run_config
from trajtune.envs import make_env
from trajtune.schema import write_trajectories
from trajtune.train import run


def _run(talker: Path, out: Path, algorithm: str, *overrides: str) -> list[dict]:
    cfg = load_run_config(None, [f"model={talker}", f"output_dir={out}", "report=false", *overrides],
                          algorithm=algorithm)
    run(cfg, quiet=True)
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _won(row: dict) -> bool:
    """wire_envs.Reply's parity verdict, recomputed from a stored episode."""
    reply = row["messages"][-1]
    return row["outcome"]["termination"] == "done" and reply["role"] == "assistant" and \
        reply_is_even(reply.get("content") or "")


def test_eef_through_train_picks_failed_experts_by_task_id_and_trains_the_segment_to_a_solvable_state(
        talker, tmp_path):
    # Ladder's expert: up, up, reset_counter, "Done." — it ends at 0 and fails. 4 actions, M = 5: states
    # s0..s3 (counter 0, 1, 2, 0). The policy answers in text at once, so it succeeds from s2 only:
    # the beneficial segment is s1 → s2, i.e. the expert's action a1 (docs/algorithms.md, EEF).
    env = make_env("wire_envs:Ladder")
    tasks = env.tasks("train", 2, seed=5)  # the run's training tasks (rft.n_tasks 2, seed 5)
    failed = env.expert(tasks[0])
    assert failed.outcome.success is False and failed.id == tasks[0].id
    stranger = env.expert(env.tasks("test", 1, seed=5)[0])  # failed too, but no training task has its id
    data = tmp_path / "experts.jsonl"
    write_trajectories(data, [failed, stranger])
    out = tmp_path / "eef"
    rows = _run(talker, out, "rft", "env=wire_envs:Ladder", "seed=5", f"data={{path: {data}, format: ir}}",
                "rft={iterations: 1, n_tasks: 2, k: 1, eef: true, eef_attempts: 3}",
                "rollout={max_turns: 2, max_new_tokens: 16, max_length: 512}",
                "train={steps: 1, batch_size: 1, micro_batch_size: 1}")
    m = rows[0]
    assert json.loads((out / "result.json").read_text())["failed_experts"] == 1  # the stranger is left out
    assert m["mined/eef_failed_experts"] == 1 and m["mined/eef_rollouts"] == 4 * 3  # 4 states × 3 attempts
    assert m["mined/eef_states_solved"] == 1  # s2 only
    assert m["mined/eef_trajectories"] == 1 and m["mined/eef_supervised_actions"] == 1
    assert m["mined/successes"] == 0 and m["mined/records"] == 1  # from s0 the policy never succeeds
    (rec,) = _lines(out / "rft" / "iter-000.jsonl")
    assert rec["id"] == tasks[0].id and rec["metadata"]["eef_actions"] == [1]
    assert [x.get("train", True) for x in rec["messages"] if x["role"] == "assistant"] == [False, True, False, False]
    assert m["tokens"] > 0  # the supervised action was trained


def test_rft_mining_keeps_only_verified_successes_of_real_attempts(talker, tmp_path):
    out = tmp_path / "rft"
    rows = _run(talker, out, "rft", "env=wire_envs:Reply", "rft={iterations: 1, n_tasks: 4, k: 4, per_task_quota: 2}",
                "rollout={max_turns: 1, max_new_tokens: 16, max_length: 256}",
                "train={steps: 1, batch_size: 2, micro_batch_size: 2}")
    m = rows[0]
    kept = _lines(out / "rft" / "iter-000.jsonl")
    assert m["mined/attempts"] == 16 and m["mined/kept"] == len(kept) >= 1
    assert m["mined/successes"] == m["mined/kept"] + m["mined/duplicates"] + m["mined/over_quota"]
    by_task: dict[str, list[str]] = {}
    for t in kept:
        assert _won(t), t["messages"][-1]  # an even reply that ended its turn: a verified success
        by_task.setdefault(t["id"], []).append(t["messages"][-1].get("content") or "")
    assert set(by_task) <= {f"reply-train-{i}" for i in range(4)}
    assert all(len(v) <= 2 and len(set(v)) == len(v) for v in by_task.values())  # quota, no duplicate


def test_dpo_mining_pairs_a_success_with_a_failure_of_the_same_task_from_sampled_tokens(talker, tiny_tok, tmp_path):
    out = tmp_path / "dpo"
    rows = _run(talker, out, "dpo", "env=wire_envs:Reply",
                "dpo={iterations: 1, n_tasks: 4, k: 4, reference: sampling}",
                "rollout={max_turns: 1, max_new_tokens: 16, max_length: 256}",
                "train={steps: 1, batch_size: 2, micro_batch_size: 1}")
    recs = _lines(out / "dpo" / "iter-000.jsonl")
    assert rows[0]["mined/pairs"] == len(recs) >= 1
    for r in recs:
        p = r["pair"]
        assert p["chosen"]["id"] == p["rejected"]["id"] == p["task_id"]
        assert _won(p["chosen"]) and not _won(p["rejected"])
        for side, row in zip((p["chosen"], p["rejected"]), r["rows"]):  # the rows are the sampled tokens
            policy = [i for i, s in zip(row["ids"], row["source"]) if s == 1]
            text = tiny_tok.decode(policy, skip_special_tokens=False)
            assert text.startswith(side["messages"][-1].get("content") or ""), (text, side["messages"][-1])
    # step 1: the policy is the sampler, so with its stored log-probs as reference Δw = Δl = 0: −log σ(0)
    assert rows[0]["loss"] == pytest.approx(math.log(2), abs=1e-4)


def test_dynamic_sampling_trains_only_groups_with_one_success_and_one_failure(talker, tmp_path):
    common = ["env=wire_envs:Reply", "seed=1", "rollout={max_turns: 1, max_new_tokens: 16, max_length: 256}",
              "train={steps: 1, lr: 1.0e-3, micro_batch_size: 8}"]
    plain_rows = _run(talker, tmp_path / "plain", "rl", *common, "rl={tasks_per_step: 4, group_size: 2}")
    dyn_rows = _run(talker, tmp_path / "dyn", "rl", *common,
                    "rl={tasks_per_step: 4, group_size: 2, dynamic_sampling: {max_rounds: 8}}")

    def groups(path):
        eps = _lines(path / "rollouts.jsonl")
        return [eps[i:i + 2] for i in range(0, len(eps), 2)]

    plain = groups(tmp_path / "plain")
    assert len(plain) == 4 and all(e.get("metadata", {}).get("trained", True) for g in plain for e in g)
    assert any(_won(a) == _won(b) for a, b in plain)  # the first round holds an equal-reward group
    trained = [g for g in groups(tmp_path / "dyn") if g[0]["metadata"].get("trained", True)]
    assert len(trained) == 4 and dyn_rows[0]["kept_groups"] == 4 and dyn_rows[0]["sampling_rounds"] >= 2
    assert all(_won(a) != _won(b) for a, b in trained)
    assert dyn_rows[0]["sequences"] == 8 == plain_rows[0]["sequences"]
    assert dyn_rows[0]["loss"] != plain_rows[0]["loss"]


def test_curriculum_promotes_after_enough_solved_episodes_over_several_steps(talker, tmp_path):
    # Reply(rule=level): tasks 0..5 have difficulty i % 3, level 0 is solved by any finished reply.
    # Pool {0, 3} for steps 1-2 (4 episodes ≥ min_episodes: promoted after step 2); then pool {0, 1, 3, 4},
    # cycled by step: step 3 takes index 2 (task 3, level 0), step 4 index 3 (task 4, level 1, unsolvable).
    out = tmp_path / "cur"
    rows = _run(talker, out, "rl", "env={name: 'wire_envs:Reply', kwargs: {rule: level}}",
                "rl={tasks_per_step: 1, group_size: 2, n_train_tasks: 6, curriculum: {promote_at: 0.5, "
                "min_episodes: 4}}", "rollout={max_turns: 1, max_new_tokens: 16, max_length: 256}",
                "train={steps: 4, lr: 1.0e-5, micro_batch_size: 2}")
    assert [r["curriculum_level"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
    assert [r["curriculum_promoted"] for r in rows] == [0.0, 1.0, 0.0, 0.0]
    eps = _lines(out / "rollouts.jsonl")
    assert [e["id"] for e in eps][::2] == ["reply-train-0", "reply-train-3", "reply-train-3", "reply-train-4"]
    assert rows[3]["curriculum_success"] == 0.0  # level 1 is never solved: no second promotion


@pytest.mark.slow
@pytest.mark.parametrize("algo,sharding", [("rft", "none"), ("dpo", "none"), ("dpo", "fsdp")])
def test_two_processes_mine_once_on_rank_0_and_train_like_one(talker, tmp_path, algo, sharding):
    """Data-parallel, rank 0 mines alone; sharded (train.sharding: fsdp), every rank mines in step with
    it (a sharded forward needs them all), rank 0 alone writes; either way the iteration files and the
    weights are one process's. Sharded DPO also shards its reference model."""
    from safetensors.torch import load_file
    from typer.testing import CliRunner

    from wire_fixtures import torchrun
    from trajtune.cli.main import app

    section = ("rft: {iterations: 2, n_tasks: 4, k: 2, per_task_quota: 1}\ntrain: {batch_size: 4, "
               if algo == "rft" else "dpo: {iterations: 2, n_tasks: 4, k: 4}\ntrain: {batch_size: 2, ")
    cfg = tmp_path / f"{algo}.yaml"
    cfg.write_text(f"algorithm: {algo}\nmodel: {talker}\nenv: wire_envs:Reply\nseed: 0\nreport: false\n"
                   "rollout: {max_turns: 1, max_new_tokens: 16, max_length: 256}\n"
                   + section + f"steps: 4, lr: 1.0e-3, micro_batch_size: 1, schedule: constant, sharding: {sharding}}}\n")
    p = torchrun("train", "--config", str(cfg), "--set", f"output_dir={tmp_path / 'two'}", "-q")
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.count('"step": 4') == 1  # one result, from rank 0
    r = CliRunner().invoke(app, ["train", "--config", str(cfg), "--set", f"output_dir={tmp_path / 'one'}", "-q"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    for it in ("iter-000.jsonl", "iter-001.jsonl"):  # rank 0 mined what one process mines, once per iteration
        two_recs, one_recs = (_lines(tmp_path / d / algo / it) for d in ("two", "one"))
        if algo == "dpo":  # the same pairs of the same sampled tokens; log-probs up to float rounding
            for a, b in zip(two_recs, one_recs):
                assert [(r["ids"], r["source"]) for r in a["rows"]] == [(r["ids"], r["source"]) for r in b["rows"]]
                for ra, rb in zip(a["rows"], b["rows"]):
                    assert ra["logprobs"] == pytest.approx(rb["logprobs"], abs=1e-4)
            two_recs = [r["pair"] for r in two_recs]
            one_recs = [r["pair"] for r in one_recs]
        assert two_recs == one_recs and len(one_recs) >= 1
    one = load_file(str(tmp_path / "one" / "final" / "model.safetensors"))
    two = load_file(str(tmp_path / "two" / "final" / "model.safetensors"))
    start = load_file(str(talker / "model.safetensors"))
    assert any(not torch.equal(one[k], start[k]) for k in one)
    for k in one:
        torch.testing.assert_close(two[k], one[k], atol=2e-5, rtol=1e-4)


def test_forgetting_probe_gives_a_damaged_model_a_negative_capability_delta(talker, tmp_path):
    from typer.testing import CliRunner

    from trajtune.cli.main import app

    damaged = perturbed_copy(talker, tmp_path / "damaged", scale=0.5)
    out = tmp_path / "f.json"
    # wire_envs:Finish: success = the agent ended its turn; the talker does (greedy), the noise-damaged copy
    # no longer writes the end-of-turn token: Δsuccess = model − base = 0 − 1
    r = CliRunner().invoke(app, ["probe", "forgetting", "--base", str(talker), "--model", str(damaged), "--env",
                                 "wire_envs:Finish", "--n", "2", "--max-new-tokens", "16", "--device", "cpu",
                                 "--out", str(out)])
    assert r.exit_code == 0, r.output
    res = json.loads(out.read_text())
    assert res["capability"]["base_success"] == 1.0 and res["capability"]["model_success"] == 0.0
    assert res["capability"]["delta_success"] == -1.0
    assert res["text"]["delta_loss"] > 0  # and the damage shows in the general-text loss
    swapped = tmp_path / "g.json"  # the other way round: the sign flips
    r = CliRunner().invoke(app, ["probe", "forgetting", "--base", str(damaged), "--model", str(talker), "--env",
                                 "wire_envs:Finish", "--n", "2", "--max-new-tokens", "16", "--device", "cpu",
                                 "--out", str(swapped)])
    assert r.exit_code == 0, r.output
    assert json.loads(swapped.read_text())["capability"]["delta_success"] == 1.0
