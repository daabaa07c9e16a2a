"""docs/algorithms.md test vectors for the RL and SFT pieces (numbers from the spec, not from the code)."""

from __future__ import annotations

import math

import pytest
import torch

from model_fixtures import FixedLogits
from trajtune.algorithms.batch import Batch
from trajtune.algorithms.advantages import assign_advantages, group_advantages
from trajtune.algorithms.episode_transforms import apply_termination_policy, overlong_penalty
from trajtune.algorithms.policy_gradient import PolicyGradientObjective
from trajtune.algorithms.sft import SFTObjective, eaft_weights
from trajtune.tokens import SOURCE_ENV, SOURCE_POLICY, SOURCE_PROMPT, TokenTrajectory


def test_group_advantages_vectors():
    r = [1.0, 0.0, 0.0, 1.0]
    assert group_advantages(r, "grpo") == pytest.approx([0.8660, -0.8660, -0.8660, 0.8660], abs=1e-4)
    assert group_advantages(r, "dr_grpo") == pytest.approx([0.5, -0.5, -0.5, 0.5])
    assert group_advantages(r, "rloo") == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3], abs=1e-4)
    # RLOO equals r_i minus the mean of the others
    r2 = [3.0, 1.0, 0.0, 2.0]
    loo = [r2[i] - (sum(r2) - r2[i]) / 3 for i in range(4)]
    assert group_advantages(r2, "rloo") == pytest.approx(loo)


def test_equal_rewards_give_zero_advantage():
    for est in ("grpo", "dr_grpo", "rloo"):
        assert group_advantages([0.7] * 5, est) == pytest.approx([0.0] * 5)


def test_overlong_penalty_vectors():
    assert overlong_penalty(16384, 20480, 4096) == 0.0
    assert overlong_penalty(18432, 20480, 4096) == pytest.approx(-0.5)
    assert overlong_penalty(20480, 20480, 4096) == pytest.approx(-1.0)
    assert overlong_penalty(30000, 20480, 4096) == -1.0


def _batch(logp_old, adv, mask_rows):
    """One-token-per-position batch where position 0 is the (untrained) first token."""
    b, t = len(mask_rows), len(mask_rows[0])
    src = torch.tensor([[SOURCE_POLICY if m else SOURCE_PROMPT for m in row] for row in mask_rows])
    return Batch(
        input_ids=torch.zeros((b, t), dtype=torch.long), attention_mask=torch.ones((b, t), dtype=torch.long),
        source=src, weight=torch.ones((b, t)), old_logprobs=torch.tensor(logp_old, dtype=torch.float),
        ref_logprobs=None, advantages=torch.tensor(adv, dtype=torch.float), rewards=torch.zeros(b), size=b)


@pytest.mark.parametrize("eps_high,expect_grad", [(0.28, True), (0.2, False)])
def test_clip_higher(eps_high, expect_grad):
    obj = PolicyGradientObjective(clip_low=0.2, clip_high=eps_high)
    b = _batch([[0.0, 0.0]], [[0.0, 1.0]], [[0, 1]])
    logp = torch.tensor([[math.log(1.25)]], requires_grad=True)  # ρ = 1.25 at the policy position
    loss, _ = obj.per_token_loss(logp, b)
    total = obj.aggregate(loss, b.loss_mask())
    total.backward()
    assert (logp.grad.abs().item() > 0) == expect_grad


def test_aggregation_weights():
    # two sequences with 1 and 3 policy tokens, A = 1, ratio 1: d loss / d logp per token
    mask = [[0, 1, 0, 0], [0, 1, 1, 1]]
    b = _batch([[0.0] * 4] * 2, [[1.0] * 4] * 2, mask)
    expected = {"token_mean": [[0.25, 0, 0], [0.25, 0.25, 0.25]],
                "seq_mean_token_mean": [[0.5, 0, 0], [1 / 6, 1 / 6, 1 / 6]]}
    for agg, want in expected.items():
        obj = PolicyGradientObjective(aggregation=agg)
        logp = torch.zeros((2, 3), requires_grad=True)
        loss, _ = obj.per_token_loss(logp, b)
        (obj.aggregate(loss, b.loss_mask()) / obj.denominator(b)).backward()
        assert (-logp.grad).flatten().tolist() == pytest.approx([x for row in want for x in row])


def test_masked_positions_have_zero_gradient_and_kl():
    obj = PolicyGradientObjective(kl_coef=0.5, kl_estimator="k3")
    b = _batch([[0.0, -1.0, -2.0]], [[0.0, 2.0, -1.0]], [[0, 1, 0]])
    b.ref_logprobs = torch.tensor([[0.0, -0.5, -0.1]])
    logp = torch.tensor([[-0.9, -1.7]], requires_grad=True)
    loss, st = obj.per_token_loss(logp, b)
    (obj.aggregate(loss, b.loss_mask())).backward()
    assert logp.grad[0, 1].item() == 0.0  # env/prompt position
    assert logp.grad[0, 0].item() != 0.0
    d = -0.5 - (-0.9)
    assert st["kl"][0, 0].item() == pytest.approx(math.exp(d) - d - 1)


def _tt(reward, n_policy, termination="done", group="g"):
    src = [SOURCE_PROMPT] + [SOURCE_POLICY] * n_policy + [SOURCE_ENV]
    return TokenTrajectory(ids=list(range(len(src))), source=src, turn=[0] * len(src), weight=[1.0] * len(src),
                           reward=reward, termination=termination, group=group)


def test_assign_advantages_broadcast_and_drop_equal():
    tts = [_tt(1.0, 2), _tt(0.0, 3), _tt(0.0, 1), _tt(1.0, 2), _tt(0.5, 1, group="h"), _tt(0.5, 2, group="h")]
    kept, m = assign_advantages(tts, "grpo", drop_equal_groups=True)
    assert len(kept) == 4 and m["equal_reward_groups"] == 1
    a = kept[0].advantages
    assert a[0] == 0.0 and a[-1] == 0.0 and a[1] == pytest.approx(0.8660, abs=1e-4)


def test_termination_policy_is_explicit():
    tts = [_tt(1.0, 2, "length"), _tt(1.0, 2, "env_error"), _tt(1.0, 2, "done"), _tt(1.0, 2, "max_turns")]
    out = apply_termination_policy(tts, {"max_turns": "drop"})
    assert [t.termination for t in out] == ["length", "env_error", "done"]
    assert out[0].reward == 0.0  # length -> zero_reward by default
    assert all(w == 0.0 for w in out[1].weight)  # env_error -> mask
    assert out[2].reward == 1.0


def test_eaft_weights_and_gradient():
    # 20 equal top logits -> w = 1
    logits = torch.zeros((1, 1, 50))
    logits[..., :20] = 5.0
    assert eaft_weights(logits, 20, 1.0).item() == pytest.approx(1.0, abs=1e-5)
    # one dominant logit -> w ≈ 0
    logits = torch.zeros((1, 1, 50))
    logits[..., 3] = 50.0
    assert eaft_weights(logits, 20, 1.0).item() < 1e-6
    # alpha = 0 -> plain SFT weights
    assert eaft_weights(torch.randn(2, 3, 40), 20, 0.0).flatten().tolist() == pytest.approx([1.0] * 6)
    # the gate is gradient-free: grad of w*CE equals w * grad CE
    lg = torch.randn(1, 1, 30, requires_grad=True)
    target = torch.tensor([[4]])
    w = eaft_weights(lg, 20, 1.0)
    (w * torch.nn.functional.cross_entropy(lg.transpose(1, 2), target, reduction="none")).sum().backward()
    g1 = lg.grad.clone()
    lg2 = lg.detach().clone().requires_grad_(True)
    torch.nn.functional.cross_entropy(lg2.transpose(1, 2), target, reduction="none").sum().backward()
    torch.testing.assert_close(g1, w.detach().unsqueeze(-1) * lg2.grad)


def test_sft_loss_is_token_mean_ce_over_policy_tokens_only():
    torch.manual_seed(0)
    logits = torch.randn(1, 4, 7)
    ids = torch.tensor([[1, 2, 3, 4]])
    src = torch.tensor([[SOURCE_PROMPT, SOURCE_POLICY, SOURCE_ENV, SOURCE_POLICY]])
    b = Batch(ids, torch.ones_like(ids), src, torch.ones(1, 4), torch.zeros(1, 4), None, torch.zeros(1, 4),
              torch.zeros(1), 1)
    obj = SFTObjective()
    model = FixedLogits(logits.clone())
    loss, _ = obj.loss_sum(model, b)
    lp = torch.log_softmax(logits, -1)
    want = -(lp[0, 0, 2] + lp[0, 2, 4]) / 2  # tokens 1 and 3 are policy, predicted from positions 0 and 2
    assert (loss / obj.denominator(b)).item() == pytest.approx(want.item(), abs=1e-6)
    loss.backward()
    assert model.logits.grad[0, 1].abs().sum().item() == 0.0  # position predicting an env token


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_a_non_finite_reward_becomes_env_error_with_zero_weight_and_leaves_the_baseline(bad):
    tts = [_tt(1.0, 2, group="a"), _tt(bad, 2, group="a"), _tt(0.0, 2, group="a"),
           _tt(1.0, 2, group="b"), _tt(0.0, 2, group="b")]
    kept, m = assign_advantages(tts, "grpo")
    assert m["nonfinite_rewards"] == 1 and len(kept) == 5
    bad_t = kept[1]
    assert bad_t.termination == "env_error" and all(w == 0.0 for w in bad_t.weight)
    assert all(a == 0.0 for a in bad_t.advantages)
    # the rest of group a is judged against its finite members only: rewards [1, 0] -> ±0.7071 (unbiased std)
    assert kept[0].advantages[1] == pytest.approx(0.7071, abs=1e-4)
    assert kept[2].advantages[1] == pytest.approx(-0.7071, abs=1e-4)
    assert all(math.isfinite(a) for t in kept for a in t.advantages)
    for est in ("dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"):
        kept, m = assign_advantages([_tt(1.0, 2, group="a"), _tt(bad, 2, group="a"), _tt(0.0, 2, group="b"),
                                     _tt(1.0, 2, group="b")], est)
        assert m["nonfinite_rewards"] == 1 and all(math.isfinite(a) for t in kept for a in t.advantages), est


def test_sft_loss_and_gradients_from_selected_positions_equal_the_full_computation(tiny_model, tiny_tok,
                                                                                   home_experts):
    """The LM head runs only where a trained token is predicted; loss and gradients are unchanged."""
    from trajtune.algorithms.batch import collate
    from trajtune.chat.render import ChatRenderer, RenderConfig

    r = ChatRenderer(tiny_tok, RenderConfig(train_on="last"))
    b = collate([r.render(t) for t in home_experts[:3]], tiny_tok.pad_token_id)
    obj = SFTObjective()
    loss, metrics = obj.loss_sum(tiny_model, b)
    loss.backward()
    got = {n: p.grad.clone() for n, p in tiny_model.named_parameters() if p.grad is not None}
    tiny_model.zero_grad()
    full = tiny_model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits[:, :-1].float()
    ce = torch.nn.functional.cross_entropy(full.transpose(1, 2), b.input_ids[:, 1:], reduction="none")
    want = (ce * b.loss_mask() * b.weight[:, 1:]).sum()
    want.backward()
    assert loss.item() == pytest.approx(want.item(), rel=1e-5)
    assert metrics["tokens"] == float(b.loss_mask().sum()) and metrics["tokens"] < b.loss_mask().numel() / 4
    for n, p in tiny_model.named_parameters():
        if p.grad is not None:
            assert torch.allclose(got[n], p.grad, atol=1e-6), n


def test_token_logprobs_from_selected_positions_equal_the_full_computation(tiny_model, tiny_tok, home_experts):
    """RL, DPO and the reference model get log-probs only where a policy token is predicted: equal to
    the full-vocabulary computation there (values and gradients), 0 elsewhere."""
    from trajtune.algorithms.batch import collate, token_logprobs
    from trajtune.chat.render import ChatRenderer

    r = ChatRenderer(tiny_tok)
    tts = [r.render(t) for t in home_experts[:3]]
    tts[1].weight = [0.0] * len(tts[1])  # a row without trained tokens still gets its policy log-probs
    b = collate(tts, tiny_tok.pad_token_id)
    policy = (b.source[:, 1:] == SOURCE_POLICY).float()
    logp, _ = token_logprobs(tiny_model, b, temperature=0.7)
    (logp * policy).sum().backward()
    got = {n: p.grad.clone() for n, p in tiny_model.named_parameters() if p.grad is not None}
    tiny_model.zero_grad()
    full, logits = token_logprobs(tiny_model, b, temperature=0.7, return_logits=True)
    assert logits.shape[-1] == tiny_model.config.vocab_size
    (full * policy).sum().backward()
    torch.testing.assert_close(logp * policy, full * policy, rtol=1e-5, atol=1e-5)
    assert bool((policy[1] > 0).any()) and bool((logp[1] != 0).any())
    outside = (b.source[:, 1:] != SOURCE_POLICY).all(0)  # positions no row predicts a policy token from
    assert bool(outside.any()) and bool((logp[:, outside] == 0).all())
    for n, p in tiny_model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(got[n], p.grad, rtol=1e-4, atol=1e-6)
