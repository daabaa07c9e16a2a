"""Shared fixtures: a tiny model made locally (never downloaded), and expert data from ``home``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def home_experts():
    from trajtune.envs import make_env

    env = make_env("home")
    return [env.expert(t) for t in env.tasks("train", 64, seed=0)]


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory, home_experts) -> Path:
    """A nano Qwen2 model + byte-level BPE tokenizer with the ChatML tool template, saved as an HF dir."""
    from trajtune.chat.render import message_to_template_dict, tools_to_template
    from trajtune.models.tiny import build_tokenizer, create_tiny_model

    probe = build_tokenizer(["probe"], vocab_size=300)
    texts = [probe.apply_chat_template([message_to_template_dict(m) for m in t.messages],
                                       tools=tools_to_template(t.tools), tokenize=False) for t in home_experts]
    return create_tiny_model(tmp_path_factory.mktemp("tiny") / "model", texts, vocab_size=512, preset="nano", seed=0)


@pytest.fixture(scope="session")
def talker(tiny_dir, tmp_path_factory) -> Path:
    """The tiny model trained to answer in a short word and end its turn (``wire_fixtures.train_talker``),
    so its episodes in ``wire_envs`` environments get mixed rewards."""
    from wire_fixtures import train_talker

    return train_talker(tiny_dir, tmp_path_factory.mktemp("talker"))


@pytest.fixture(scope="session")
def tiny_tok(tiny_dir):
    from trajtune.models.loading import load_tokenizer

    return load_tokenizer(str(tiny_dir))


@pytest.fixture()
def tiny_model(tiny_dir):
    from trajtune.models.loading import load_model

    return load_model(str(tiny_dir))


@pytest.fixture()
def turns_end(monkeypatch):
    """The untrained tiny model seldom ends a turn by itself (a turn cut at max_new_tokens never reaches
    the environment): its sampled turns end with a stop token in place of their last token."""
    from trajtune.generation import CachedSampler

    class Ending(CachedSampler):
        def turn(self, rows, max_new, seed):
            stop = min(self.stops)
            return [(ids[:-1] + [stop], lps, True, cache) for ids, lps, _, cache in super().turn(rows, max_new, seed)]

    monkeypatch.setattr("trajtune.generation.CachedSampler", Ending)
