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
