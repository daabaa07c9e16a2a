"""Determinism, exact resume after a kill, atomic checkpoints (docs/architecture.md, contracts 3 and 5)."""

from __future__ import annotations

from pathlib import Path

import torch

from trajtune.algorithms.sft import SFTObjective
from trajtune.chat.render import ChatRenderer
from trajtune.experience import DatasetSource
from trajtune.learner import Learner, LearnerConfig, set_seed
from trajtune.models.loading import load_model


def _learner(tiny_dir, tiny_tok, tts, out: Path, stop_after=None, steps=6) -> Learner:
    set_seed(0)
    model = load_model(str(tiny_dir))
    cfg = LearnerConfig(steps=steps, lr=3e-3, warmup_steps=2, micro_batch_size=2, save_every=3, seed=0)
    return Learner(model, tiny_tok, SFTObjective(), DatasetSource(tts, 4, seed=0), cfg, out, stop_after=stop_after)


def _weights(learner: Learner) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in learner.accelerator.unwrap_model(learner.model).state_dict().items()}


def test_kill_and_resume_equals_uninterrupted(tmp_path, tiny_dir, tiny_tok, home_experts):
    tts = ChatRenderer(tiny_tok).render_many(home_experts[:12]) if hasattr(ChatRenderer, "render_many") else \
        [ChatRenderer(tiny_tok).render(t) for t in home_experts[:12]]
    full = _learner(tiny_dir, tiny_tok, tts, tmp_path / "full")
    full.fit()
    want = _weights(full)

    killed = _learner(tiny_dir, tiny_tok, tts, tmp_path / "resumed", stop_after=4)
    killed.fit()  # "killed" after step 4: only the step-3 checkpoint exists
    assert killed.step == 4
    ckpts = sorted(p.name for p in (tmp_path / "resumed" / "checkpoints").iterdir())
    assert ckpts == ["step-000003"]  # no temp directories left behind

    fresh = _learner(tiny_dir, tiny_tok, tts, tmp_path / "resumed")
    assert fresh.resume() == 3
    fresh.fit()
    got = _weights(fresh)
    assert want.keys() == got.keys()
    for k in want:
        assert torch.equal(want[k], got[k]), k
    # metrics were not duplicated by the replayed step 4
    steps = [__import__("json").loads(l)["step"] for l in (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_same_seed_same_weights_and_training_moves_them(tmp_path, tiny_dir, tiny_tok, home_experts):
    tts = [ChatRenderer(tiny_tok).render(t) for t in home_experts[:8]]
    a = _learner(tiny_dir, tiny_tok, tts, tmp_path / "a", steps=3)
    a.fit()
    b = _learner(tiny_dir, tiny_tok, tts, tmp_path / "b", steps=3)
    b.fit()
    init = load_model(str(tiny_dir)).state_dict()
    wa, wb = _weights(a), _weights(b)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert any(not torch.equal(wa[k], init[k]) for k in wa)


def test_gradient_accumulation_matches_full_batch(tmp_path, tiny_dir, tiny_tok, home_experts):
    """Micro-batches of 1 and one batch of 4 accumulate the same gradient (exact token-mean normalisation)."""
    tts = [ChatRenderer(tiny_tok).render(t) for t in home_experts[:4]]
    grads, losses = [], []
    for micro in (1, 4):
        set_seed(0)
        model = load_model(str(tiny_dir), dtype="float32")
        cfg = LearnerConfig(steps=1, lr=1e-2, micro_batch_size=micro, schedule="constant", max_grad_norm=1e9)
        lr_ = Learner(model, tiny_tok, SFTObjective(), DatasetSource(tts, 4, seed=0), cfg, tmp_path / f"m{micro}")
        captured = {}
        lr_.optimizer.step = lambda: captured.update(
            {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})
        losses.append(lr_.train_step(tts)["loss"])
        grads.append(captured)
    assert losses[0] == __import__("pytest").approx(losses[1], rel=1e-5)
    for k in grads[0]:
        torch.testing.assert_close(grads[0][k], grads[1][k], atol=1e-6, rtol=1e-4)


def test_checkpoint_is_a_loadable_model_dir(tmp_path, tiny_dir, tiny_tok, home_experts):
    tts = [ChatRenderer(tiny_tok).render(t) for t in home_experts[:4]]
    lr_ = _learner(tiny_dir, tiny_tok, tts, tmp_path / "c", steps=4)
    lr_.fit()
    ck = lr_.save_checkpoint()
    m = load_model(str(ck))
    w = _weights(lr_)
    for k, v in m.state_dict().items():
        assert torch.equal(v, w[k])


def test_length_grouping_and_gradient_checkpointing_keep_the_gradient(tmp_path, tiny_dir, tiny_tok, home_experts):
    """Both only change how the step is computed: micro-batches of similar length (less padding) and
    activations recomputed in the backward pass. The accumulated gradient stays the same."""
    import pytest

    tts = [ChatRenderer(tiny_tok).render(t) for t in home_experts[:8]]
    assert len({len(t) for t in tts}) > 2
    grads, padded = {}, {}
    for name, group, ckpt in [("plain", False, False), ("grouped", True, False), ("checkpointed", False, True)]:
        set_seed(0)
        model = load_model(str(tiny_dir), dtype="float32", gradient_checkpointing=ckpt)
        assert model.is_activation_checkpointing == ckpt
        cfg = LearnerConfig(steps=1, lr=1e-2, micro_batch_size=2, schedule="constant", max_grad_norm=1e9,
                            group_by_length=group)
        lr_ = Learner(model, tiny_tok, SFTObjective(), DatasetSource(tts, 8, seed=0), cfg, tmp_path / name)
        padded[name] = sum(len(mb) * max(len(t) for t in mb) for mb in lr_._micro_batches(tts))
        captured = {}
        lr_.optimizer.step = lambda: captured.update(
            {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})
        lr_.train_step(tts)
        grads[name] = captured
    # home_experts[:8] sorted by length pack into fewer padded tokens than in data order
    assert padded["grouped"] < padded["plain"] == padded["checkpointed"]
    for name in ("grouped", "checkpointed"):
        assert grads[name].keys() == grads["plain"].keys() and grads["plain"]
        for k in grads["plain"]:
            torch.testing.assert_close(grads[name][k], grads["plain"][k], atol=1e-6, rtol=1e-4)
    with pytest.raises(Exception):  # noqa: B017 - a config typo is refused, not ignored
        from trajtune.config import TrainSpec

        TrainSpec(gradient_checkpoint=True)


def test_gradient_checkpointing_with_lora_trains_the_adapter(tiny_dir, tiny_tok, home_experts):
    """With frozen embeddings no input of a checkpointed layer requires grad, which has cost adapters
    their gradients in some checkpointing setups: the adapter must still get one."""
    from trajtune.algorithms.batch import collate
    from trajtune.models.loading import LoraConfig

    model = load_model(str(tiny_dir), dtype="float32", lora=LoraConfig(r=4, target_modules=["q_proj", "v_proj"]),
                       gradient_checkpointing=True)
    model.train()
    b = collate([ChatRenderer(tiny_tok).render(t) for t in home_experts[:2]], tiny_tok.pad_token_id)
    loss, _ = SFTObjective().loss_sum(model, b)
    loss.backward()
    lora_grads = [p.grad for n, p in model.named_parameters() if "lora_" in n and p.requires_grad]
    assert lora_grads and all(g is not None for g in lora_grads)
    assert any(float(g.abs().sum()) > 0 for g in lora_grads)
