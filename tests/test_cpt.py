"""Agentic continual pre-training: data.train_on: all_tokens (every token of a conversation) and
data.format: text (plain-text corpora, packed)."""

from __future__ import annotations

import json

import pytest
import torch

from trajtune.errors import ConfigError, DataError


def test_all_tokens_weights_every_token_and_keeps_provenance(tiny_tok, home_experts):
    from trajtune.chat.render import ChatRenderer, RenderConfig

    t = home_experts[0]
    plain = ChatRenderer(tiny_tok, RenderConfig(train_on="all")).render(t)
    every = ChatRenderer(tiny_tok, RenderConfig(train_on="all_tokens")).render(t)
    assert every.ids == plain.ids and every.source == plain.source  # provenance is not rewritten
    assert set(every.weight) == {1.0}
    assert 0.0 in plain.weight  # plain SFT leaves prompt/tool tokens untrained


def _ce(logits: torch.Tensor, ids: torch.Tensor, keep: torch.Tensor) -> float:
    """Mean next-token cross-entropy over target positions where ``keep`` (an independent reference)."""
    ce = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:], reduction="none")
    return float(ce[keep[1:]].mean())


def test_sft_objective_trains_every_token_only_in_all_tokens_mode(tiny_model, tiny_tok, home_experts):
    from trajtune.algorithms.batch import collate
    from trajtune.algorithms.sft import SFTObjective
    from trajtune.chat.render import ChatRenderer, RenderConfig
    from trajtune.tokens import SOURCE_POLICY

    tt = ChatRenderer(tiny_tok, RenderConfig(train_on="all_tokens")).render(home_experts[1])
    b = collate([tt], tiny_tok.pad_token_id)
    with torch.no_grad():
        logits = tiny_model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits.float()
        every = torch.ones(len(tt), dtype=torch.bool)
        policy = torch.tensor([s == SOURCE_POLICY for s in tt.source])
        for obj, keep in ((SFTObjective(all_tokens=True), every), (SFTObjective(), policy)):
            loss, _ = obj.loss_sum(tiny_model, b)
            assert obj.denominator(b) == float(keep[1:].sum())
            assert float(loss) / obj.denominator(b) == pytest.approx(_ce(logits, b.input_ids, keep), rel=1e-4)


def test_documents_are_packed_with_eos_between_them(tmp_path, tiny_tok):
    from trajtune.algorithms.sft import pack_documents

    docs = ["get_state(room='attic') returned off", "set_device then reply Done.", "   "]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("\n".join(json.dumps({"text": d}) for d in docs) + "\n")
    tts, counts = pack_documents(str(corpus), tiny_tok, 16)
    eos = tiny_tok.eos_token_id
    stream = [i for d in docs[:2] for i in tiny_tok.encode(d, add_special_tokens=False) + [eos]]
    assert [i for t in tts for i in t.ids] == stream  # blank documents are skipped
    assert all(len(t) == 16 for t in tts[:-1]) and 2 <= len(tts[-1]) <= 16
    assert counts == {"train_records": len(tts), "documents": 2, "tokens": len(stream)}
    assert all(set(t.weight) == {1.0} for t in tts)


def test_text_inputs_and_their_errors(tmp_path):
    from trajtune.formats.text import iter_documents

    d = tmp_path / "corpus"
    d.mkdir()
    (d / "b.txt").write_text("second file")
    (d / "a.md").write_text("# first")
    (d / "skip.png").write_bytes(b"\x89PNG")
    assert [t for _, t in iter_documents(d)] == ["# first", "second file"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"content": "no text"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: .*string \"text\""):
        list(iter_documents(bad))
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "ok"}\n{"text": \n')
    with pytest.raises(DataError, match="broken.jsonl:2"):
        list(iter_documents(broken))
    latin = tmp_path / "l.txt"
    latin.write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(DataError, match="not UTF-8"):
        list(iter_documents(latin))


def test_configs_refuse_what_would_do_nothing(tiny_dir):
    from trajtune.algorithms.rft import RFTRunConfig
    from trajtune.algorithms.sft import SFTRunConfig
    from trajtune.config import load_config

    base = [f"model={tiny_dir}", "output_dir=o"]
    with pytest.raises(ConfigError, match="train_on: all_tokens"):
        load_config(None, SFTRunConfig, base + ["data.path=c.jsonl", "data.format=text"])
    with pytest.raises(ConfigError, match="mask_errors"):
        load_config(None, SFTRunConfig, base + ["data.path=c.jsonl", "data.train_on=all_tokens",
                                                "data.mask_errors=true"])
    with pytest.raises(ConfigError, match="sft option"):
        load_config(None, RFTRunConfig, base + ["env=home", "data.path=c.jsonl", "data.train_on=all_tokens"])


def test_a_cpt_run_on_a_text_corpus_lowers_its_loss(tmp_path, tiny_dir):
    from trajtune.algorithms.sft import SFTRunConfig
    from trajtune.config import load_config
    from trajtune.train import run

    corpus = tmp_path / "logs.jsonl"
    corpus.write_text("\n".join(json.dumps({"text": f"turn_on lamp in room {i % 3}: ok"}) for i in range(24)) + "\n")
    out = tmp_path / "cpt"
    res = run(load_config(None, SFTRunConfig, [f"model={tiny_dir}", f"output_dir={out}", f"data.path={corpus}",
                                               "data.format=text", "data.train_on=all_tokens", "data.max_length=32",
                                               "train.steps=12", "train.lr=3e-3", "train.batch_size=4",
                                               "train.schedule=constant"]), quiet=True)
    assert res["documents"] == 24 and res["train_records"] >= 8
    losses = [json.loads(x)["loss"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3
    page = (out / "report.html").read_text()
    assert "plain-text corpus" in page
