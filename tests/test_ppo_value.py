"""rl.credit: gae (PPO with a learned value head, token-level GAE over policy tokens) and MC-Critic
blending a learned value in (rl.mc_critic.value_weight)."""

from __future__ import annotations

import itertools
import json

import pytest
import torch
from safetensors.torch import load_file

from trajtune.algorithms.batch import collate, token_logprobs
from trajtune.algorithms.mc_critic import assign_mc_advantages, gae
from trajtune.algorithms.value import (
    VALUE_HEAD_FILE,
    ValueHead,
    ValueObjective,
    assign_gae_advantages,
    hidden_size,
    logprobs_and_values,
    token_gae,
    value_loss,
)
from trajtune.tokens import SOURCE_ENV, SOURCE_POLICY, SOURCE_PROMPT, TokenTrajectory

P, E = SOURCE_POLICY, SOURCE_ENV


def _episode(values: list[float] | None = None) -> TokenTrajectory:
    """3 turns: prompt | p p (turn 0) | obs | p (turn 1) | obs | p p (turn 2); turn rewards 0.5, 0, 1."""
    src = [SOURCE_PROMPT, P, P, E, P, E, P, P]
    turn = [0, 0, 0, 1, 1, 2, 2, 2]
    # values at the policy tokens 0.2 0.4 | 0.3 | 0.6 0.8; 9.0 at the others (never read)
    values = values if values is not None else [9.0, 0.2, 0.4, 9.0, 0.3, 9.0, 0.6, 0.8]
    return TokenTrajectory(ids=[1, 2, 2, 3, 2, 3, 2, 2], source=src, turn=turn,
                           weight=[float(s == P) for s in src], logprobs=[0.0] * 8, reward=1.5,
                           meta={"turn_rewards": [0.5, 0.0, 1.0], "values": values})


POLICY = [1, 2, 4, 6, 7]


def test_token_gae_matches_a_hand_computed_three_turn_episode():
    adv, ret = token_gae(_episode(), gamma=0.9, lam=0.95)
    # backwards over the policy tokens; γ only where the next token starts a new turn:
    # δ7 = 1 − 0.8 = 0.2                          A7 = 0.2
    # δ6 = 0.8 − 0.6 = 0.2                        A6 = 0.2 + 0.95·0.2 = 0.39
    # δ4 = 0 + 0.9·0.6 − 0.3 = 0.24               A4 = 0.24 + 0.9·0.95·0.39 = 0.57345
    # δ2 = 0.5 + 0.9·0.3 − 0.4 = 0.37             A2 = 0.37 + 0.855·0.57345 = 0.86029975
    # δ1 = 0.4 − 0.2 = 0.2                        A1 = 0.2 + 0.95·0.86029975 = 1.0172847625
    expected = [1.0172847625, 0.86029975, 0.57345, 0.39, 0.2]
    assert [adv[i] for i in POLICY] == pytest.approx(expected, abs=1e-12)
    assert [ret[i] for i in POLICY] == pytest.approx([a + v for a, v in zip(expected, [0.2, 0.4, 0.3, 0.6, 0.8])],
                                                     abs=1e-12)
    assert [adv[i] for i in (0, 3, 5)] == [0.0, 0.0, 0.0]  # observation / prompt tokens: no advantage
    assert [ret[i] for i in (0, 3, 5)] == [0.0, 0.0, 0.0]


def test_lambda_one_is_the_monte_carlo_return_minus_v_and_lambda_zero_the_td_error():
    adv, _ = token_gae(_episode(), gamma=0.9, lam=1.0)
    # G_2 = 1, G_1 = 0.9, G_0 = 0.5 + 0.81 = 1.31
    assert [adv[i] for i in POLICY] == pytest.approx([1.31 - 0.2, 1.31 - 0.4, 0.9 - 0.3, 1.0 - 0.6, 1.0 - 0.8])
    adv, _ = token_gae(_episode(), gamma=0.9, lam=0.0)
    assert [adv[i] for i in POLICY] == pytest.approx([0.2, 0.37, 0.24, 0.2, 0.2])


def test_gae_whitening_is_over_trained_policy_tokens_and_masked_episodes_get_nothing():
    a, b, masked = _episode(), _episode([0.0] * 8), _episode()
    masked.meta["masked"], masked.weight = True, [0.0] * 8
    _, m = assign_gae_advantages([a, b, masked], gamma=0.9, lam=0.95, whiten_advantages=True)
    trained = torch.tensor([t.advantages[i] for t in (a, b) for i in POLICY], dtype=torch.float64)
    assert float(trained.mean()) == pytest.approx(0.0, abs=1e-9)
    assert float(trained.std()) == pytest.approx(1.0, abs=1e-6)
    assert set(masked.advantages) == {0.0} and set(masked.meta["returns"]) == {0.0}
    assert a.meta["returns"][1] == pytest.approx(1.2172847625)  # returns are not whitened
    assert len(a.meta["turn_advantages"]) == 3 and m["masked_episodes"] == 1.0


def test_value_clipping_with_known_numbers():
    v, old, r = torch.tensor([1.0, 0.1]), torch.tensor([0.0, 0.0]), torch.tensor([2.0, 0.0])
    loss, clipped = value_loss(v, old, r, clip=0.2)
    # row 0: max((1 − 2)², (0.2 − 2)²) / 2 = 1.62 (clipped wins); row 1: inside the band, 0.1² / 2
    assert loss.tolist() == pytest.approx([1.62, 0.005])
    assert clipped.tolist() == [1.0, 0.0]
    assert value_loss(v, old, r, clip=None)[0].tolist() == pytest.approx([0.5, 0.005])


def _batch(tiny_model, tiny_tok):
    tts = [_episode(), _episode()]
    for t, rew, shift in zip(tts, (1.0, -1.0), (40, 80)):  # different tokens, opposite returns
        t.ids = [int(x) + shift for x in t.ids]
        t.meta["values"] = [0.0] * 8
        t.meta["turn_rewards"] = [0.0, 0.0, rew]
        t.reward = rew
    assign_gae_advantages(tts, 1.0, 1.0)
    return collate(tts, tiny_tok.pad_token_id or 0)


def test_joint_forward_gives_the_policy_log_probs_of_the_plain_forward(tiny_model, tiny_tok):
    b = _batch(tiny_model, tiny_tok)
    head = ValueHead(hidden_size(tiny_model))
    logp, values = logprobs_and_values(tiny_model, head, b)
    assert torch.equal(logp, token_logprobs(tiny_model, b)[0])
    assert values.shape == logp.shape and float(values.detach().abs().max()) == 0.0  # zero-initialised head


def test_observation_tokens_get_exactly_zero_value_gradient(tiny_model, tiny_tok):
    b = _batch(tiny_model, tiny_tok)
    head = ValueHead(hidden_size(tiny_model))
    torch.nn.init.normal_(head.linear.weight, std=0.5, generator=torch.Generator().manual_seed(0))
    seen = []

    def keep(mod, inp, out):  # returns None: the output is left as it is
        out.retain_grad()
        seen.append(out)

    head.register_forward_hook(keep)
    obj = ValueObjective(head=head, vf_coef=1.0, value_clip=None)
    loss, metrics = obj.loss_sum(tiny_model, b)
    loss.backward()
    grad = seen[0].grad  # d loss / d V at target positions 1..T-1
    mask = b.loss_mask()
    assert torch.all(grad[mask == 0] == 0.0)  # prompt and observation tokens (m_t = 0): exactly zero
    assert torch.all(grad[mask == 1] != 0.0)
    assert metrics["value_loss"][1] == 10.0  # 5 policy tokens × 2 rows


def test_value_loss_decreases_on_a_fixed_batch(tiny_model, tiny_tok):
    b = _batch(tiny_model, tiny_tok)
    head = ValueHead(hidden_size(tiny_model))
    obj = ValueObjective(head=head, vf_coef=1.0, value_clip=None)
    opt = torch.optim.Adam([*tiny_model.parameters(), *head.parameters()], lr=3e-3)
    losses = []
    for _ in range(6):
        loss, m = obj.loss_sum(tiny_model, b)
        losses.append(m["value_loss"][0] / m["value_loss"][1])
        opt.zero_grad()
        (loss / obj.denominator(b)).backward()
        opt.step()
    assert losses[0] == pytest.approx(0.5)  # V = 0, returns ±1: ½ · 1
    assert losses[-1] < 0.5 * losses[0]
    assert all(x > y for x, y in itertools.pairwise(losses))


def _mc(values: list[float]) -> TokenTrajectory:
    t = _episode(values)
    t.meta["mc_values"] = [0.7, 0.5, 0.9]
    return t


def test_blending_weight_zero_is_pure_mc_and_one_is_the_learned_value():
    learned = [9.0, 0.2, 0.4, 9.0, 0.3, 9.0, 0.6, 0.8]  # at the turns' first policy tokens: 0.2, 0.3, 0.6
    r = [0.5, 0.0, 1.0]
    pure, w0, w1, half = _mc(learned), _mc(learned), _mc(learned), _mc(learned)
    del pure.meta["values"]
    assign_mc_advantages([pure], 0.9, 0.95)
    assign_mc_advantages([w0], 0.9, 0.95, value_weight=0.0)
    assign_mc_advantages([w1], 0.9, 0.95, value_weight=1.0)
    assign_mc_advantages([half], 0.9, 0.95, value_weight=0.5)
    assert w0.advantages == pure.advantages
    assert pure.meta["turn_advantages"] == pytest.approx(gae(r, [0.7, 0.5, 0.9], 0.9, 0.95), abs=1e-6)
    assert w1.meta["turn_advantages"] == pytest.approx(gae(r, [0.2, 0.3, 0.6], 0.9, 0.95), abs=1e-6)
    assert half.meta["blended_values"] == pytest.approx([0.45, 0.4, 0.75])
    # the head's targets under blending: the discounted turn returns G = 1.31, 0.9, 1.0 on each turn's tokens
    assert [w1.meta["returns"][i] for i in POLICY] == pytest.approx([1.31, 1.31, 0.9, 1.0, 1.0])


def _cfg(tiny_dir, out, *extra):
    from trajtune.algorithms.rl import RLRunConfig
    from trajtune.config import load_config

    return load_config(None, RLRunConfig, [f"model={tiny_dir}", f"output_dir={out}", "env=home", "rl.credit=gae",
                                            "rollout.max_turns=2", "rollout.max_new_tokens=12",
                                            "rollout.max_length=512", "rl.tasks_per_step=2", "rl.group_size=2",
                                            "rl.n_train_tasks=4", "train.steps=4", "train.lr=3e-3",
                                            "train.save_every=1", "train.keep_last=5", "report=false",
                                            "rl.gamma=0.9", "rl.overlong={max_length: 36, cache: 32}", *extra])


GAE = "rl.value={vf_coef: 0.5, clip: 0.5, lam: 0.95}"


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_gae_run_checkpoints_the_value_head_and_resumes_bit_identically(tiny_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from trajtune.train import run

    run(_cfg(tiny_dir, tmp_path / "full", GAE), quiet=True)
    run(_cfg(tiny_dir, tmp_path / "k", GAE), quiet=True, stop_after=2)
    assert (tmp_path / "k" / "checkpoints" / "step-000002" / VALUE_HEAD_FILE).exists()
    run(_cfg(tiny_dir, tmp_path / "k", GAE), quiet=True, resume=True)

    full, resumed = tmp_path / "full" / "final", tmp_path / "k" / "final"
    assert _same(load_file(full / "model.safetensors"), load_file(resumed / "model.safetensors"))
    head = load_file(full / VALUE_HEAD_FILE)
    assert _same(head, load_file(resumed / VALUE_HEAD_FILE))
    assert float(head["linear.weight"].abs().sum()) > 0  # the head trained
    assert (tmp_path / "full" / "rollouts.jsonl").read_text() == (tmp_path / "k" / "rollouts.jsonl").read_text()
    rows = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all("value_loss" in r and "value_mean" in r for r in rows)
    AutoModelForCausalLM.from_pretrained(full)  # the final directory is still a plain HF model


def test_mc_critic_blending_trains_a_value_head(tiny_dir, tmp_path):
    from trajtune.train import run

    out = tmp_path / "mc"
    run(_cfg(tiny_dir, out, "rl.credit=mc_critic",
             "rl.mc_critic={samples: 1, value_weight: 0.5}", "train.steps=2", "rl.tasks_per_step=1"), quiet=True)
    eps = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    assert all(len(e["metadata"]["turn_advantages"]) == len(e["metadata"]["mc_values"]) for e in eps)
    assert "value_loss" in json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert (out / "final" / VALUE_HEAD_FILE).exists()


@pytest.mark.parametrize("sets, match", [
    (["rl.value={vf_coef: 0.5}"], "only applies to credit: gae"),
    (["rl.credit=turn", "rl.value={vf_coef: 0.5}"], "only applies to credit: gae"),
    (["rl.credit=gae", "rl.estimator=rloo"], "rl.estimator apply to group baselines"),
    (["rl.credit=gae", "rl.masked_in_baseline=true"], "rl.masked_in_baseline apply to group baselines"),
    (["rl.credit=gae", "rl.async_rollouts=true"], "not supported"),
    (["rl.credit=gae", "rl.mc_critic={samples: 2}"], "only applies to credit: mc_critic"),
    (["rl.credit=mc_critic", "rl.value={vf_coef: 0.5}"], "value_weight > 0 or drop rl.value"),
    (["rl.credit=mc_critic", "rl.mc_critic={value_weight: 0.5}", "rl.value={lam: 0.9}"],
     "rl.value.lam only applies to credit: gae"),
    (["rl.credit=mc_critic", "rl.mc_critic={value_weight: 1.5}"], "less than or equal to 1"),
])
def test_config_refusals(sets, match):
    from trajtune.algorithms.rl import RLRunConfig
    from trajtune.config import load_config
    from trajtune.errors import ConfigError

    with pytest.raises(ConfigError, match=match):
        load_config(None, RLRunConfig, ["model=m", "env=home", "output_dir=o", *sets])


def test_gae_accepts_groups_of_one():
    from trajtune.algorithms.rl import RLRunConfig
    from trajtune.config import load_config

    cfg = load_config(None, RLRunConfig, ["model=m", "env=home", "output_dir=o", "rl.credit=gae", "rl.group_size=1"])
    assert cfg.rl.uses_value_head() and cfg.rl.value is None  # defaults when omitted


def test_resume_refuses_a_checkpoint_without_the_value_head(tiny_dir, tmp_path):
    from trajtune.errors import RunDirError
    from trajtune.train import run

    out = tmp_path / "r"
    base = ["rl.credit=episode", "rl.gamma=1.0", "train.steps=2"]
    run(_cfg(tiny_dir, out, *base), quiet=True, stop_after=1)
    with pytest.raises(RunDirError, match="has no value_head.safetensors"):
        run(_cfg(tiny_dir, out, "train.steps=2"), quiet=True, resume=True, allow_config_change=True)
