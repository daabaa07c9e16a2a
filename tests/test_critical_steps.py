"""Critical-step SFT (ATLaS): selected turns carry loss, the others stay in context (ALGORITHMS.md)."""

from __future__ import annotations

import json

import pytest
import torch

from trajtune.algorithms.critical_steps import (
    JudgeSelector,
    heuristic_points,
    parse_critical,
    select_critical,
    select_heuristic,
)
from trajtune.config import CriticalSteps
from trajtune.errors import ConfigError, DataError
from trajtune.schema import Message, ToolCall, ToolSpec, Trajectory


def _call(cid: str, name: str, text: str | None = None, reward: float | None = None, **args) -> Message:
    return Message(role="assistant", content=text, reward=reward,
                   tool_calls=[ToolCall(id=cid, name=name, arguments=args)])


def _obs(cid: str, text: str) -> Message:
    return Message(role="tool", tool_call_id=cid, name="t", content=text, origin="environment")


def _traj() -> Trajectory:
    return Trajectory(id="lamp", tools=[ToolSpec(name="read"), ToolSpec(name="turn_on")], messages=[
        Message(role="user", content="Switch the lamp on."),
        _call("a", "read", "First I will check the lamp, then switch it on.", device="lamp"),  # 1
        _obs("a", "lamp: off"),
        _call("b", "read", device="lamp"),                                                    # 3
        _obs("b", "lamp: off"),
        _call("c", "turn_on", device="lmap"),                                                 # 5
        _obs("c", "Error: unknown device 'lmap'"),
        _call("d", "turn_on", reward=1.0, device="lamp"),                                     # 7
        _obs("d", "ok"),
        Message(role="assistant", content="The lamp is on."),                                 # 9
    ])


def test_heuristic_points_and_the_target_ratio():
    t = _traj()
    # 1: plan (first turn) 2 + new tool 1; 3: a repeat, 0; 5: new tool 1; 7: self-correction 3 +
    # reward 3; 9: the answer after tool results 1
    assert heuristic_points(t) == {1: 3.0, 3: 0.0, 5: 1.0, 7: 6.0, 9: 1.0}
    assert select_heuristic(t, 0.2) == {7}
    assert select_heuristic(t, 0.3) == {7, 1}          # ceil(1.5) = 2
    assert select_heuristic(t, 0.6) == {7, 1, 5}       # the tie 5 / 9 goes to the earlier turn
    assert select_heuristic(Trajectory(id="x", messages=[Message(role="user", content="hi")]), 0.3) == set()


def test_selection_composes_with_train_flags_and_error_masking():
    from trajtune.algorithms.error_mask import mask_error_turns

    spec = CriticalSteps(ratio=0.6)
    (out,), counts = select_critical([_traj()], spec, "all")
    assert {i for i, m in enumerate(out.messages) if m.train} == {1, 5, 7}
    assert counts == {"turns": 5, "selected": 3, "ratio": 0.6}
    masked, _ = mask_error_turns(_traj(), "all")  # turn 5 drew an error
    (both,), counts = select_critical([masked], spec, "hint")
    assert {i for i, m in enumerate(both.messages) if m.train} == {1, 7}
    nothing = _traj()
    for m in nothing.messages:
        m.train = False if m.role == "assistant" else None
    with pytest.raises(DataError, match="selected no trainable turn"):
        select_critical([nothing], spec, "hint")


def test_unselected_turns_get_no_gradient_but_stay_in_the_context(tiny_model, tiny_tok):
    from trajtune.algorithms.batch import collate
    from trajtune.algorithms.sft import SFTObjective
    from trajtune.chat.render import ChatRenderer, RenderConfig

    renderer = ChatRenderer(tiny_tok, RenderConfig(train_on="hint"))
    (sel,), _ = select_critical([_traj()], CriticalSteps(ratio=0.2), "all")  # only turn 7 (assistant turn 3)
    tt = renderer.render(sel)
    b = collate([tt], tiny_tok.pad_token_id)
    logits = tiny_model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits.float()
    logits.retain_grad()

    class Fixed:  # the objective on these very logits, so the gradient w.r.t. them can be read
        def __call__(self, **kw):
            return type("O", (), {"logits": logits})()

    loss, _ = SFTObjective().loss_sum(lambda **kw: Fixed()(**kw), b)
    loss.backward()
    grad = logits.grad[0].abs().sum(-1)  # per position
    trained = {k for k, w in enumerate(tt.weight) if w > 0}
    assert trained and {tt.turn[k] for k in trained} == {3}
    for k in range(1, len(tt)):  # position k-1 predicts token k: a gradient only where k is trained
        assert (float(grad[k - 1]) > 0) == (k in trained)
    # removing an unselected turn (the failed call and its error) from the context changes the loss
    short = sel.model_copy(deep=True)
    del short.messages[5:7]
    b2 = collate([renderer.render(short)], tiny_tok.pad_token_id)
    with torch.no_grad():
        l1 = float(SFTObjective().loss_sum(tiny_model, b)[0]) / SFTObjective().denominator(b)
        l2 = float(SFTObjective().loss_sum(tiny_model, b2)[0]) / SFTObjective().denominator(b2)
    assert SFTObjective().denominator(b) == SFTObjective().denominator(b2)  # the same trained tokens
    assert abs(l1 - l2) > 1e-6


def test_judge_replies_are_parsed_and_failures_fall_back_to_the_heuristic():
    assert parse_critical('Sure.\n```json\n{"critical": [2, 4], "reason": "x"}\n```', 5) == {2, 4}
    for bad in ("turns 2 and 4", '{"critical": [0]}', '{"critical": [9]}', '{"critical": []}',
                '{"critical": ["2"]}', '{"critical": [true]}'):
        with pytest.raises(ValueError):
            parse_critical(bad, 5)
    replies = iter(['{"critical": [4, 5]}', "I cannot decide", '{"critical": [1]}'])
    seen = []

    def complete(body):
        seen.append(body)
        return {"choices": [{"message": {"role": "assistant", "content": next(replies)}}]}

    sel = JudgeSelector(complete, "m", 0.3)
    out, counts = select_critical([_traj(), _traj(), _traj()], CriticalSteps(ratio=0.3), "all", sel)
    assert [{i for i, m in enumerate(t.messages) if m.train} for t in out] == [{7, 9}, {7, 1}, {1}]
    assert counts["judge_failures"] == 1 and counts["selected"] == 5
    prompt = seen[0]["messages"][1]["content"]
    assert "[turn 3]" in prompt and "Error: unknown device" in prompt and "about 30%" in seen[0]["messages"][0]["content"]

    def down(body):
        raise ConnectionError("refused")

    _, counts = select_critical([_traj()], CriticalSteps(ratio=0.3), "all", JudgeSelector(down, "m", 0.3))
    assert counts["judge_failures"] == 1 and counts["selected"] == 2  # never a crash: the heuristic's pick


def test_config_checks_and_an_sft_run_through_an_http_judge(tmp_path, tiny_dir, home_experts):
    from test_judge import FakeJudgeServer

    from trajtune.algorithms.sft import SFTRunConfig
    from trajtune.config import load_config
    from trajtune.schema import write_trajectories
    from trajtune.train import run

    with pytest.raises(Exception, match="needs data.critical_steps.judge"):
        CriticalSteps(selector="judge")
    base = [f"model={tiny_dir}", "output_dir=o", "data.path=d.jsonl"]
    with pytest.raises(ConfigError, match="only apply to selector: judge"):
        load_config(None, SFTRunConfig, base + ["data.critical_steps={judge: 'openai:http://x/v1'}"])
    data = tmp_path / "d.jsonl"
    write_trajectories(data, home_experts[:4])
    srv = FakeJudgeServer(['{"critical": [1]}', "garbage"])
    try:
        out = tmp_path / "run"
        res = run(load_config(None, SFTRunConfig, [f"model={tiny_dir}", f"output_dir={out}", f"data.path={data}",
                                                    f"data.critical_steps={{selector: judge, judge: 'openai:{srv.url}'}}",
                                                    "train.steps=1", "train.batch_size=2", "report=false"]), quiet=True)
    finally:
        srv.close()
    turns = sum(1 for t in home_experts[:4] for m in t.messages if m.role == "assistant")
    assert res["critical_steps"]["turns"] == turns and res["critical_steps"]["judge_failures"] == 2
    assert len(srv.requests) == 4
    assert json.loads((out / "result.json").read_text())["critical_steps"]["selected"] >= 4
