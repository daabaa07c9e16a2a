"""The tiny-model factory produces a normal HF directory loaded through the same from_pretrained path."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from trajtune.chat.render import SOURCE_POLICY, ChatRenderer, message_to_template_dict
from trajtune.models.loading import ModelLoadError, load_model, load_tokenizer


def test_auto_classes_load_the_tiny_dir(tiny_dir):
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert model.config.model_type == "qwen2"
    assert tok.eos_token == "<|im_end|>" and tok.chat_template
    out = model(input_ids=torch.tensor([[1, 2, 3]]))
    assert out.logits.shape == (1, 3, len(tok))


def test_tokenizer_is_lossless_and_entities_are_single_tokens(tiny_tok):
    for text in ["Turn on the lamp in the attic.", 'x = {"a": [1, 2]}  \n\ttabs', "ünïcödé → 😀", ""]:
        assert tiny_tok.decode(tiny_tok(text, add_special_tokens=False)["input_ids"]) == text
    # entities are single tokens: with their leading space in prose, bare inside JSON strings
    for word in ["cellar", "kitchen", "lamp", "blinds"]:
        assert len(tiny_tok(" " + word, add_special_tokens=False)["input_ids"]) == 1
        ids = tiny_tok('{"room": "' + word + '"}', add_special_tokens=False)["input_ids"]
        assert tiny_tok.convert_tokens_to_ids(word) in ids


def test_generation_markers_agree_with_provenance(tiny_tok, home_experts):
    traj = home_experts[2]
    msgs = [message_to_template_dict(m) for m in traj.messages]
    enc = tiny_tok.apply_chat_template(msgs, tools=[t.to_openai() for t in traj.tools], tokenize=True,
                                       return_dict=True, return_assistant_tokens_mask=True)
    tt = ChatRenderer(tiny_tok).render(traj)
    masked = [i for i, m in zip(enc["input_ids"], enc["assistant_masks"]) if m]
    assert masked == [i for i, s in zip(tt.ids, tt.source) if s == SOURCE_POLICY]


def test_missing_and_non_model_paths_are_clear_errors(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="not a saved Hugging Face model"):
        load_tokenizer(str(tmp_path / "empty"))


def test_to_device_moves_the_model_and_a_device_the_machine_lacks_is_a_usage_error():
    import torch

    from trajtune.errors import UsageError
    from trajtune.models.loading import to_device

    layer = torch.nn.Linear(2, 2)
    assert to_device(layer, "cpu") is layer and layer.weight.device.type == "cpu"
    assert to_device(layer).weight.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(UsageError, match="cannot run the model on --device 'nodevice'"):
        to_device(layer, "nodevice")
