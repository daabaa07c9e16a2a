"""``rollout.vllm`` with real vLLM on a CUDA GPU: a tiny Qwen2 model made here
(``trajtune.models.tiny``; vLLM 0.34 registers ``Qwen2ForCausalLM``), its turns sampled by vLLM
and their log-probs compared with the learner's, then RL runs (full weights, and LoRA with sleep
mode) whose log-prob check must stay within tolerance after every update.

Skipped where ``import vllm`` fails or torch sees no CUDA device: this project's CI has neither, so
these have not run there; tests/test_vllm_backend.py runs the same glue against a stand-in vllm.
The model is the ``micro`` preset (head size 32: vLLM's Triton attention, which also takes float32,
needs at least 32), float32 on both sides so the log-probs agree to float rounding."""

from __future__ import annotations

import gc
import json

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'trajtune[vllm]'); these need it and a GPU")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: real vLLM needs one", allow_module_level=True)

from trajtune.algorithms.batch import collate, token_logprobs  # noqa: E402
from trajtune.algorithms.rl import RLRunConfig  # noqa: E402
from trajtune.chat.render import ChatRenderer  # noqa: E402
from trajtune.config import RolloutSpec, load_config  # noqa: E402
from trajtune.envs import make_env  # noqa: E402
from trajtune.models.loading import load_model, load_tokenizer  # noqa: E402
from trajtune.tokens import SOURCE_POLICY, SOURCE_PROMPT, TokenTrajectory  # noqa: E402
from trajtune.train import run  # noqa: E402
from trajtune import vllm_backend as vb  # noqa: E402

VLLM = "{gpu_memory_utilization: 0.15, enforce_eager: true, logprob_check: {every: 1, tolerance: 0.001, " \
       "max_tolerance: 0.02}}"


@pytest.fixture(scope="module")
def micro_dir(tmp_path_factory, home_experts):
    from trajtune.chat.render import message_to_template_dict, tools_to_template
    from trajtune.models.tiny import build_tokenizer, create_tiny_model

    probe = build_tokenizer(["probe"], vocab_size=300)
    texts = [probe.apply_chat_template([message_to_template_dict(m) for m in t.messages],
                                       tools=tools_to_template(t.tools), tokenize=False) for t in home_experts]
    return create_tiny_model(tmp_path_factory.mktemp("micro") / "model", texts, vocab_size=512, preset="micro",
                             seed=0)


@pytest.fixture(autouse=True)
def _free_the_gpu():
    yield
    gc.collect()
    try:
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()
    except ImportError:
        torch.cuda.empty_cache()


def _rl_cfg(model, out, *extra):
    return load_config(None, RLRunConfig, [f"model={model}", f"output_dir={out}", "env=home",
                                            "rollout.max_turns=2", "rollout.max_new_tokens=16",
                                            "rollout.max_length=512", "rl.tasks_per_step=2", "rl.group_size=4",
                                            "rl.n_train_tasks=8", "train.steps=3", "train.lr=0.05",
                                            "train.weight_decay=0.5", "report=false", f"rollout.vllm={VLLM}",
                                            *extra])


def test_real_vllm_samples_turns_whose_log_probs_are_the_learners(micro_dir, tmp_path):
    tok = load_tokenizer(str(micro_dir))
    model = load_model(str(micro_dir)).cuda().eval()
    spec = RolloutSpec.model_validate({"max_length": 512, "vllm": {"gpu_memory_utilization": 0.15,
                                                                   "enforce_eager": True}})
    engine = vb.VLLMEngine.start(spec.vllm, spec, model, tmp_path / "vllm", seed=0)
    renderer, env = ChatRenderer(tok), make_env("home")
    stops = renderer.stop_ids()
    prompts = []
    for task in env.tasks("test", 4, seed=0):
        res = env.reset(task)
        prompts.append(renderer.encode(renderer.prompt_text(res.messages, res.tools)))
    for temperature in (1.0, 0.7, 0.0):
        got = engine.sampler(model, tok, temperature, 1.0, stops).turn([(None, p) for p in prompts],
                                                                         [16, 16, 16, 4], seed=3)
        rows = []
        for p, (ids, lps, ended, sent), room in zip(prompts, got, [16, 16, 16, 4]):
            assert sent.ids == p + ids and (ended or len(ids) == room) and len(lps) == len(ids)
            assert ended == (ids[-1] in stops) and not set(stops) & set(ids[:-1])
            rows.append(TokenTrajectory(ids=p + ids, source=[SOURCE_PROMPT] * len(p) + [SOURCE_POLICY] * len(ids),
                                        turn=[0] * (len(p) + len(ids)), weight=[0.0] * len(p) + [1.0] * len(ids),
                                        logprobs=[0.0] * len(p) + lps))
        b = collate(rows, 0).to("cuda")
        with torch.no_grad():
            lp, _ = token_logprobs(model, b, temperature if temperature > 0 else 1.0)
        mask = b.source[:, 1:] == SOURCE_POLICY
        gap = (lp - b.old_logprobs[:, 1:]).abs()[mask]
        assert float(gap.max()) < 1e-2 and float(gap.mean()) < 1e-3, (temperature, gap.max(), gap.mean())
    del engine


def test_real_vllm_rl_follows_the_policy_through_every_update(micro_dir, tmp_path):
    out = tmp_path / "rl"
    run(_rl_cfg(micro_dir, out), quiet=True)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3
    for r in rows:  # checked before every update (every: 1), within tolerance, or the run would have stopped
        assert r["vllm/logprob_check_tokens"] > 0 and r["vllm/logprob_diff_mean"] < 1e-3


def test_real_vllm_rl_with_lora_and_sleep_mode(micro_dir, tmp_path):
    out = tmp_path / "rl-lora"
    run(_rl_cfg(micro_dir, out, "model.lora={r: 8}", "rollout.vllm.sleep=true"), quiet=True)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(r["vllm/logprob_diff_mean"] < 1e-3 for r in rows)
