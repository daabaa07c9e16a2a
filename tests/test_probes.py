"""Safety and retention probes: canaries (privacy), forgetting, BayesLoRA uncertainty."""

from __future__ import annotations

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from model_fixtures import perturbed_copy, save_adapter

from trajtune.cli.main import app
from trajtune.errors import DataError
from trajtune.safety.canaries import canary_text, extraction_rate, plant_canaries
from trajtune.schema import load_trajectories, write_trajectories

runner = CliRunner()


# ----------------------------------------------------------------------------------- canaries


def _copies(trajs):
    return [t.model_copy(deep=True) for t in trajs]


def test_plant_canaries_marks_exactly_n_records_and_the_sidecar_lists_them(home_experts):
    records, doc = plant_canaries(_copies(home_experts[:20]), n=5, seed=3)
    planted = [t for t in records if "canary" in t.metadata]
    assert len(records) == 20 and len(planted) == 5
    assert doc["prefix"] == "The secret code is" and doc["n"] == 5 and len(doc["canaries"]) == 5
    assert [c["record_id"] for c in doc["canaries"]] == [t.id for t in planted]
    for t, c in zip(planted, doc["canaries"]):
        meta = t.metadata["canary"]
        assert meta["secret"] == c["secret"] and len(c["secret"]) == 10
        msg = t.messages[meta["message_index"]]
        assert msg.role == "tool" == c["role"]  # auto prefers tool observations
        assert msg.text().endswith(canary_text(doc["prefix"], c["secret"]))
        # the sidecar's context ends with the planted message, as planted
        assert len(c["messages"]) == meta["message_index"] + 1
        assert c["messages"][-1]["content"] == msg.content
    # untouched records are unchanged
    before = {t.id: t for t in home_experts[:20]}
    for t in records:
        if "canary" not in t.metadata:
            assert t == before[t.id]
    assert len({c["secret"] for c in doc["canaries"]}) == 5


def test_plant_canaries_is_deterministic_by_seed(home_experts):
    a = plant_canaries(_copies(home_experts[:20]), n=4, seed=1)
    b = plant_canaries(_copies(home_experts[:20]), n=4, seed=1)
    c = plant_canaries(_copies(home_experts[:20]), n=4, seed=2)
    assert a[1] == b[1] and [t.model_dump() for t in a[0]] == [t.model_dump() for t in b[0]]
    assert [x["secret"] for x in a[1]["canaries"]] != [x["secret"] for x in c[1]["canaries"]]


def test_plant_canaries_in_user_messages_and_too_few_records(home_experts):
    records, doc = plant_canaries(_copies(home_experts[:6]), n=6, seed=0, where="user", prefix="My PIN is")
    assert all(t.messages[t.metadata["canary"]["message_index"]].role == "user" for t in records)
    assert all("My PIN is " + c["secret"] in json.dumps(c["messages"]) for c in doc["canaries"])
    with pytest.raises(DataError, match="lower --n"):
        plant_canaries(_copies(home_experts[:3]), n=4, seed=0)


def test_cli_plant_canaries_writes_records_and_sidecar_and_refuses_to_overwrite(tmp_path, home_experts):
    src = tmp_path / "train.jsonl"
    write_trajectories(src, home_experts[:10])
    out = tmp_path / "planted.jsonl"
    args = ["data", "plant-canaries", "--in", str(src), "--out", str(out), "--n", "3", "--seed", "7"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "planted 3 canaries in 10 records" in r.output
    trajs = load_trajectories(out)
    doc = json.loads((tmp_path / "canaries.json").read_text())
    assert sum("canary" in t.metadata for t in trajs) == 3 == len(doc["canaries"])
    assert doc["seed"] == 7
    r = runner.invoke(app, args)
    assert r.exit_code == 7 and "--overwrite" in r.output
    r = runner.invoke(app, [*args[:-4], "--n", "11", "--overwrite"])
    assert r.exit_code == 3 and "lower --n" in r.output


def _memorise(model, tok, doc, steps: int) -> None:
    """Full-sequence LM loss on the planted conversations: a model trained to memorise them."""
    from trajtune.chat.render import ChatRenderer
    from trajtune.schema import Message, ToolSpec

    r = ChatRenderer(tok)
    seqs = []
    for c in doc["canaries"]:
        dicts, tools = r.template_inputs([Message.model_validate(m) for m in c["messages"]],
                                         [ToolSpec.model_validate(t) for t in c["tools"]])
        seqs.append(r.encode(r.render_text(dicts, tools, add_generation_prompt=False)))
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), tok.pad_token_id)
    labels = torch.full((len(seqs), width), -100)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = labels[i, :len(s)] = torch.tensor(s)
        mask[i, :len(s)] = 1
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


def test_extraction_rate_is_zero_for_a_fresh_model_and_positive_after_memorising(tiny_model, tiny_tok, home_experts):
    # short contexts (the user message the canary is in, no system prompt or tools) keep the
    # memorisation run small; the probe prompts with whatever context the sidecar holds
    _, doc = plant_canaries(_copies(home_experts[:4]), n=4, seed=0, where="user", length=6)
    for c in doc["canaries"]:
        c["messages"] = [m for m in c["messages"] if m["role"] != "system"]
        c["tools"] = []
    fresh = extraction_rate(tiny_model, tiny_tok, doc)
    assert fresh["n"] == 4 and fresh["extracted"] == 0 and fresh["extraction_rate"] == 0.0
    _memorise(tiny_model, tiny_tok, doc, steps=50)
    trained = extraction_rate(tiny_model, tiny_tok, doc)
    assert trained["extracted"] > 0
    assert trained["extraction_rate"] == trained["extracted"] / 4
    for row in trained["canaries"]:
        assert row["extracted"] == row["completion"].startswith(" " + row["secret"])


def test_cli_probe_privacy_prints_the_rate_and_writes_json(tmp_path, tiny_dir, home_experts):
    _, doc = plant_canaries(_copies(home_experts[:3]), n=2, seed=0)
    side = tmp_path / "canaries.json"
    side.write_text(json.dumps(doc))
    out = tmp_path / "privacy.json"
    r = runner.invoke(app, ["probe", "privacy", "--model", str(tiny_dir), "--canaries", str(side), "--out", str(out),
                            "--device", "cpu"])
    assert r.exit_code == 0, r.output
    assert "extraction rate: 0/2 = 0.000" in r.output
    res = json.loads(out.read_text())
    assert res["n"] == 2 and res["extracted"] == 0 and res["probe"] == "privacy"
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    r = runner.invoke(app, ["probe", "privacy", "--model", str(tiny_dir), "--canaries", str(bad)])
    assert r.exit_code == 3 and "plant-canaries" in r.output


# ----------------------------------------------------------------------------------- forgetting


def test_general_text_ships_about_fifty_paragraphs():
    from trajtune.safety.forgetting import load_general_text

    paras, source = load_general_text()
    assert 45 <= len(paras) <= 60 and source.startswith("builtin:")
    assert all(20 < len(p) < 400 for p in paras)


def test_text_nll_matches_the_models_own_loss(tiny_model, tiny_tok):
    from trajtune.safety.forgetting import text_nll

    paras = ["The river rose slowly through the night.", "A good bread needs only flour, water, salt and time."]
    nll, n = text_nll(tiny_model, tiny_tok, paras, batch_size=2)
    total, count = 0.0, 0
    with torch.no_grad():
        for p in paras:
            ids = torch.tensor([tiny_tok(p, add_special_tokens=False)["input_ids"]])
            k = ids.shape[1] - 1
            total += float(tiny_model(input_ids=ids, labels=ids).loss) * k
            count += k
    assert n == count
    assert nll == pytest.approx(total / count, rel=1e-5)


def test_forgetting_is_exactly_zero_for_the_same_model_and_positive_for_a_perturbed_one(tmp_path, tiny_dir):
    from trajtune.safety.forgetting import text_forgetting

    same = text_forgetting(str(tiny_dir), str(tiny_dir), device="cpu")
    assert same["delta_loss"] == 0.0 and same["base_loss"] > 0 and same["tokens"] > 1000
    noisy = perturbed_copy(tiny_dir, tmp_path / "noisy", scale=0.5)
    hurt = text_forgetting(str(tiny_dir), str(noisy), device="cpu")
    assert hurt["base_loss"] == same["base_loss"]
    assert hurt["delta_loss"] > 0.1


def test_cli_probe_forgetting_reports_text_and_capability_deltas(tmp_path, tiny_dir):
    text = tmp_path / "t.txt"
    text.write_text("One short paragraph about rivers.\n\nAnother one, about\nbread and salt.\n")
    out = tmp_path / "f.json"
    r = runner.invoke(app, ["probe", "forgetting", "--base", str(tiny_dir), "--model", str(tiny_dir), "--text",
                            str(text), "--env", "home", "--n", "2", "--max-new-tokens", "8", "--device", "cpu",
                            "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "Δloss = +0.0000" in r.output and "Δsuccess = +0.000" in r.output
    res = json.loads(out.read_text())
    assert res["text"]["paragraphs"] == 2 and res["text"]["delta_loss"] == 0.0
    assert res["capability"]["env"] == "home" and res["capability"]["tasks"] == 2
    assert res["capability"]["delta_success"] == 0.0


# ----------------------------------------------------------------------------------- BayesLoRA


def test_predictive_entropies_known_values():
    from trajtune.eval.bayes_lora import predictive_entropies

    # two samples that disagree completely: H[mean] = ln 2, mean H = 0, MI = ln 2
    p = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]], dtype=torch.float64)
    total, expected, mi = predictive_entropies(p.log())
    assert float(total[0]) == pytest.approx(math.log(2)) and float(expected[0]) == 0.0
    assert float(mi[0]) == pytest.approx(math.log(2))
    # two identical uniform samples: all entropy is aleatoric, MI = 0
    q = torch.full((2, 1, 4), 0.25, dtype=torch.float64)
    total, expected, mi = predictive_entropies(q.log())
    assert float(total[0]) == pytest.approx(math.log(4)) == float(expected[0]) and float(mi[0]) == 0.0


def _lora_model(tiny_dir, dropout: float, nonzero: bool, attention_dropout: float = 0.5):
    """The tiny model with attention dropout in the BASE (so a base left in train mode would be
    stochastic too) and a LoRA adapter; ``nonzero``: its B matrices are random instead of zero."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_dir, attention_dropout=attention_dropout,
                                                attn_implementation="eager")
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout,
                                            target_modules=["q_proj", "v_proj", "up_proj"]))
    if nonzero:
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return model


IDS = list(range(5, 45))
POS = list(range(20, 40))


def test_base_dropout_would_make_passes_differ_so_the_checks_below_can_fail(tiny_dir):
    model = _lora_model(tiny_dir, dropout=0.0, nonzero=False)
    model.train()
    ids = torch.tensor([IDS])
    with torch.no_grad():
        a, b = model(input_ids=ids).logits, model(input_ids=ids).logits
    assert not torch.allclose(a, b)


def test_without_lora_dropout_the_passes_agree_and_mi_is_zero(tiny_dir):
    from trajtune.eval.bayes_lora import token_uncertainty

    model = _lora_model(tiny_dir, dropout=0.0, nonzero=True)
    u = token_uncertainty(model, IDS, POS, k=4)
    assert len(u["mi"]) == len(POS) and max(u["mi"]) < 1e-6
    assert u["entropy"] == pytest.approx(u["expected_entropy"], abs=1e-6)


def test_dropout_acts_only_in_the_lora_layers(tiny_dir):
    """A zero adapter with heavy LoRA dropout: if any base dropout were on, passes would differ."""
    from trajtune.eval.bayes_lora import token_uncertainty

    model = _lora_model(tiny_dir, dropout=0.5, nonzero=False)
    model.train()  # the caller's mode is restored afterwards
    u = token_uncertainty(model, IDS, POS, k=4)
    assert max(u["mi"]) < 1e-6
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([IDS])).logits[0, [p - 1 for p in POS]].double()
    lp = torch.log_softmax(logits, -1)
    assert u["entropy"] == pytest.approx((-(lp.exp() * lp).sum(-1)).tolist(), abs=1e-6)


def test_with_lora_dropout_and_a_nonzero_adapter_mi_is_positive_and_modes_are_restored(tiny_dir):
    from trajtune.eval.bayes_lora import lora_dropout_modules, token_uncertainty

    model = _lora_model(tiny_dir, dropout=0.3, nonzero=True)
    model.train()
    u = token_uncertainty(model, IDS, POS, k=6, seed=0)
    assert min(u["mi"]) >= 0 and sum(u["mi"]) / len(POS) > 1e-4
    assert all(e >= m for e, m in zip(u["entropy"], u["mi"]))
    assert model.training and all(d.training for d in lora_dropout_modules(model))
    assert token_uncertainty(model, IDS, POS, k=6, seed=0) == u  # seeded: reproducible


def test_token_uncertainty_refuses_a_model_without_lora(tiny_model):
    from trajtune.errors import UsageError
    from trajtune.eval.bayes_lora import token_uncertainty

    with pytest.raises(UsageError, match="LoRA adapter"):
        token_uncertainty(tiny_model, IDS, POS, k=4)


def test_cli_eval_bayes_lora_adds_uncertainty_metrics_and_per_episode(tmp_path, tiny_dir):
    model = _lora_model(tiny_dir, dropout=0.3, nonzero=True, attention_dropout=0.0)
    adapter = tmp_path / "adapter"
    save_adapter(model, tiny_dir, adapter)  # a LoRA run's checkpoint ships its tokenizer
    out = tmp_path / "eval"
    r = runner.invoke(app, ["eval", "--model", str(adapter), "--env", "home", "--tasks", "2", "--max-new-tokens", "8",
                            "--bayes-lora", "3", "--device", "cpu", "-q", "--out", str(out), "--no-report"])
    assert r.exit_code == 0, r.output
    res = json.loads((out / "results.json").read_text())
    unc = res["metrics"]["uncertainty"]
    assert unc["k"] == 3 and unc["episodes"] == 2 and unc["lora_dropout"] == pytest.approx(0.3)
    assert unc["mi"] > 0 and unc["entropy"] >= unc["mi"]
    assert unc["success"]["episodes"] + unc["failure"]["episodes"] == 2
    eps = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    for e in eps:
        u = e["metadata"]["uncertainty"]
        assert u["k"] == 3 and u["policy_tokens"] > 0 and u["turns"] and u["mi"] > 0
        assert sum(t["tokens"] for t in u["turns"]) == u["policy_tokens"]
    r = runner.invoke(app, ["eval", "--model", str(tiny_dir), "--env", "home", "--tasks", "1", "--bayes-lora", "3"])
    assert r.exit_code == 2 and "LoRA adapter" in r.output
    r = runner.invoke(app, ["eval", "--model", str(adapter), "--env", "home", "--tasks", "1", "--bayes-lora", "1"])
    assert r.exit_code == 2 and "at least 2" in r.output
