"""``rollout.vllm`` (trajtune.vllm_backend) against a stand-in ``vllm`` (tests/fake_vllm.py) that
behaves as vLLM 0.34's source says and records every call: token ids in and out, log-probs mapped
to the sampled tokens, turns ending only at the stop ids or the length, multi-turn episodes, the
weights pushed after every update (full and LoRA), the log-prob check, sleep mode, and the
config's refusals. The stand-in samples with the weights trajtune pushed to it and nothing else,
so a push that is wrong shows as episodes the learner would not sample (tests/test_vllm_gpu.py
runs the same on real vLLM, skipped without it and a CUDA GPU)."""

from __future__ import annotations

import copy
import json
import math
import sys
from pathlib import Path

import pytest
import torch

import fake_vllm
from wire_envs import REPLY_USER, Reply
from wire_fixtures import train_talker

from sampler_fixtures import home_prompts, policy_logprob_gap
from trajtune.algorithms.registry import load_run_config
from trajtune.algorithms.rl import RLRunConfig
from trajtune.chat.render import ChatRenderer
from trajtune.config import ConfigError, RolloutSpec, load_config
from trajtune.errors import ServerError
from trajtune.generation import SAMPLER_HOOK, CachedSampler
from trajtune.models.loading import load_model
from trajtune.envs.base import StepResult
from trajtune.rollout import RolloutConfig, run_rollouts
from trajtune.schema import Message
from trajtune.tokens import SOURCE_POLICY
from trajtune.train import run
from trajtune import vllm_backend as vb


@pytest.fixture(scope="module")
def talker(tiny_dir, tmp_path_factory) -> Path:
    return train_talker(tiny_dir, tmp_path_factory.mktemp("talker"))


@pytest.fixture()
def fake(monkeypatch):
    return fake_vllm.install(monkeypatch)


def _rl_cfg(model, out, *extra):
    return load_config(None, RLRunConfig, [f"model={model}", f"output_dir={out}", "env=home",
                                            "rollout.max_turns=2", "rollout.max_new_tokens=16",
                                            "rollout.max_length=512", "rl.tasks_per_step=2", "rl.group_size=4",
                                            "rl.n_train_tasks=8", "train.steps=2", "train.lr=3e-3", "report=false",
                                            "rollout.vllm={}", *extra])


def _engine(model, tmp_path, **rollout):
    spec = RolloutSpec.model_validate({"max_length": 512, "vllm": {}, **rollout})
    return vb.VLLMEngine.start(spec.vllm, spec, model, tmp_path / "vllm", seed=0)


# -- selecting the backend ---------------------------------------------------------------------------

def test_selecting_vllm_without_vllm_importable_is_a_config_error_with_the_install_hint(tiny_dir, tmp_path,
                                                                                        monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    out = tmp_path / "rl"
    with pytest.raises(ConfigError, match=r"pip install 'trajtune\[vllm\]'") as e:
        run(_rl_cfg(tiny_dir, out), quiet=True)
    assert e.value.exit_code == 2
    assert not out.exists()  # refused before anything is written


def test_selecting_vllm_without_a_gpu_is_a_config_error(tiny_dir, tmp_path, monkeypatch):
    fake_vllm.install(monkeypatch, cuda=False)
    with pytest.raises(ConfigError, match="needs a CUDA GPU"):
        run(_rl_cfg(tiny_dir, tmp_path / "rl"), quiet=True)
    assert not (tmp_path / "rl").exists()


def test_the_engine_starts_in_process_from_the_learners_config_without_weights_or_tokenizer(
        fake, tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    _engine(tiny_model, tmp_path)
    (llm,) = fake_vllm.LLM.instances
    assert llm.multiprocessing_env == "0"  # in-process while it is built ...
    import os

    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"  # ... and the user's setting back afterwards
    assert llm.files == ["config.json"] and llm.config.architectures == ["Qwen2ForCausalLM"]
    assert llm.kwargs == dict(skip_tokenizer_init=True, load_format="dummy", dtype="float32", seed=0,
                              gpu_memory_utilization=0.3, max_model_len=512, enforce_eager=False,
                              enable_sleep_mode=False, generation_config="vllm", logprobs_mode="processed_logprobs")
    _engine(tiny_model, tmp_path, top_p=0.9, temperature=1.0)  # top-p: the raw log-probs are the objective's
    assert fake_vllm.LLM.instances[-1].kwargs["logprobs_mode"] == "raw_logprobs"
    with pytest.raises(ConfigError, match="max_position_embeddings"):
        _engine(tiny_model, tmp_path, max_length=4096)


# -- one turn: token ids in and out -----------------------------------------------------------------

def test_a_turn_sends_token_ids_and_stores_the_sampled_ids_with_their_own_log_probs(fake, tiny_model, tiny_tok,
                                                                                    tmp_path):
    engine = _engine(tiny_model, tmp_path)
    stops = ChatRenderer(tiny_tok).stop_ids()
    prompts = home_prompts(tiny_tok, 3)
    sampler = engine.sampler(tiny_model.eval(), tiny_tok, 0.8, 1.0, stops)
    got = sampler.turn([(None, p) for p in prompts], [12, 12, 3], seed=5)
    llm = fake_vllm.LLM.instances[0]
    assert [r[0] for r in llm.requests] == prompts  # token ids, as rendered (no text, no re-tokenization)
    for (ids, sp), (out_ids, lps, ended, sent), room in zip(llm.requests, got, [12, 12, 3]):
        assert (sp.max_tokens, sp.temperature, sp.top_p, sp.top_k, sp.logprobs) == (room, 0.8, 1.0, 0, 0)
        assert sp.stop_token_ids == stops and sp.ignore_eos and not sp.detokenize and not sp.skip_special_tokens
        assert sent.ids == ids + out_ids and len(lps) == len(out_ids) <= room
        assert ended == (out_ids[-1] in stops) and (ended or len(out_ids) == room)
        assert all(lp > -100 for lp in lps)  # the sampled token's entry, not the decoy beside it
    assert len({sp.seed for _, sp in llm.requests}) == 3  # a seed per row: a group's prompts differ
    from trajtune.tokens import SOURCE_PROMPT, TokenTrajectory

    rows = [TokenTrajectory(ids=s.ids, source=[SOURCE_PROMPT] * len(p) + [SOURCE_POLICY] * len(i),
                            turn=[0] * len(s.ids), weight=[0.0] * len(p) + [1.0] * len(i), logprobs=[0.0] * len(p) + lp)
            for p, (i, lp, _, s) in zip(prompts, got)]
    assert policy_logprob_gap(tiny_model, rows, 0.8) < 1e-4  # vLLM holds the learner's weights (pushed before sampling)
    again = engine.sampler(tiny_model, tiny_tok, 0.8, 1.0, stops).turn([(None, p) for p in prompts], [12, 12, 3], 5)
    assert [g[0] for g in again] == [g[0] for g in got]  # same seed, same samples


def test_a_turn_ends_only_at_a_stop_id_or_the_length_and_anything_else_is_refused(fake, tiny_model, tiny_tok,
                                                                                 tmp_path, monkeypatch):
    engine = _engine(tiny_model, tmp_path)
    prompts = home_prompts(tiny_tok, 2)
    llm = fake_vllm.LLM.instances[0]
    llm.config.eos_token_id = None
    # greedy, with the token it picks first as the only stop id: every turn ends there, after one token
    first = engine.sampler(tiny_model.eval(), tiny_tok, 0.0, 1.0, [0]).turn([(None, prompts[0])], [6], 0)[0][0][0]
    (ids, lps, ended, _), = engine.sampler(tiny_model, tiny_tok, 0.0, 1.0, [first]).turn([(None, prompts[0])], [6], 0)
    assert ids == [first] and ended
    # the model's end-of-sequence token is not a stop id: vLLM must not stop there (ignore_eos)
    llm.config.eos_token_id = first
    (ids, _, ended, _), = engine.sampler(tiny_model, tiny_tok, 0.0, 1.0, [10**6 - 1]).turn([(None, prompts[0])],
                                                                                          [6], 0)
    assert len(ids) == 6 and not ended and ids[0] == first

    def stops_early(prompt, sp):  # a vLLM that ends a turn at something trajtune did not ask for
        out = fake_vllm.LLM._sample(llm, prompt, sp)
        out.token_ids = out.token_ids[:2]
        out.logprobs = out.logprobs[:2]
        return out

    monkeypatch.setattr(llm, "_sample", stops_early)
    with pytest.raises(ServerError, match="did not stop at exactly a stop id or the length"):
        engine.sampler(tiny_model, tiny_tok, 0.0, 1.0, [10**6 - 1]).turn([(None, prompts[0])], [6], 0)

    def no_logprob(prompt, sp):
        out = fake_vllm.LLM._sample(llm, prompt, sp)
        out.logprobs[0] = {out.token_ids[0] + 1: fake_vllm.Logprob(-1.0)}
        return out

    monkeypatch.setattr(llm, "_sample", no_logprob)
    with pytest.raises(ServerError, match="no finite log-probability for sampled token 0"):
        engine.sampler(tiny_model, tiny_tok, 0.0, 1.0, [10**6 - 1]).turn([(None, prompts[0])], [6], 0)


class Again(Reply):
    """``Reply`` that never ends on a reply: each turn is answered with another request (max_turns ends it)."""

    max_turns = 3

    def step(self, action: Message) -> StepResult:
        self.reply = action.text()
        return StepResult(observations=[Message(role="user", content=REPLY_USER)], reward=0.0, done=False)


def test_multi_turn_episodes_through_vllm_are_the_cached_samplers_under_greedy_decoding(fake, talker, tiny_tok,
                                                                                        tmp_path):
    cfg = RolloutConfig(max_turns=3, max_new_tokens=12, max_length=512, temperature=0.0, batch_size=4)
    tasks = Again().tasks("test", 3)
    here = run_rollouts(load_model(str(talker)), tiny_tok, Again, tasks, cfg)
    model = load_model(str(talker))
    engine = _engine(model, tmp_path)
    setattr(model, SAMPLER_HOOK, engine.sampler)  # as attach() installs it: run_rollouts picks it up itself
    there = run_rollouts(model, tiny_tok, Again, tasks, cfg)
    assert [e.tokens.ids for e in there] == [e.tokens.ids for e in here]
    assert [e.tokens.source for e in there] == [e.tokens.source for e in here]
    assert [e.tokens.termination for e in there] == [e.tokens.termination for e in here] == ["max_turns"] * 3
    assert all(e.turns == 3 for e in there)
    for a, b in zip(there, here):
        assert max(abs(x - y) for x, y in zip(a.tokens.logprobs, b.tokens.logprobs)) < 1e-4
    llm = fake_vllm.LLM.instances[0]
    assert len(llm.requests) == 9 and [e[0] for e in llm.events].count("generate") == 3  # a batch per turn
    for k in range(9):  # each turn is sent the episode's whole history, exactly its recorded token ids
        ids, ep = llm.requests[k][0], there[k % 3].tokens
        assert ids == ep.ids[:len(ids)] and ep.source[len(ids)] == SOURCE_POLICY
        if k >= 3:
            assert len(ids) > len(llm.requests[k - 3][0])
    assert [e[0] for e in llm.events].count("reload_weights") == 1  # pushed once: the weights did not change


# -- weights follow the learner -----------------------------------------------------------------------

def test_full_weights_are_pushed_under_hugging_face_names_with_the_tied_head_once(tiny_model):
    pushed = dict(vb.policy_weights(tiny_model))
    state = tiny_model.state_dict()
    assert "lm_head.weight" not in pushed and tiny_model.config.tie_word_embeddings
    assert set(pushed) == set(state) - {"lm_head.weight"}
    assert all(torch.equal(pushed[k], state[k]) for k in pushed)


def test_lora_weights_are_pushed_merged_without_changing_the_trained_model(tiny_dir):
    from trajtune.models.loading import LoraConfig

    model = load_model(str(tiny_dir), lora=LoraConfig(r=4))
    with torch.no_grad():  # a trained adapter (B starts at zero)
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    pushed = dict(vb.policy_weights(model))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the model is untouched
    merged = copy.deepcopy(model).merge_and_unload().state_dict()
    assert set(pushed) == set(merged) - {"lm_head.weight"}
    assert all(torch.allclose(pushed[k], merged[k], atol=1e-6) for k in pushed)
    plain = load_model(str(tiny_dir)).state_dict()
    assert any(not torch.allclose(pushed[k], plain[k]) for k in pushed if "q_proj" in k)  # the adapter is in it


def test_rl_pushes_the_weights_after_every_update_and_samples_only_the_current_policy(fake, tiny_dir, tmp_path,
                                                                                       monkeypatch):
    from trajtune.learner import Learner

    gaps: list[float] = []
    original = Learner.train_step

    def checked(self, tts):  # the stored log-probs against the trainer's policy, before each update
        gaps.append(policy_logprob_gap(self.accelerator.unwrap_model(self.model), tts, 1.0))
        return original(self, tts)

    monkeypatch.setattr(Learner, "train_step", checked)
    out = tmp_path / "rl"
    # weight decay moves every weight each step, whatever the rewards (an untrained model's are all 0)
    run(_rl_cfg(tiny_dir, out, "train.steps=3", "train.lr=0.05", "train.weight_decay=0.5",
                "rollout.vllm.logprob_check.every=2"), quiet=True)
    assert len(gaps) == 3 and max(gaps) < 1e-4, gaps  # steps 2 and 3 sampled the updated policy
    (llm,) = fake_vllm.LLM.instances
    kinds = " ".join(e[0] for e in llm.events)
    steps = kinds.split("reload_weights ")[1:]
    assert kinds.startswith("reload_weights") and len(steps) == 3  # a push before each step's sampling ...
    assert all(s.strip().split(" ")[0] == "reset_prefix_cache" and set(s.split()[1:]) == {"generate"}
               for s in steps)  # ... with the prefix cache of the old weights dropped
    from safetensors.torch import load_file

    final = load_file(out / "final" / "model.safetensors")
    assert not all(torch.equal(llm.pushes[-1][k], final[k]) for k in llm.pushes[-1])  # the last update: unsampled
    for a, b in zip(llm.pushes, llm.pushes[1:]):  # each push holds that step's weights: the decayed ones changed
        assert all((a[k] - b[k]).abs().max() > 1e-3 for k in a if k.endswith("proj.weight"))
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    checks = [r.get("vllm/logprob_diff_max") for r in rows]
    assert checks[0] is not None and checks[1] is None and checks[2] is not None  # first step, then every 2
    assert max(c for c in checks if c is not None) < 1e-4 and rows[0]["vllm/logprob_check_tokens"] > 0
    assert all("vllm/sync_s" in r for r in rows)
    eps = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    assert [e["metadata"]["policy_version"] for e in eps] == [0] * 8 + [1] * 8 + [2] * 8


def test_rl_with_lora_samples_the_adapted_policy_through_vllm(fake, talker, tmp_path, monkeypatch):
    from trajtune.learner import Learner

    gaps: list[float] = []
    original = Learner.train_step

    def checked(self, tts):
        gaps.append(policy_logprob_gap(self.accelerator.unwrap_model(self.model), tts, 1.0))
        return original(self, tts)

    monkeypatch.setattr(Learner, "train_step", checked)
    # the talker's replies succeed or fail (wire_envs.Reply: parity), so the adapter gets gradients
    run(_rl_cfg(talker, tmp_path / "rl", "env=wire_envs:Reply", "rollout.max_turns=1", "train.steps=3",
                "train.lr=3e-2", "model.lora={r: 4}", "rollout.vllm.logprob_check.every=1"), quiet=True)
    assert len(gaps) == 3 and max(gaps) < 1e-4, gaps
    pushes = fake_vllm.LLM.instances[0].pushes
    assert not torch.allclose(pushes[0]["model.layers.0.self_attn.q_proj.weight"],
                              pushes[2]["model.layers.0.self_attn.q_proj.weight"])  # the trained adapter, merged


def test_a_resumed_run_pushes_its_checkpoint_before_sampling_and_ends_like_the_uninterrupted_one(
        fake, tiny_dir, tmp_path, capsys):
    common = ("train.save_every=1", "train.weight_decay=0.5", "train.lr=0.05", "rollout.vllm.logprob_check.every=1")
    run(_rl_cfg(tiny_dir, tmp_path / "whole", *common), quiet=True)
    run(_rl_cfg(tiny_dir, tmp_path / "k", *common), quiet=True, stop_after=1)
    capsys.readouterr()
    run(_rl_cfg(tiny_dir, tmp_path / "k", *common), quiet=False, resume=True)
    assert (tmp_path / "k" / "rollouts.jsonl").read_text() == (tmp_path / "whole" / "rollouts.jsonl").read_text()
    assert "vLLM log-prob check (policy after 1 updates)" in capsys.readouterr().err  # the checkpoint's policy
    whole, resumed = fake_vllm.LLM.instances[0], fake_vllm.LLM.instances[2]
    assert all(torch.equal(whole.pushes[1][k], resumed.pushes[0][k]) for k in whole.pushes[1])


def test_the_final_evaluation_samples_the_trained_policy_through_vllm(fake, tiny_dir, tmp_path):
    out = tmp_path / "rl"
    run(_rl_cfg(tiny_dir, out, "train.weight_decay=0.5", "train.lr=0.05", "eval={n_tasks: 2}"), quiet=True)
    (llm,) = fake_vllm.LLM.instances
    from safetensors.torch import load_file

    final = load_file(out / "final" / "model.safetensors")
    assert len(llm.pushes) == 3  # before step 1, before step 2, before the final evaluation
    assert all(torch.equal(llm.pushes[-1][k], final[k]) for k in llm.pushes[-1])
    assert llm.requests[-1][1].temperature == 0.0  # eval.temperature: greedy
    assert "success" in json.loads((out / "result.json").read_text())["eval"]
    assert sum(1 for ids, sp in llm.requests if sp.temperature == 0.0) >= 2  # both test tasks, through vLLM


# -- the log-prob check -------------------------------------------------------------------------------

def test_a_log_prob_gap_above_the_tolerance_stops_the_run_naming_it(fake, tiny_dir, tmp_path):
    fake_vllm.LLM.logprob_offset = 0.2  # a vLLM whose distribution is not the learner's
    with pytest.raises(ServerError, match=r"vLLM's log-probs differ from the learner's.*max \|Δ\| 0\.2") as e:
        run(_rl_cfg(tiny_dir, tmp_path / "rl"), quiet=True)
    assert e.value.exit_code == 8
    assert not (tmp_path / "rl" / "metrics.jsonl").exists()  # stopped before the first update


def test_the_gap_is_logged_and_tolerated_below_the_tolerance(fake, tiny_dir, tmp_path, capsys):
    fake_vllm.LLM.logprob_offset = 0.01
    run(_rl_cfg(tiny_dir, tmp_path / "rl", "train.steps=1"), quiet=False)
    rows = [json.loads(x) for x in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["vllm/logprob_diff_mean"] == pytest.approx(0.01, abs=1e-4)
    assert rows[0]["vllm/logprob_diff_max"] == pytest.approx(0.01, abs=1e-4)
    assert "vLLM log-prob check (policy after 0 updates): max |Δ| 0.01" in capsys.readouterr().err
    fake_vllm.LLM.logprob_offset = 0.01
    with pytest.raises(ServerError, match="above rollout.vllm.logprob_check"):  # a max that binds alone
        run(_rl_cfg(tiny_dir, tmp_path / "strict", "train.steps=1", "rollout.vllm.logprob_check.max_tolerance=0.005"),
            quiet=True)


def test_weights_that_do_not_reach_vllm_fail_the_check(fake, tiny_dir, tmp_path, monkeypatch):
    real = vb.policy_weights
    monkeypatch.setattr(vb, "policy_weights", lambda m: ((n, t) for n, t in real(m) if "layers.1." not in n))
    with pytest.raises(ServerError, match="vLLM samples another policy than the one trained"):
        run(_rl_cfg(tiny_dir, tmp_path / "rl"), quiet=True)


# -- sleep mode -----------------------------------------------------------------------------------------

def test_sleep_mode_frees_vllm_while_the_learner_trains_and_reloads_before_sampling(fake, tiny_dir, tmp_path):
    run(_rl_cfg(tiny_dir, tmp_path / "rl", "rollout.vllm.sleep=true", "rollout.vllm.logprob_check.every=1"),
        quiet=True)
    (llm,) = fake_vllm.LLM.instances
    assert llm.kwargs["enable_sleep_mode"] is True
    step = ["generate", "sleep"]  # the untrained model's turns end by length: one round per step
    assert [e[0] for e in llm.events] == ["reload_weights", "reset_prefix_cache", *step, "wake_up", "reload_weights",
                                          "wake_up", "reset_prefix_cache", *step]
    assert ("sleep", 2) in llm.events and ("wake_up", ("weights",)) in llm.events
    assert ("wake_up", ("kv_cache",)) in llm.events
    rows = [json.loads(x) for x in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["vllm/logprob_diff_max"] < 1e-4 for r in rows)  # level 2 discarded the weights; reloaded


# -- RFT and DPO mining -------------------------------------------------------------------------------

def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_rft_mines_its_attempts_through_vllm(fake, talker, tmp_path):
    out = tmp_path / "rft"
    cfg = load_run_config(None, [f"model={talker}", f"output_dir={out}", "report=false", "env=wire_envs:Reply",
                                 "rft={iterations: 2, n_tasks: 4, k: 4, per_task_quota: 2}",
                                 "rollout={max_turns: 1, max_new_tokens: 16, max_length: 256, vllm: true}",
                                 "train={steps: 4, batch_size: 2, micro_batch_size: 2}"], algorithm="rft")
    run(cfg, quiet=True)
    (llm,) = fake_vllm.LLM.instances
    assert len(llm.requests) == 32  # 2 iterations × 4 tasks × 4 attempts, all sampled by vLLM
    assert [e[0] for e in llm.events].count("reload_weights") == 2  # pushed when mining, not every step
    rows = _lines(out / "metrics.jsonl")
    assert rows[0]["mined/attempts"] == 16 and "vllm/logprob_diff_max" in rows[0]
    sampled = {tuple(ids) for ids, _ in llm.requests}
    assert len(sampled) == 1  # every attempt starts from the rendered prompt's token ids
    kept = _lines(out / "rft" / "iter-000.jsonl")
    assert rows[0]["mined/kept"] == len(kept)


def test_dpo_mines_pairs_from_vllm_samples_whose_log_probs_are_the_learners(fake, talker, tmp_path):
    out = tmp_path / "dpo"
    cfg = load_run_config(None, [f"model={talker}", f"output_dir={out}", "report=false", "env=wire_envs:Reply",
                                 "dpo={iterations: 1, n_tasks: 4, k: 4, reference: sampling}",
                                 "rollout={max_turns: 1, max_new_tokens: 16, max_length: 256, vllm: {}}",
                                 "train={steps: 1, batch_size: 2, micro_batch_size: 1}"], algorithm="dpo")
    run(cfg, quiet=True)
    rows = _lines(out / "metrics.jsonl")
    assert rows[0]["mined/pairs"] >= 1 and len(fake_vllm.LLM.instances[0].requests) == 16
    # the reference is vLLM's sampling log-probs: at step 1 they are the policy's, so the loss is −log σ(0)
    assert rows[0]["loss"] == pytest.approx(math.log(2), abs=1e-4)


# -- refused -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("extra, needle", [
    (["rollout.server=http://127.0.0.1:8000"], "rollout.vllm with rollout.server"),
    (["rollout.reuse_kv_cache=false"], "does nothing with rollout.vllm"),
    (["rollout.temperature=2.5"], "temperatures up to 2"),
    (["rollout.temperature=0.7", "rollout.top_p=0.9"], "needs rollout.temperature 0 or 1"),
    (["rl.async_rollouts=true"], "rl.async_rollouts with rollout.vllm"),
    (["rollout.vllm.max_model_len=256"], r"max_model_len \(256\) < rollout.max_length"),
    (["rollout.vllm.gpu_memory_utilization=1.5"], "less than or equal to 1"),
    (["rollout.vllm.tensor_parallel_size=2"], "unknown key"),
])
def test_vllm_settings_that_would_do_nothing_or_go_wrong_are_refused(tmp_path, extra, needle):
    with pytest.raises(ConfigError, match=needle):
        _rl_cfg("m", tmp_path, *extra)


def test_shorthands_and_what_else_is_refused(tmp_path, tiny_dir, monkeypatch):
    assert _rl_cfg("m", tmp_path, "rollout.vllm=true").rollout.vllm.gpu_memory_utilization == 0.3
    assert _rl_cfg("m", tmp_path, "rollout.vllm=false").rollout.vllm is None
    assert _rl_cfg("m", tmp_path, "rollout.top_p=0.9").rollout.top_p == 0.9  # temperature 1: allowed
    pairs = tmp_path / "pairs.jsonl"
    with pytest.raises(ConfigError, match="rollout.vllm does nothing with dpo.pairs"):
        load_run_config(None, ["model=m", f"output_dir={tmp_path}", f"dpo.pairs={pairs}", "rollout.vllm=true"],
                        algorithm="dpo")
    model = load_model(str(tiny_dir))
    setattr(model, SAMPLER_HOOK, lambda *a: None)  # a model with its own decoding (DualTune's)
    with pytest.raises(ConfigError, match="carries its own sampler"):
        vb.attach(None, _rl_cfg("m", tmp_path), model, tmp_path / "vllm")
    from trajtune import distributed as dist
    from trajtune.train import check_processes

    monkeypatch.setattr(dist, "world_size", lambda: 2)
    monkeypatch.setattr(dist, "timeout_s", lambda: 60.0)
    with pytest.raises(ConfigError, match="rollout.vllm with 2 processes is not supported"):
        check_processes(_rl_cfg("m", tmp_path))
