"""Context folding: the ``fold`` wrapper's rules, the folded record and its rows, the rollout that
folds (the KV cache rolled back, every row what the sampler saw), observation masking, and how the
rows reach the learner."""

from __future__ import annotations

import pytest
import torch

from trajtune.algorithms.advantages import assign_advantages, with_closed_rows
from trajtune.envs.adapters.fold import FOLD_SYSTEM, returned_text, started_text
from trajtune.envs.base import Environment, ResetResult, StepResult, Task
from trajtune.envs.registry import make_env
from trajtune.eval.metrics import summarize
from trajtune.folding import FOLD_KEY, MASKED_TEXT, expand_folds, is_folded
from trajtune.generation import RowCache
from trajtune.rollout import RolloutConfig, _rolled_back, run_rollouts
from trajtune.schema import Message, ToolCall, Trajectory
from trajtune.tokens import CLOSED_ROWS, SOURCE_ENV, SOURCE_POLICY, SOURCE_PROMPT, TokenTrajectory


def _call(name: str, cid: str = "c1", **args: str) -> Message:
    return Message(role="assistant", tool_calls=[ToolCall(id=cid, name=name, arguments=args)])


def test_the_wrapper_keeps_the_rules_and_reports_each_fold():
    env = make_env("fold", env="home", kwargs={"chores": 3})
    task = env.tasks("train", 1, seed=0)[0]
    res = env.reset(task)
    assert [t.name for t in res.tools] == ["get_state", "set_device", "branch", "return"]
    assert res.messages[0].text().endswith(FOLD_SYSTEM)
    refused = [env.step(_call("return", summary="x")),
               env.step(_call("branch", description="  ")),
               env.step(Message(role="assistant", tool_calls=[
                   ToolCall(id="a", name="branch", arguments={"description": "x"}),
                   ToolCall(id="b", name="get_state", arguments={"room": "attic", "device": "fan"})]))]
    assert [r.info["fold_error"] for r in refused] == ["return_outside_branch", "no_description", "not_alone"]
    assert all(not r.done and "fold" not in r.info and r.observations[0].text().startswith("Error:")
               for r in refused)
    assert [o.tool_call_id for o in refused[2].observations] == ["a", "b"]  # every call is answered
    opened = env.step(_call("branch", description="Toggle the fan."))
    assert opened.info["fold"] == {"event": "branch"} and opened.observations[0].text() == started_text("Toggle the fan.")
    nested = env.step(_call("branch", "c2", description="again"))
    assert nested.info["fold_error"] == "nested_branch"
    inner = env.step(_call("get_state", "c3", room="attic", device="fan"))  # the inner world answers
    assert inner.observations[0].text().startswith("attic fan: ")
    closed = env.step(_call("return", "c4", summary="x" * 500))
    assert closed.info["fold"] == {"event": "return", "summary": "x" * 200}  # cut at max_summary_chars
    assert closed.observations[0].text() == returned_text("x" * 200)
    assert env.step(_call("return", "c5", summary="y")).info["fold_error"] == "return_outside_branch"


def _hand_record() -> Trajectory:
    """Main: sys, user, a0 (branch 0) … summary 0, a3 (branch 1) … an unreturned branch."""
    b0, b1 = {FOLD_KEY: {"branch": 0}}, {FOLD_KEY: {"branch": 1}}
    msgs = [Message(role="system", content="s"), Message(role="user", content="u"),
            _call("branch", "a0", description="one"),
            Message(role="tool", tool_call_id="a0", content="started one", extra=b0),
            Message(role="assistant", content="inside one", extra=b0),
            Message(role="user", content="obs one", extra=b0),
            Message(role="assistant", content="return one", extra=b0),
            Message(role="tool", tool_call_id="a0", content="summary one", extra={FOLD_KEY: {"summary": 0}}),
            _call("branch", "a3", description="two"),
            Message(role="tool", tool_call_id="a3", content="started two", extra=b1),
            Message(role="assistant", content="inside two", extra=b1)]
    return Trajectory(id="t", messages=msgs)


def test_a_record_expands_into_the_contexts_it_was_sampled_in():
    rec = _hand_record()
    assert is_folded(rec)
    rows = expand_folds(rec)
    texts = [[(m.role, m.text(), m.train) for m in r.messages] for r in rows]
    assert [r.metadata["fold_row"] for r in rows] == ["branch0", "main"]
    # branch 0: the context before it, its assistant turn untrained (the main row trains it), then the branch
    assert texts[0] == [("system", "s", None), ("user", "u", None), ("assistant", "", False),
                        ("tool", "started one", None), ("assistant", "inside one", None),
                        ("user", "obs one", None), ("assistant", "return one", None)]
    # the episode ended inside branch 1, which never returned: that context is the last row, trained in full
    assert texts[1] == [("system", "s", None), ("user", "u", None), ("assistant", "", None),
                        ("tool", "summary one", None), ("assistant", "", None), ("tool", "started two", None),
                        ("assistant", "inside two", None)]
    plain = Trajectory(id="p", messages=[Message(role="user", content="u")])
    assert expand_folds(plain) == [plain]


def test_the_expert_folds_each_chore_and_sft_trains_every_turn_once(tiny_tok):
    from trajtune.chat.render import ChatRenderer

    env = make_env("fold", env="home", kwargs={"chores": 3})
    task = env.tasks("train", 1, seed=5)[0]
    rec = env.expert(task)
    assert rec.outcome.success and rec.metadata["folds"] == 3
    linear = make_env("home", chores=3).expert(task)
    own = [m for m in rec.messages if m.role == "assistant" and m.tool_calls and m.tool_calls[0].name in ("branch", "return")]
    assert len(own) == 6 and sum(m.role == "assistant" for m in rec.messages) == sum(
        m.role == "assistant" for m in linear.messages) + 6
    rows = expand_folds(rec)
    assert len(rows) == 4
    trained = [m for r in rows for m in r.messages if m.role == "assistant" and m.train is not False]
    assert len(trained) == sum(m.role == "assistant" for m in rec.messages)  # each turn trains exactly once
    main = rows[-1]
    assert not any("branch" in (m.extra.get(FOLD_KEY) or {}) for m in main.messages)
    assert [m.text() for m in main.messages if m.role == "tool"] == [
        m.text() for m in rec.messages if "summary" in (m.extra.get(FOLD_KEY) or {})]
    assert all(m.text().startswith("Branch returned: ok: ") for m in main.messages if m.role == "tool")
    samples = ChatRenderer(tiny_tok).render_samples(rec)
    assert len(samples) == 4 and all(any(w > 0 for w in s.weight) for s in samples)


def test_home_chores_is_a_long_horizon_task():
    env = make_env("home", chores=8)
    tasks = env.tasks("test", 5, seed=1)
    for t in tasks:
        rec = env.expert(t)
        assert rec.outcome.success
        assert t.data["prompt"].count(". ") >= 8
        assert len({(c["room"], c["device"]) for c in t.data["chores"]}) == 8
    env.reset(tasks[0])  # one chore left undone fails the task
    expert = make_env("home", chores=8).expert(tasks[0])
    for m in [m for m in expert.messages if m.role == "assistant"][:-2]:
        env.step(m)
    env.step(Message(role="assistant", content="Done."))
    assert not env.success()
    with pytest.raises(ValueError, match="chores"):
        make_env("home", chores=0)


class Script(Environment):
    """Folds on a schedule, whatever the model writes: branch after turns 1 and 4, return after 3 and 6;
    observations are user messages. Episodes alternate reward 1 / 0 by construction."""

    name = "fold_script"
    deterministic = True
    max_turns = 9
    count = 0

    def tasks(self, split, n, seed=0):
        return [Task(id=f"s{i}", seed=i, split=split, data={}) for i in range(n)]

    def reset(self, task):
        self.t = 0
        self.reward = float(Script.count % 2)
        Script.count += 1
        return ResetResult([Message(role="system", content="You are a test agent."),
                            Message(role="user", content="go on please")], [])

    def step(self, action):
        self.t += 1
        info = {}
        if self.t in (1, 4):
            info["fold"] = {"event": "branch"}
        if self.t in (3, 6):
            info["fold"] = {"event": "return", "summary": f"sum {self.t}"}
        text = f"summary {self.t}" if self.t in (3, 6) else f"observation {self.t} " + "lamp fan radio " * 5
        done = self.t >= 8
        return StepResult([Message(role="user", content=text)], reward=self.reward if done else 0.0, done=done,
                          info=info)

    def success(self):
        return self.t >= 8


def _sampled_logprobs_match(model, row: TokenTrajectory) -> int:
    """Every trained policy token's sampling log-prob equals a fresh forward pass over the row's ids
    (the forced stop token that ends each turn, ``turns_end``, is left out). Returns how many were checked."""
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([row.ids])).logits[0].double(), -1)
    checked = 0
    for i in range(1, len(row)):
        last_of_turn = i + 1 == len(row) or row.source[i + 1] != SOURCE_POLICY
        if row.source[i] == SOURCE_POLICY and row.weight[i] > 0 and not last_of_turn:
            assert lp[i - 1, row.ids[i]].item() == pytest.approx(row.logprobs[i], abs=1e-5), i
            checked += 1
    return checked


def test_a_folding_rollout_trains_each_context_as_the_sampler_saw_it(tiny_dir, turns_end):
    from trajtune.models.loading import load_model, load_tokenizer

    tok, model = load_tokenizer(str(tiny_dir)), load_model(str(tiny_dir)).double()
    cfg = RolloutConfig(max_new_tokens=6, max_turns=9, max_length=4000)
    eps = run_rollouts(model, tok, Script, Script().tasks("train", 2), cfg, seed=3)
    for e in eps:
        md = e.trajectory.metadata
        assert md["folds"] == 2 and md["rows"] == 3 and md["fold_errors"] == 0 and "unreturned_branch" not in md
        rows = e.rows + [e.tokens]
        assert len(rows) == 3
        assert all(_sampled_logprobs_match(model, r) >= 2 for r in rows)  # the KV rollback kept the caches exact
        main = e.tokens
        assert md["peak_context"] == max(len(r) for r in rows) > len(main)
        text = tok.decode(main.ids)
        assert "observation 2" not in text and "observation 5" not in text  # folded away
        assert "summary 3" in text and "summary 6" in text and "observation 7" in text
        # a branch row: the main context before it untrained, the branch trained
        b0 = e.rows[0]
        n = next(i for i in range(len(b0)) if b0.ids[i] != main.ids[i])
        assert all(w == 0 for w in b0.weight[:n]) and any(w > 0 for w in b0.weight[n:])
        assert "observation 2" in tok.decode(b0.ids) and "summary 3" not in tok.decode(b0.ids)
        # every turn of the episode trains in exactly one row
        owners = {k: [i for i, r in enumerate(rows) if any(s == SOURCE_POLICY and w > 0 and t == k
                                                           for s, w, t in zip(r.source, r.weight, r.turn))]
                  for k in range(8)}
        assert owners == {0: [2], 1: [0], 2: [0], 3: [2], 4: [1], 5: [1], 6: [2], 7: [2]}
        # the record holds every message, in order, with the marks; it expands into as many rows
        rec = e.trajectory
        assert [m.text() for m in rec.messages if m.role == "user"][1:] == [
            f"observation {t} " + "lamp fan radio " * 5 if t not in (3, 6) else f"summary {t}" for t in range(1, 9)]
        assert len(expand_folds(rec)) == 3
    m = summarize(eps)["context"]
    assert m["folds_per_episode"] == 2 and m["rows_per_episode"] == 3 and m["unreturned_branches"] == 0


def test_observation_masking_closes_a_row_and_masks_old_results(tiny_dir, turns_end):
    from trajtune.models.loading import load_model, load_tokenizer

    class Plain(Script):
        def step(self, action):
            out = super().step(action)
            out.info.pop("fold", None)
            out.observations = [Message(role="tool", tool_call_id="x", content=o.text()) for o in out.observations]
            return out

    tok, model = load_tokenizer(str(tiny_dir)), load_model(str(tiny_dir)).double()
    full = run_rollouts(model, tok, Plain, Plain().tasks("train", 1), RolloutConfig(max_new_tokens=6, max_length=4000))
    masked = run_rollouts(model, tok, Plain, Plain().tasks("train", 1),
                          RolloutConfig(max_new_tokens=6, max_length=4000, mask_observations_at=150))
    e = masked[0]
    assert e.rows and e.trajectory.metadata["rows"] == len(e.rows) + 1
    assert e.trajectory.metadata["peak_context"] < full[0].trajectory.metadata["peak_context"]
    for r in e.rows + [e.tokens]:
        _sampled_logprobs_match(model, r)
    for r in e.rows[1:] + [e.tokens]:  # a context after masking starts with prompt tokens only
        first_policy = r.source.index(SOURCE_POLICY)
        assert set(r.source[:first_policy]) <= {SOURCE_PROMPT, SOURCE_ENV}
        assert MASKED_TEXT in tok.decode(r.ids[:first_policy])
    assert all(w == (1.0 if s == SOURCE_POLICY else 0.0) for r in e.rows for s, w in zip(r.source, r.weight))
    assert all(MASKED_TEXT not in m.text() for m in e.trajectory.messages)  # the record keeps every result


def test_closed_rows_join_their_group_after_the_advantages():
    def tt(reward: float, rows: list[TokenTrajectory] | None = None) -> TokenTrajectory:
        t = TokenTrajectory(ids=[1, 2, 3], source=[SOURCE_PROMPT, SOURCE_POLICY, SOURCE_POLICY],
                            turn=[0, 0, 0], weight=[0.0, 1.0, 1.0], reward=reward, group="g")
        if rows:
            t.meta[CLOSED_ROWS] = rows
        return t

    row = TokenTrajectory(ids=[1, 2, 4, 5], source=[SOURCE_PROMPT, SOURCE_POLICY, SOURCE_ENV, SOURCE_POLICY],
                          turn=[0, 0, 0, 1], weight=[0.0, 0.0, 0.0, 1.0])
    with_rows = [tt(1.0, [row]), tt(0.0), tt(0.0)]
    plain = [tt(1.0), tt(0.0), tt(0.0)]
    kept, _ = assign_advantages(with_rows)
    out, m = with_closed_rows(kept)
    ref, _ = assign_advantages(plain)
    assert m == {"closed_rows": 1.0} and len(out) == 4 and out[1] is row and row.group == "g"
    # the row is not a sample of the group: the others' advantages are as without it
    assert [t.advantages for t in (out[0], out[2], out[3])] == [t.advantages for t in ref]
    a = ref[0].advantages[1]
    assert a > 0  # the success's
    assert row.advantages == [0.0, 0.0, 0.0, a]  # only the tokens it trains
    with pytest.raises(ValueError, match="rl.credit: episode"):
        with_closed_rows([tt(1.0, [row])])  # rows without an episode advantage (another credit)


def test_the_kv_rollback_cuts_views_and_drops_what_it_cannot_cut():
    k = torch.arange(2 * 3 * 10 * 4, dtype=torch.float).reshape(1, 6, 10, 4)
    cache = RowCache([(k, k + 1)], 10)
    cut = _rolled_back(cache, 7)
    assert cut.n == 7 and cut.layers[0][0].shape == (1, 6, 7, 4)
    assert cut.layers[0][0].data_ptr() == k.data_ptr()  # a view: nothing recomputed or copied
    assert torch.equal(cut.layers[0][1], (k + 1)[:, :, :7])
    assert _rolled_back(object(), 3) is None and _rolled_back(None, 3) is None


def test_rows_need_episode_credit(tmp_path, tiny_dir):
    from trajtune.algorithms.rl import RLRunConfig
    from trajtune.config import load_config
    from trajtune.errors import ConfigError
    from trajtune.train import run

    base = [f"model={tiny_dir}", "report=false", "train.steps=1"]
    for extra, why in ((["env.name=fold", "env.kwargs.env=home"], "fold environment wrapper"),
                       (["env=home", "rollout.mask_observations_at=512"], "rollout.mask_observations_at")):
        out = tmp_path / why.split()[0]
        cfg = load_config(None, RLRunConfig, base + extra + [f"output_dir={out}", "rl.credit=turn"])
        with pytest.raises(ConfigError, match=f"rl.credit: turn with .*{why}"):
            run(cfg, quiet=True)
        assert not out.exists()  # refused before anything is written


def test_the_validator_checks_each_row_of_a_folded_record():
    from trajtune.validate import validate_trajectory

    rec = make_env("fold", env="home", kwargs={"chores": 2}).expert(make_env("home", chores=2).tasks("train", 1)[0])
    assert [f for f in validate_trajectory(rec) if f.severity == "E"] == []
    # the same messages unmarked: the summary answers the branch call a second time
    plain = rec.model_copy(update={"messages": [m.model_copy(update={"extra": {}}) for m in rec.messages]})
    assert any(f.rule == "E214" for f in validate_trajectory(plain))
    # a broken summary (it answers no call) is found, at the record's own index
    i = next(i for i, m in enumerate(rec.messages) if "summary" in (m.extra.get(FOLD_KEY) or {}))
    broken = rec.model_copy(update={"messages": [m.model_copy(update={"tool_call_id": "nope"}) if j == i else m
                                                 for j, m in enumerate(rec.messages)]})
    found = [f for f in validate_trajectory(broken) if f.rule == "E211"]
    assert [f.message_index for f in found] == [i]


def test_rl_experience_holds_every_row_and_the_loss_sees_each_sampled_token_once(tiny_dir, turns_end):
    """RolloutSource + the RL transforms on folding episodes, then the clipped objective on the batch:
    every row's trained tokens count once, and the loss is the same with the rows' shared prefixes
    computed once or not."""
    from trajtune.algorithms.batch import collate
    from trajtune.algorithms.policy_gradient import PolicyGradientObjective
    from trajtune.algorithms.rl import rl_transforms
    from trajtune.experience import RolloutSource
    from trajtune.models.loading import load_model, load_tokenizer

    tok, model = load_tokenizer(str(tiny_dir)), load_model(str(tiny_dir)).double()
    Script.count = 0
    per_round, per_batch = rl_transforms()
    src = RolloutSource(tok, Script, Script().tasks("train", 2), RolloutConfig(max_new_tokens=6, max_length=4000),
                        tasks_per_step=2, group_size=2, per_round=per_round, per_batch=per_batch)
    kept, metrics, episodes = src.sample(0, model, 0)
    assert metrics["closed_rows"] == 8.0 and len(kept) == 12  # 4 episodes × (2 branches + the last context)
    assert [t.group for t in kept] == ["0:0"] * 6 + ["0:1"] * 6
    for e in episodes:
        a = e.tokens.meta["episode_advantage"]
        assert a != 0.0 and all(r.meta["episode_advantage"] == a for r in e.rows)
    sampled = sum(sum(1 for s, w in zip(t.source, t.weight) if s == SOURCE_POLICY and w > 0) for t in kept)
    obj = PolicyGradientObjective()
    losses = []
    for share in (False, True):
        loss, m = obj.loss_sum(model, collate(kept, tok.pad_token_id or 0, share_prefix=share))
        assert m["tokens"] == sampled
        losses.append(float(loss.detach()))
    assert losses[0] != 0.0 and losses[1] == pytest.approx(losses[0], abs=1e-9)
