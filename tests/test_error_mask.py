"""Error-masked SFT: error turns stay in context with weight 0; later turns, the recovery included,
are trained (ALGORITHMS.md, Supervised objectives)."""

from __future__ import annotations

import json

import pytest

from trajtune.algorithms.error_mask import error_turns, mask_error_turns, observation_is_error
from trajtune.schema import Message, ToolCall, ToolSpec, Trajectory


def _call(cid: str, name: str, **args) -> Message:
    return Message(role="assistant", tool_calls=[ToolCall(id=cid, name=name, arguments=args)])


def _tool(cid: str, text: str, **extra) -> Message:
    return Message(role="tool", tool_call_id=cid, name="t", content=text, extra=extra)


def _traj() -> Trajectory:
    tools = [ToolSpec(name="turn_on"), ToolSpec(name="read")]
    return Trajectory(id="t1", tools=tools, messages=[
        Message(role="user", content="light the lamp"),
        _call("a", "turn_on", device="lmap"),                       # 1: drew an error
        _tool("a", "Error: no device named 'lmap'"),
        _call("b", "switch_on", device="lamp"),                     # 3: undeclared tool
        _tool("b", "unknown tool"),
        Message(role="assistant", content="x", extra={"parse_errors": ["not JSON"], "raw_text": "<tool_call>{"}),  # 5
        Message(role="user", content="Error: no valid tool call", origin="environment"),
        _call("c", "read", path="/x"),                              # 7: MCP isError
        _tool("c", "file missing", is_error=True),
        _call("d", "read", path="/errors.log"),                     # 9: fine (text mentions errors)
        _tool("d", "No errors found. Traceback-free."),
        Message(role="assistant", content="checked", extra={"verifier_flag": "wrong claim"}),  # 11
        Message(role="user", content="and?"),
        _call("e", "turn_on", device="lamp"),                       # 13: the recovery
        _tool("e", "ok: lamp on"),
        Message(role="assistant", content="The lamp is on."),       # 15
    ])


def test_each_kind_of_error_turn_is_found_and_nothing_else():
    assert error_turns(_traj()) == {1: "error_observation", 3: "invalid_call", 5: "invalid_call",
                                    7: "error_observation", 11: "verifier_flag"}
    assert observation_is_error(Message(role="tool", content="Traceback (most recent call last):\n  ..."))
    assert observation_is_error(Message(role="tool", content="  exception: timeout"))
    assert not observation_is_error(Message(role="tool", content="errors: 0"))
    assert not observation_is_error(Message(role="tool", content="The error rate is 2%"))


def test_train_on_becomes_explicit_flags_minus_error_turns():
    t = _traj()
    masked, counts = mask_error_turns(t, "all")
    flags = {i: m.train for i, m in enumerate(masked.messages) if m.role == "assistant"}
    assert flags == {1: False, 3: False, 5: False, 7: False, 9: True, 11: False, 13: True, 15: True}
    assert counts == {"error_observation": 2, "invalid_call": 2, "verifier_flag": 1}
    assert all(m.train is None for m in t.messages)  # the input is not changed
    assert [m.model_dump(exclude={"train"}) for m in masked.messages] == [m.model_dump(exclude={"train"})
                                                                          for m in t.messages]
    last, _ = mask_error_turns(t, "last")
    assert {i for i, m in enumerate(last.messages) if m.train} == {15}
    t.messages[9].train = False  # a hint the data gave stays
    hint, counts = mask_error_turns(t, "hint")
    assert {i for i, m in enumerate(hint.messages) if m.train} == {13, 15}
    ended_in_error = Trajectory(id="e", tools=t.tools, messages=t.messages[:3])
    last_err, counts = mask_error_turns(ended_in_error, "last")
    assert counts == {"error_observation": 1} and not any(m.train for m in last_err.messages)


def test_same_tokens_as_plain_sft_and_only_error_turn_weights_are_zero(tiny_tok, home_experts):
    from trajtune.chat.render import ChatRenderer, RenderConfig

    expert = home_experts[0]
    first = next(i for i, m in enumerate(expert.messages) if m.role == "assistant" and m.tool_calls)
    call = expert.messages[first].tool_calls[0]
    wrong = ToolCall(id="bad0", name=call.name, arguments={k: "nowhere" for k in (call.arguments or {})})
    injected = expert.model_copy(deep=True)
    injected.messages[first:first] = [Message(role="assistant", tool_calls=[wrong]),
                                      Message(role="tool", tool_call_id="bad0", name=call.name,
                                              content="Error: there is no 'nowhere'", origin="environment")]
    plain = ChatRenderer(tiny_tok, RenderConfig(train_on="all")).render(injected)
    masked_traj, counts = mask_error_turns(injected, "all")
    masked = ChatRenderer(tiny_tok, RenderConfig(train_on="hint")).render(masked_traj)
    assert counts == {"error_observation": 1}
    assert masked.ids == plain.ids and masked.source == plain.source  # the error stays in context
    err_turn = sum(1 for m in injected.messages[:first] if m.role == "assistant")  # its assistant-turn index
    changed = [k for k, (a, b) in enumerate(zip(plain.weight, masked.weight)) if a != b]
    assert changed and all(plain.turn[k] == err_turn and masked.weight[k] == 0 for k in changed)
    assert not any(w > 0 for w, tr in zip(masked.weight, masked.turn) if tr == err_turn)
    recovery = [w for w, tr in zip(masked.weight, masked.turn) if tr == err_turn + 1]
    assert recovery and max(recovery) > 0  # the recovery is trained


def test_sft_run_reports_masked_turns_and_rft_refuses_last(tmp_path, tiny_dir, home_experts):
    from trajtune.algorithms.rft import RFTRunConfig
    from trajtune.algorithms.sft import SFTRunConfig
    from trajtune.config import load_config
    from trajtune.errors import ConfigError
    from trajtune.schema import write_trajectories
    from trajtune.train import run

    data = tmp_path / "d.jsonl"
    write_trajectories(data, [_traj()] + home_experts[:3])
    out = tmp_path / "run"
    res = run(load_config(None, SFTRunConfig, [f"model={tiny_dir}", f"output_dir={out}", f"data.path={data}",
                                                "data.mask_errors=true", "train.steps=1", "train.batch_size=2",
                                                "report=false"]), quiet=True)
    assert res["error_turns_masked"] == {"error_observation": 2, "invalid_call": 2, "verifier_flag": 1}
    assert json.loads((out / "result.json").read_text())["error_turns_masked"]["invalid_call"] == 2
    with pytest.raises(ConfigError, match="mask_errors"):
        load_config(None, RFTRunConfig, [f"model={tiny_dir}", "output_dir=o", "env=home", f"data.path={data}",
                                         "data.mask_errors=true", "data.train_on=last"])
