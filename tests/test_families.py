"""Eleven more template families, written from real templates (tests/chat_fixtures.py has the table of
their quirks): exact policy tokens per assistant turn, or a clear refusal where a template truly
cannot be trained.

Expected texts come from ``chat_fixtures.EXPECT`` (written from each family's format, independently
of the renderer). Families without a native call format get their calls as Hermes text; their
expectation is the family's own rendering of a turn whose content holds that text. LFM2, whose
template never reads ``tool_calls``, gets its calls written into the content in its own syntax.
"""

from __future__ import annotations

import pytest
from chat_fixtures import (
    EXPECT,
    NEW_FAMILIES,
    _hermes_calls,
    cohere_ids,
    conversation,
    policy_texts,
    rollout_text,
    tokenizer_for,
)

from trajtune.chat.doctor import check_template
from trajtune.chat.render import SOURCE_POLICY, ChatRenderer, RenderConfig, RenderError
from trajtune.schema import Message

TRAINABLE = [n for n in NEW_FAMILIES if n != "deepseek_r1"]


def expected_turns(name: str, traj, renderer: ChatRenderer) -> list[str]:
    fam = NEW_FAMILIES[name]
    want = []
    for m in traj.messages:
        if m.role != "assistant":
            continue
        if not fam.native_tools:  # calls written as Hermes text into the content
            m = Message(role="assistant", content=m.text() + _hermes_calls(m.text(), m.tool_calls or []),
                        reasoning_content=m.reasoning_content)
        want.append(EXPECT[name](m, cohere_ids(traj)) if name == "command_r7b" else EXPECT[name](m))
    if fam.name == "command_r7b":  # the stop token, never the always-appended header
        assert all(w.endswith("<|END_OF_TURN_TOKEN|>") for w in want)
    return want


@pytest.mark.parametrize("name", TRAINABLE)
def test_policy_tokens_are_exactly_each_assistant_turn(name):
    fam = NEW_FAMILIES[name]
    tok = tokenizer_for(name)
    r = ChatRenderer(tok, RenderConfig(non_prefix="split"))
    uses_native = fam.native_tools and not fam.calls_in_content
    # a template that reads calls only from the content gets them in its own syntax (LFM2: "lfm2")
    assert r.tool_format == ("native" if uses_native else fam.parser if fam.calls_in_content else "hermes")
    assert r.parser == (fam.parser if fam.native_tools else "hermes")
    assert r.eots == [fam.eot] + ([fam.eot_call] if fam.eot_call and uses_native else [])
    traj = conversation()
    samples = r.render_samples(traj)
    assert len(samples) == (1 if fam.prefix_stable else 4)
    assert policy_texts(tok, samples) == expected_turns(name, traj, r)
    eot_ids = {tok.convert_tokens_to_ids(e) for e in r.eots}
    for s in samples:
        s.check()
        assert s.ids[-1] in eot_ids and s.source[-1] == SOURCE_POLICY and s.weight[-1] == 1.0
        assert all((w > 0) == (src == SOURCE_POLICY) for w, src in zip(s.weight, s.source))


@pytest.mark.parametrize("name", TRAINABLE)
def test_doctor_passes_with_split_and_declares_adaptations(name):
    fam = NEW_FAMILIES[name]
    report = check_template(tokenizer_for(name), config=RenderConfig(non_prefix="split"))
    assert report.ok, report.format_text()
    notes = " ".join(report.adaptations)
    if fam.system_role == "refused":
        assert "folded into the first user turn" in notes
    if fam.tool_role == "refused":
        assert "tool results are rendered as user turns" in notes
    if fam.content == "parts":
        assert "list of text parts" in notes
    if not fam.native_tools:
        assert report.tool_format == "hermes" and "does not render" in report.get("tool_format").detail
    elif fam.calls_in_content:
        assert report.tool_format == fam.parser
        assert "only from the assistant content" in report.get("tool_format").detail


@pytest.mark.parametrize("name", [n for n in TRAINABLE if NEW_FAMILIES[n].prefix_stable])
def test_rollout_text_path_equals_static_render(name):
    """prompt_text + turns + observation_text (how rollouts build sequences) == render()."""
    tok = tokenizer_for(name)
    r = ChatRenderer(tok)
    traj = conversation()
    tt = r.render(traj)
    assert rollout_text(r, traj, policy_texts(tok, [tt])) == tok.decode(tt.ids, skip_special_tokens=False)


def test_glm_turns_end_with_the_next_role_token_which_rollouts_stop_on():
    tok = tokenizer_for("glm45")
    r = ChatRenderer(tok, RenderConfig(non_prefix="split"))
    assert r.closer_appended and r.eots == ["<|user|>", "<|observation|>"]
    assert r.stop_ids() == [tok.convert_tokens_to_ids("<|user|>"), tok.convert_tokens_to_ids("<|observation|>")]
    traj = conversation(two_users=False)
    hist = traj.messages[:4]  # ... the call turn, then its result
    obs = r.observation_text(hist, traj.tools, 3)
    # the sampled call turn already ends with <|observation|>: the observation text starts after it
    assert not obs.startswith("<|observation|>") and '"temp": 21' in obs and obs.endswith("<|assistant|>")


def test_gpt_oss_analysis_dropped_from_history_is_kept_in_each_sample():
    """The template drops an earlier turn's analysis once an answer follows; each sample keeps the prompt
    the model really saw (with the analysis of the call turn before it)."""
    tok = tokenizer_for("gpt_oss")
    r = ChatRenderer(tok, RenderConfig(non_prefix="split"))
    samples = r.render_samples(conversation(two_users=False))
    answer = tok.decode(samples[1].ids, skip_special_tokens=False)
    assert "<|channel|>analysis<|message|>The user wants the weather.<|end|>" in answer
    assert answer.endswith("<|channel|>final<|message|>It is 21 °C and sunny in Zürich.<|return|>")


def test_deepseek_r1_is_refused_with_the_reason():
    tok = tokenizer_for("deepseek_r1")
    r = ChatRenderer(tok, RenderConfig(non_prefix="split"))
    with pytest.raises(RenderError, match=r"ends with .*<think>.*cannot be recovered from this template"):
        r.render_samples(conversation())
    report = check_template(tok, config=RenderConfig(non_prefix="split"))
    assert not report.ok and "cannot be recovered" in report.get("render").detail
