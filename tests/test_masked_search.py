"""masked_search (MaskSearch-style agentic CPT data): masked-word tasks from any text corpus, a
BM25 search tool over the same corpus, the masked word as the verifier."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from trajtune.cli.main import app
from trajtune.envs import make_env
from trajtune.envs.masked_search import MASK, passages
from trajtune.errors import EnvError

runner = CliRunner()
DOCS = {
    "a.txt": "Copper wires carry current between the transformer and the old pumping station near the river.\n\n"
             "The lighthouse keeper climbed ninety steps each evening to light the lantern for passing ships.",
    "b.md": "Glaciers carve deep valleys as they creep downhill over thousands of years, grinding the rock beneath.\n\n"
            "Every autumn the orchard workers gather apples into wooden crates stacked beside the barn door.\n\n"
            "A violin maker seasons spruce for a decade before carving the instrument's delicate top plate.\n\n"
            "Short line.",
}


@pytest.fixture()
def corpus(tmp_path):
    d = tmp_path / "docs"
    d.mkdir()
    for name, text in DOCS.items():
        (d / name).write_text(text)
    return str(d)


def test_tasks_mask_one_word_of_a_corpus_sentence_and_splits_use_different_passages():
    env = make_env("masked_search")
    ps = passages(None)
    train, test = env.tasks("train", 30, seed=0), env.tasks("test", 30, seed=0)
    for t in train + test:
        d = t.data
        assert d["masked"].count(MASK) == 1 and d["masked"].replace(MASK, d["answer"]) == d["sentence"]
        i = int(d["passage"][1:])
        assert d["sentence"] in ps[i] and (i % 5 == 4) == (t.split == "test")
        assert len(d["answer"]) >= 5
    assert not {t.data["passage"] for t in train} & {t.data["passage"] for t in test}


def test_search_finds_the_passage_and_only_the_right_word_succeeds(corpus):
    env = make_env("masked_search", corpus=corpus, top_k=2)
    assert len(passages(corpus)) == 5  # "Short line." has under 6 words
    task = env.tasks("train", 1, seed=0)[0]
    env.reset(task)
    hits = env.search(" ".join(re.findall(r"[A-Za-z]+", task.data["masked"].replace(MASK, ""))))
    assert len(hits) <= 2 and task.data["sentence"] in hits[0]["text"]
    env.submit_answer("wrong")
    assert not env.success()
    env.submit_answer(f" {task.data['answer'].upper()}. ")  # case and punctuation do not matter
    assert env.success()
    for t in env.tasks("train", 6, seed=2) + env.tasks("test", 3, seed=2):
        traj = make_env("masked_search", corpus=corpus).expert(t)
        assert traj.outcome.success, t.data
        assert traj.messages[-2].content == "answer recorded"


def test_bad_options_and_corpora_are_one_line_errors(tmp_path):
    with pytest.raises(EnvError, match="masked_search option colour"):
        make_env("masked_search", colour="red")
    with pytest.raises(EnvError, match="top_k"):
        make_env("masked_search", top_k=0)
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("Too short.\n\nAlso short here.")
    with pytest.raises(EnvError, match="no train passage"):
        make_env("masked_search", corpus=str(tiny)).tasks("train", 1)
    with pytest.raises(Exception, match="no such file"):
        make_env("masked_search", corpus=str(tmp_path / "missing"))


def test_generated_trajectories_train_as_continual_pretraining(tmp_path, corpus, tiny_dir):
    out = tmp_path / "cpt.jsonl"
    r = runner.invoke(app, ["data", "generate", "--env", "masked_search", "--env-arg", f"corpus={corpus}",
                            "--n", "4", "-o", str(out)])
    assert r.exit_code == 0, r.output
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(recs) == 4 and all(x["outcome"]["success"] for x in recs)
    assert {c["name"] for x in recs for m in x["messages"] for c in m.get("tool_calls") or []} == {"search",
                                                                                                   "submit_answer"}
    run_dir = tmp_path / "sft"
    cfg = tmp_path / "cpt.yaml"
    cfg.write_text(f"algorithm: sft\nmodel: {tiny_dir}\noutput_dir: {run_dir}\nreport: false\n"
                   f"data: {{path: {out}, train_on: all_tokens}}\ntrain: {{steps: 1, batch_size: 2}}\n")
    r = runner.invoke(app, ["sft", "--config", str(cfg), "--quiet"])
    assert r.exit_code == 0, r.output
    result = json.loads((run_dir / "result.json").read_text())
    assert result["train_records"] == 4
