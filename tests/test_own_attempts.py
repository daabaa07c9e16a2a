"""Learning from own attempts (docs/algorithms.md): DPO (loss, objective, pair files, mining), RFT
(filter, quota, dedup), EEF (states, beneficial segments, rollouts from a replayed state), and the
`rft` / `dpo` runs through `trajtune train`, killed and resumed exactly."""

from __future__ import annotations

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from model_fixtures import FixedLogits
from trajtune.algorithms.batch import Batch
from trajtune.algorithms.dpo import (
    DPOObjective,
    dpo_loss,
    check_pair,
    mine_step_pairs,
    mine_trajectory_pairs,
    rank_siblings,
    read_pairs,
    render_pair,
)
from trajtune.algorithms.rft import (
    beneficial_segments,
    eef_states,
    select_successes,
    supervise_actions,
)
from trajtune.chat.render import ChatRenderer
from trajtune.cli.main import app
from trajtune.algorithms.registry import load_run_config
from trajtune.envs import make_env
from trajtune.errors import DataError, EnvError
from trajtune.rollout import Episode, RolloutConfig, run_rollouts
from trajtune.schema import Message, Outcome, PreferencePair, RecordError
from trajtune.tokens import SOURCE_ENV, SOURCE_POLICY, SOURCE_PROMPT

runner = CliRunner()


# -- DPO math ------------------------------------------------------------------------------------

def test_dpo_loss_vectors():
    w, l_ = torch.tensor([1.0]), torch.tensor([-1.0])
    assert dpo_loss(w, l_, 0.1).item() == pytest.approx(0.5981, abs=1e-4)  # ALGORITHMS.md
    assert dpo_loss(w, l_, 0.1, "ipo").item() == pytest.approx((2.0 - 5.0) ** 2)  # (h − 1/(2β))², h = 2
    assert dpo_loss(torch.zeros(1), torch.zeros(1), 0.1).item() == pytest.approx(math.log(2))


def _pair_batch(ref_shift: float):
    ids = torch.tensor([[1, 2, 3, 4], [1, 2, 4, 3]])
    src = torch.tensor([[SOURCE_PROMPT, SOURCE_POLICY, SOURCE_ENV, SOURCE_POLICY]] * 2)
    logits = torch.randn(2, 4, 6, generator=torch.Generator().manual_seed(0))
    model = FixedLogits(logits.clone())
    lp = torch.log_softmax(logits, -1)[:, :-1].gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    ref = torch.zeros(2, 4)
    ref[:, 1:] = lp + ref_shift
    b = Batch(ids, torch.ones_like(ids), src, torch.ones(2, 4), ref.clone(), ref.clone(), torch.zeros(2, 4),
              torch.zeros(2), 2)
    return model, b, lp


def test_dpo_objective_counts_only_policy_tokens_and_uses_the_chosen_reference():
    model, b, lp = _pair_batch(0.0)
    obj = DPOObjective(beta=0.1)
    loss, m = obj.loss_sum(model, b)
    assert loss.item() == pytest.approx(math.log(2), abs=1e-6) and obj.denominator(b) == 1.0  # θ = ref
    assert m["tokens"] == 4.0 and m["reward_accuracy"] == (0.0, 1.0)
    loss.backward()
    g = model.logits.grad
    assert g[:, 1].abs().sum().item() == 0.0 and g[:, 3].abs().sum().item() == 0.0  # predict env / past the end
    assert g[:, 0].abs().sum().item() > 0 and g[:, 2].abs().sum().item() > 0
    # reference = sampling reads old_logprobs: shift only those and the loss moves as Δ says
    model, b, lp = _pair_batch(0.0)
    b.old_logprobs[0, 1:] -= 0.5  # chosen's reference 0.5 lower per policy token -> Δw = +1 over 2 tokens
    loss, _ = DPOObjective(beta=0.1, reference="sampling").loss_sum(model, b)
    assert loss.item() == pytest.approx(-torch.nn.functional.logsigmoid(torch.tensor(0.1)).item(), abs=1e-5)
    b.ref_logprobs = None
    with pytest.raises(ValueError, match="reference log-probs"):
        DPOObjective(reference="model").loss_sum(model, b)


# -- pairs as data ----------------------------------------------------------------------------------

def _pair(experts, i=0, j=1, **kw) -> dict:
    c, r = experts[i], experts[j] if j is not None else experts[i]
    return {"id": f"p{i}", "task_id": c.id, "chosen": c.model_dump(mode="json"),
            "rejected": r.model_dump(mode="json"), **kw}


def _write_pairs(tmp_path, rows):
    p = tmp_path / "pairs.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def test_pair_file_errors_name_file_line_pair_and_rule(tmp_path, home_experts):
    same = _pair(home_experts, 0, None)
    ok = _write_pairs(tmp_path, [same])
    assert [p.id for p in read_pairs(str(ok))] == ["p0"]
    missing = dict(same)
    del missing["rejected"]
    a0, a1 = [i for i, m in enumerate(same["chosen"]["messages"]) if m["role"] == "assistant"][:2]
    cases = [
        ([same, missing], "P301", ":2"),
        ([_pair(home_experts, 0, 1)], "P302", ":1"),  # two different tasks
        ([dict(same, level="step", prefix_messages=1)], "P303", ":1"),  # message 1 is the user's, not an action
        ([dict(same, level="step", prefix_messages=a1,
               rejected=dict(same["rejected"], messages=[
                   dict(m, content="I will look elsewhere first.") if i == a0 else m
                   for i, m in enumerate(same["rejected"]["messages"])]))], "P304", ":1"),
    ]
    for rows, rule, line in cases:
        with pytest.raises(RecordError) as e:
            read_pairs(str(_write_pairs(tmp_path, rows)))
        assert e.value.rule == rule and f"pairs.jsonl{line}" in str(e.value) and "p0" in str(e.value), str(e.value)


def test_render_pair_trains_the_compared_action_only(tiny_tok, home_experts):
    t = home_experts[0]
    first_action = next(i for i, m in enumerate(t.messages) if m.role == "assistant")
    pair = PreferencePair(id="s", task_id=t.id, level="step", chosen=t, rejected=t, prefix_messages=first_action)
    rows = render_pair(ChatRenderer(tiny_tok), pair)
    assert [r.meta["pair_role"] for r in rows] == ["chosen", "rejected"] and rows[0].group == rows[1].group
    trained_turns = {tn for tn, w, s in zip(rows[0].turn, rows[0].weight, rows[0].source) if s == SOURCE_POLICY and w}
    assert trained_turns == {0}  # only the first assistant turn, later turns are context
    full = render_pair(ChatRenderer(tiny_tok), pair.model_copy(update={"level": "trajectory"}))
    n_turns = sum(m.role == "assistant" for m in t.messages)
    assert {tn for tn, w, s in zip(full[0].turn, full[0].weight, full[0].source) if s == SOURCE_POLICY and w} \
        == set(range(n_turns))


def _episode(traj, task, success, termination="done", tok=None):
    traj = traj.model_copy(update={"outcome": Outcome(success=success, termination=termination)})
    tt = ChatRenderer(tok).render(traj)
    tt.logprobs = [0.0] * len(tt)
    tt.termination = termination
    return Episode(trajectory=traj, tokens=tt, task=task)


def test_mining_pairs_only_within_a_task(tiny_tok, home_experts):
    env = make_env("home")
    tasks = env.tasks("train", 3, seed=0)
    experts = [env.expert(t) for t in tasks]
    eps = [_episode(experts[0], tasks[0], True, tok=tiny_tok), _episode(experts[0], tasks[0], False, tok=tiny_tok),
           _episode(experts[0], tasks[0], False, tok=tiny_tok),
           # task 1 only succeeds, task 2 only fails: together they would make a pair, but they are different tasks
           # (task 2 even reuses task 1's text)
           _episode(experts[1], tasks[1], True, tok=tiny_tok), _episode(experts[1], tasks[2], False, tok=tiny_tok),
           _episode(experts[1], tasks[1], False, "env_error", tok=tiny_tok)]  # an env error is never "rejected"
    mined, counts = mine_trajectory_pairs(eps, max_pairs_per_task=5, seed=0)
    assert len(mined) == 1 and counts["tasks_mixed"] == 1 and counts["tasks_all_fail"] == 1
    assert counts["tasks_env_failures"] == 1
    m = mined[0]
    assert m.pair.task_id == tasks[0].id and m.pair.chosen.outcome.success and not m.pair.rejected.outcome.success
    assert [r.meta["pair_role"] for r in m.rows] == ["chosen", "rejected"] and m.rows[0].logprobs is not None
    assert mine_trajectory_pairs(eps, 1, seed=0)[0][0].pair.id == mine_trajectory_pairs(eps, 1, seed=0)[0][0].pair.id


def test_rank_siblings_keeps_pairs_above_the_value_gap():
    assert rank_siblings([0.25, 1.0, 0.0, 0.5], theta=0.5) == [(1, 2)]
    assert rank_siblings([0.25, 0.5], theta=0.5) == []
    assert rank_siblings([1.0], theta=0.0) == []


def _from_state(traj, task, n_prefix, success, tok):
    """An episode as run_rollouts returns it when started after ``n_prefix`` actions: the replayed
    history is prompt, and the policy's turns count from 0 at the state."""
    reward = 1.0 if success else 0.0
    traj = traj.model_copy(update={"outcome": Outcome(success=success, termination="done"), "reward": reward})
    tt = ChatRenderer(tok).render(traj)
    before = [t < n_prefix or (t == n_prefix and s != SOURCE_POLICY) for t, s in zip(tt.turn, tt.source)]
    tt.source = [SOURCE_PROMPT if b else s for b, s in zip(before, tt.source)]
    tt.turn = [max(0, t - n_prefix) for t in tt.turn]
    tt.weight = [1.0 if s == SOURCE_POLICY else 0.0 for s in tt.source]
    tt.logprobs = [-1.0 if s == SOURCE_POLICY else 0.0 for s in tt.source]
    tt.reward, tt.success, tt.termination = reward, success, "done"
    return Episode(trajectory=traj, tokens=tt, task=task, turns=sum(m.role == "assistant" for m in traj.messages))


def _give_up(traj, n_prefix):
    """The expert's first ``n_prefix`` actions (with their observations), then a final answer that gives up."""
    idx = [i for i, m in enumerate(traj.messages) if m.role == "assistant"]
    return traj.model_copy(update={"messages": traj.messages[: idx[n_prefix]] + [
        Message(role="assistant", content="I cannot do this.")]})


def test_step_pairs_rank_sibling_actions_by_monte_carlo_value(tiny_tok):
    env = make_env("home")
    task, expert = next((t, e) for t in env.tasks("train", 50, seed=0)
                        for e in [env.expert(t)] if sum(m.role == "assistant" for m in e.messages) >= 3)
    at = [i for i, m in enumerate(expert.messages) if m.role == "assistant"]
    ok, bad = (lambda n, s=True: _from_state(expert, task, n, s, tiny_tok)), \
        (lambda n: _from_state(_give_up(expert, n), task, n, False, tiny_tok))
    states = [(task.id, 0, [ok(0), bad(0), ok(0, False), bad(0)]),  # expert first action: value 0.5; give up: 0
              (task.id, 1, [bad(1), ok(1), ok(1)]),  # from the state after one action: 1.0 vs 0
              (task.id, 1, [ok(1), ok(1, False)])]  # one distinct action: no sibling to compare
    mined, counts = mine_step_pairs(states, theta=0.5)
    assert counts == {"states": 3, "states_one_action": 1, "states_below_gap": 0, "pairs": 2}
    assert [(m.pair.chosen_value, m.pair.rejected_value) for m in mined] == [(0.5, 0.0), (1.0, 0.0)]
    assert [m.pair.prefix_messages for m in mined] == [at[0], at[1]]
    r = ChatRenderer(tiny_tok)
    for m in mined:
        check_pair(m.pair)  # same task, same history up to the compared action (P302, P304)
        assert m.pair.level == "step" and m.pair.rejected.messages[-1].content == "I cannot do this."
        # the sampled rows train exactly the compared action, the same tokens the IR pair renders to
        for row, rendered in zip(m.rows, render_pair(r, m.pair)):
            trained = [i for i, w, s in zip(row.ids, row.weight, row.source) if w > 0 and s == SOURCE_POLICY]
            want = [i for i, w, s in zip(rendered.ids, rendered.weight, rendered.source) if w > 0 and s == SOURCE_POLICY]
            assert trained == want and trained
    assert mine_step_pairs(states, theta=0.6)[1]["states_below_gap"] == 1  # 0.5 vs 0 is below a 0.6 gap


def _fake_state_rollouts(tok):
    """run_rollouts stand-in that honours ``prefixes``: even attempts follow the expert, odd ones give up."""

    def fake(model, tok_, env_factory, tasks, rollout, seed=0, renderer=None, prefixes=None, **kw):
        env = env_factory()
        out = []
        for k, task in enumerate(tasks):
            n = sum(m.role == "assistant" for m in prefixes[k]) if prefixes else 0
            expert = env.expert(task)
            out.append(_from_state(expert, task, n, True, tok) if k % 2 == 0
                       else _from_state(_give_up(expert, n), task, n, False, tok))
        return out

    return fake


def test_dpo_step_level_mines_from_states_along_an_attempt(tmp_path, tiny_dir, tiny_tok, monkeypatch):
    import trajtune.rollout as ro_mod
    from trajtune.envs.registry import register_env
    from trajtune.envs.home import HomeEnv

    monkeypatch.setattr(ro_mod, "run_rollouts", _fake_state_rollouts(tiny_tok))
    p = tmp_path / "step.yaml"
    p.write_text(f"algorithm: dpo\nmodel: {tiny_dir}\nenv: home\noutput_dir: {tmp_path / 'o'}\n"
                 "dpo: {level: step, n_tasks: 2, k: 2, states_per_task: 2, value_gap: 0.4}\n"
                 "rollout: {max_length: 1024}\ntrain: {steps: 2, batch_size: 2, micro_batch_size: 1}\n")
    r = runner.invoke(app, ["train", "--config", str(p), "--quiet"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    row = json.loads((tmp_path / "o" / "metrics.jsonl").read_text().splitlines()[0])
    # per task: the start and the state after the spine's (a give-up attempt has one action, so the
    # spine is the expert) first action, each with an expert ≻ give-up pair
    assert row["mined/states"] == 4 and row["mined/pairs"] == 4
    recs = [json.loads(x) for x in (tmp_path / "o" / "dpo" / "iter-000.jsonl").read_text().splitlines()]
    assert sorted(x["pair"]["id"].split("@")[1][0] for x in recs) == ["0", "0", "1", "1"]
    assert all(x["pair"]["level"] == "step" for x in recs)
    for extra, msg in [("--set=dpo.level=trajectory", "dpo.value_gap only applies to dpo.level: step"),
                       ("--set=dpo.max_pairs_per_task=3", "max_pairs_per_task only applies to dpo.level: trajectory")]:
        r = runner.invoke(app, ["train", "--config", str(p), extra, "--overwrite"])
        assert r.exit_code == 2 and msg in r.output, r.output

    @register_env("home-unreplayable")
    class Unreplayable(HomeEnv):
        deterministic = False

    r = runner.invoke(app, ["train", "--config", str(p), "--set=env=home-unreplayable", "--overwrite"])
    assert r.exit_code == 2 and "is not deterministic" in r.output, r.output
    env = Unreplayable()
    with pytest.raises(EnvError, match="not deterministic"):
        env.reach(env.tasks("train", 1)[0], [])


# -- RFT and EEF ------------------------------------------------------------------------------------

def test_rft_keeps_verified_successes_dedup_and_quota(tiny_tok):
    env = make_env("home")
    tasks = env.tasks("train", 2, seed=0)
    e0, e1 = env.expert(tasks[0]), env.expert(tasks[1])
    other = e0.model_copy(update={"messages": [*e0.messages[:-1], e0.messages[-1].model_copy(
        update={"content": "All done."})]})
    eps = [_episode(e0, tasks[0], True, tok=tiny_tok), _episode(e0, tasks[0], True, tok=tiny_tok),  # duplicate
           _episode(other, tasks[0], True, tok=tiny_tok),  # a different success of task 0
           _episode(e0, tasks[0], True, tok=tiny_tok),
           _episode(e1, tasks[1], False, tok=tiny_tok)]
    kept, c = select_successes(eps, per_task_quota=2)
    assert len(kept) == 2 and c["duplicates"] == 2 and c["successes"] == 4 and c["tasks_with_success"] == 1
    assert kept[1].messages[-1].text() == "All done."
    kept, c = select_successes(eps, per_task_quota=1)
    assert len(kept) == 1 and c["over_quota"] == 1 and c["duplicates"] == 2
    kept, c = select_successes(eps, per_task_quota=9, dedup=False)
    assert len(kept) == 4 and c["duplicates"] == 0


def test_eef_twelve_step_chain():
    states = eef_states(12, 3)
    assert states == [0, 3, 6, 9]
    assert beneficial_segments(12, states, [False, True, False, True]) == [0, 1, 2, 6, 7, 8]
    assert beneficial_segments(12, states, [True, True, True, True]) == []
    assert beneficial_segments(12, states, [False, False, False, False]) == []  # the last segment never counts
    assert eef_states(3, 5) == [0, 1, 2] and eef_states(13, 3) == [0, 3, 6, 9]  # fewer than M + 1 actions: every state


def test_supervise_actions_trains_only_the_chosen_turns(tiny_tok, home_experts):
    t = home_experts[0]
    n = sum(m.role == "assistant" for m in t.messages)
    s = supervise_actions(t, [1])
    assert [m.train for m in s.messages if m.role == "assistant"] == [k == 1 for k in range(n)]
    tt = ChatRenderer(tiny_tok).render(s)
    assert {tn for tn, w, src in zip(tt.turn, tt.weight, tt.source) if src == SOURCE_POLICY and w} == {1}


def test_rollouts_from_a_replayed_state(tiny_model, tiny_tok):
    env = make_env("home")
    task = env.tasks("train", 1, seed=3)[0]
    expert = env.expert(task)
    actions = [i for i, m in enumerate(expert.messages) if m.role == "assistant"]
    prefix = expert.messages[: actions[2]]  # the state after two expert actions
    ro = RolloutConfig(max_turns=2, max_new_tokens=12, max_length=1024, temperature=1.0)
    r = ChatRenderer(tiny_tok)
    ep = run_rollouts(tiny_model, tiny_tok, lambda: make_env("home"), [task], ro, seed=1, renderer=r,
                      prefixes=[prefix])[0]
    assert ep.trajectory.messages[: len(prefix)] == prefix  # the history is the expert's, observations replayed
    tt = ep.tokens
    first_policy = tt.source.index(SOURCE_POLICY)
    prompt_ids = r.encode(r.prompt_text(prefix, expert.tools))
    assert tt.ids[:first_policy] == prompt_ids and set(tt.source[:first_policy]) == {SOURCE_PROMPT}
    assert ep.turns <= 2  # max_turns counts the policy's own turns
    live = make_env("home")
    live.reset(task)
    for m in prefix:
        if m.role == "assistant":
            live.step(m)
    replayed = make_env("home")
    replayed.reach(task, prefix)
    assert replayed.render() == live.render()
    plain = run_rollouts(tiny_model, tiny_tok, lambda: make_env("home"), [task], ro, seed=1, renderer=r)[0]
    again = run_rollouts(tiny_model, tiny_tok, lambda: make_env("home"), [task], ro, seed=1, renderer=r,
                         prefixes=[[]])[0]
    assert plain.tokens.ids == again.tokens.ids  # an empty prefix is a plain episode


# -- the runs, through the CLI, killed and resumed ------------------------------------------------

def _fake_rollouts(success_of):
    """run_rollouts stand-in: expert episodes whose success is success_of(task index in the call, k)."""

    def fake(model, tok, env_factory, tasks, rollout, seed=0, renderer=None, progress=None, prefixes=None, **kw):
        env = env_factory()
        eps = []
        for k, task in enumerate(tasks):
            eps.append(_episode(env.expert(task), task, success_of(task.id, k), tok=tok))
            eps[-1].tokens.logprobs = [0.0 if s != SOURCE_POLICY else -1.0 for s in eps[-1].tokens.source]
        return eps

    return fake


def _weights(path):
    from safetensors.torch import load_file

    return load_file(str(path / "final" / "model.safetensors"))


@pytest.mark.parametrize("algo", ["rft", "dpo"])
def test_rft_and_dpo_runs_resume_exactly(tmp_path, tiny_dir, monkeypatch, algo):
    import trajtune.rollout as ro_mod
    from trajtune.train import run

    monkeypatch.setattr(ro_mod, "run_rollouts", _fake_rollouts(lambda tid, k: k % 2 == 0))
    section = ("rft: {iterations: 2, n_tasks: 4, k: 2, per_task_quota: 1}" if algo == "rft"
               else "dpo: {iterations: 2, n_tasks: 4, k: 2, reference: model, beta: 0.2}")
    text = (f"algorithm: {algo}\nmodel: {tiny_dir}\nenv: home\nseed: 3\n{section}\n"
            "rollout: {max_turns: 3, max_new_tokens: 16, max_length: 768}\n"
            "train: {steps: 6, lr: 3.0e-3, batch_size: 2, micro_batch_size: 1, save_every: 2, schedule: constant}\n")
    cfgs = {}
    for name in ("full", "killed"):
        p = tmp_path / f"{name}.yaml"
        p.write_text(text + f"output_dir: {tmp_path / name}\n")
        cfgs[name] = p
    r = runner.invoke(app, ["train", "--config", str(cfgs["full"]), "--quiet"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    result = json.loads(r.stdout)
    assert result["step"] == 6
    rows = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    assert [row["iteration"] for row in rows] == [0, 0, 0, 1, 1, 1]
    if algo == "rft":
        assert rows[0]["mined/kept"] == 4 and rows[0]["mined/successes"] == 4  # one success per task
    else:
        assert rows[0]["mined/pairs"] == 4 and "reward_accuracy" in rows[0] and rows[0]["tokens"] > 0
    assert (tmp_path / "full" / algo / "iter-000.jsonl").exists() and (tmp_path / "full" / algo / "iter-001.jsonl").exists()

    cfg = load_run_config(cfgs["killed"])
    assert run(cfg, quiet=True, stop_after=5)["stopped"]  # killed after step 5: checkpoint at 4, inside iteration 1
    r = runner.invoke(app, ["train", "--config", str(cfgs["killed"]), "--resume", "--quiet"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    a, b = _weights(tmp_path / "full"), _weights(tmp_path / "killed")
    assert all(torch.equal(a[k], b[k]) for k in a)
    steps = [json.loads(x)["step"] for x in (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_mining_that_yields_nothing_stops_with_the_counts(tmp_path, tiny_dir, monkeypatch):
    import trajtune.rollout as ro_mod

    monkeypatch.setattr(ro_mod, "run_rollouts", _fake_rollouts(lambda tid, k: False))
    for section, want in [("dpo: {n_tasks: 3, k: 2}", "no pair to train on: of 3 tasks × 2 attempts, 0 succeeded "
                                                       "every time and 3 failed every time"),
                          ("rft: {n_tasks: 3, k: 2}", "nothing to train on: 0 successes in 6 attempts on 3 tasks")]:
        algo = section.split(":")[0]
        p = tmp_path / f"{algo}.yaml"
        p.write_text(f"algorithm: {algo}\nmodel: {tiny_dir}\nenv: home\noutput_dir: {tmp_path / algo}\n{section}\n"
                     "train: {steps: 2}\n")
        r = runner.invoke(app, ["train", "--config", str(p), "--quiet"])
        assert r.exit_code == 3, r.output  # a data error
        assert want in r.output, r.output
        assert not (tmp_path / algo / "final").exists()


def test_dpo_from_a_pair_file_trains_and_bad_configs_are_refused(tmp_path, tiny_dir, home_experts):
    pairs = _write_pairs(tmp_path, [_pair(home_experts, i, None) | {"id": f"p{i}"} for i in range(4)])
    p = tmp_path / "dpo.yaml"
    p.write_text(f"algorithm: dpo\nmodel: {tiny_dir}\noutput_dir: {tmp_path / 'o'}\ndpo: {{pairs: {pairs}}}\n"
                 "train: {steps: 2, batch_size: 2, micro_batch_size: 2}\n")
    r = runner.invoke(app, ["train", "--config", str(p), "--quiet"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["pairs"] == 4
    row = json.loads((tmp_path / "o" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["loss"] == pytest.approx(math.log(2), abs=1e-4)  # step 1: θ = reference, identical sides
    for extra, msg in [("--set=dpo.reference=sampling", "a pair file has none"),
                       ("--set=env=home", "exactly one source of pairs"),
                       ("--set=dpo.k=8", "only applies to pairs mined")]:
        r = runner.invoke(app, ["train", "--config", str(p), extra, "--overwrite"])
        assert r.exit_code == 2 and msg in r.output, r.output
    with pytest.raises(DataError):
        read_pairs(str(_write_pairs(tmp_path, [])))


def test_eef_mine_supervises_the_segment_that_leads_to_a_solvable_state(tiny_tok, monkeypatch):
    """The policy (faked) succeeds only from states at or after the expert's 2nd action: with n actions
    and M = n − 1 (states s0..s_{n-1}) the segment s1 → s2 is the beneficial one, so only a1 is trained."""
    import trajtune.rollout as ro_mod
    from trajtune.algorithms.rft import eef_mine

    env = make_env("home")
    task, expert = next((t, e) for t in env.tasks("train", 50, seed=0)  # a 3-action expert: look, set, done
                        for e in [env.expert(t)] if sum(m.role == "assistant" for m in e.messages) >= 3)
    n = sum(m.role == "assistant" for m in expert.messages)
    seen_prefixes = []

    def fake(model, tok, env_factory, tasks, rollout, seed=0, renderer=None, prefixes=None, **kw):
        out = []
        for t, p in zip(tasks, prefixes):
            seen_prefixes.append(sum(m.role == "assistant" for m in p))
            out.append(_episode(expert, t, sum(m.role == "assistant" for m in p) >= 2, tok=tiny_tok))
        return out

    monkeypatch.setattr(ro_mod, "run_rollouts", fake)
    failed = expert.model_copy(update={"outcome": Outcome(success=False)})
    trajs, counts = eef_mine(None, tiny_tok, ChatRenderer(tiny_tok), lambda: make_env("home"), [(task, failed)],
                             RolloutConfig(), m=n - 1, attempts=2, seed=0)
    assert sorted(set(seen_prefixes)) == list(range(n)) and counts["rollouts"] == 2 * n
    assert len(trajs) == 1 and trajs[0].metadata["eef_actions"] == [1]
    assert [m.train for m in trajs[0].messages if m.role == "assistant"] == [k == 1 for k in range(n)]


def test_data_pairs_mines_a_rollouts_file(tmp_path):
    env = make_env("home")
    tasks = env.tasks("train", 2, seed=0)
    rows = []
    for step, task, ok in [(1, tasks[0], True), (1, tasks[0], False), (1, tasks[1], False),
                           (2, tasks[0], True),  # same task, later step (another policy): not paired with step 1
                           (2, tasks[1], True)]:
        t = env.expert(task).model_copy(update={"outcome": Outcome(success=ok, termination="done")})
        rows.append({"step": step, **t.model_dump(mode="json", exclude_none=True)})
    src = tmp_path / "rollouts.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "pairs.jsonl"
    r = runner.invoke(app, ["data", "pairs", str(src), "-o", str(out)])
    assert r.exit_code == 0, r.output
    counts = json.loads(r.stdout)
    assert counts["pairs"] == 1 and counts["tasks"] == 4 and counts["tasks_all_success"] == 2
    pairs = read_pairs(str(out))  # what it writes passes the pair rules
    assert len(pairs) == 1 and pairs[0].task_id == tasks[0].id
    assert pairs[0].chosen.outcome.success and not pairs[0].rejected.outcome.success
    r = runner.invoke(app, ["data", "pairs", str(src), "-o", str(out)])
    assert r.exit_code != 0 and "exists" in r.output  # never overwritten silently
    src.write_text("".join(json.dumps(dict(x, outcome={"success": False})) + "\n" for x in rows))
    r = runner.invoke(app, ["data", "pairs", str(src), "-o", str(tmp_path / "none.jsonl")])
    assert r.exit_code == 3 and "of 4 tasks, 0 always succeeded, 4 always failed" in r.output, r.output
