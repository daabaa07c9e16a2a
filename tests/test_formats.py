"""Converters: golden round trips, declared losses, format-specific pitfalls, the registry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trajtune.formats import (
    ConversionError,
    ConversionReport,
    FormatDetectionError,
    LoadStats,
    canonical_json,
    detect_format,
    get_format,
    list_formats,
    load_any,
    register_format,
)
from trajtune.schema import (
    CodeAction,
    ImagePart,
    Message,
    PassthroughPart,
    Reference,
    TextPart,
    ToolCall,
    ToolSpec,
    Trajectory,
    WebPart,
    RecordError,
)

FIX = Path(__file__).parent / "fixtures" / "formats"


def rows(name: str) -> list[dict]:
    return [json.loads(x) for x in (FIX / name).read_text(encoding="utf-8").splitlines() if x.strip()]


def ir(fmt: str, rec: dict) -> Trajectory:
    return get_format(fmt).to_ir(rec)[0]


# ------------------------------------------------------------------------------ round trips


@pytest.mark.parametrize("fmt,fixture", [("openai", "openai_golden.jsonl"), ("adp", "adp_golden.jsonl")])
def test_golden_round_trip_is_identity(fmt, fixture):
    records = rows(fixture)
    assert len(records) >= 4
    F = get_format(fmt)
    for rec in records:
        traj, rep = F.to_ir(rec)
        back, rep2 = F.from_ir(traj)
        assert canonical_json(back) == canonical_json(rec), traj.id
        assert rep2.losses == []


@pytest.mark.parametrize("fmt,fixture", [("openai", "openai_golden.jsonl"), ("adp", "adp_golden.jsonl")])
def test_round_trip_survives_ir_jsonl_serialisation(fmt, fixture, tmp_path):
    """The identity must hold through the IR file too (extra bookkeeping is JSON-safe)."""
    from trajtune.schema import read_trajectories, write_trajectories

    F = get_format(fmt)
    trajs = [F.to_ir(r)[0] for r in rows(fixture)]
    write_trajectories(tmp_path / "ir.jsonl", trajs)
    for rec, t in zip(rows(fixture), read_trajectories(tmp_path / "ir.jsonl")):
        assert canonical_json(F.from_ir(t)[0]) == canonical_json(rec)


# ------------------------------------------------------------------------------ OpenAI specifics


def test_openai_arguments_string_kept_raw_and_parsed():
    t = ir("openai", rows("openai_golden.jsonl")[0])
    calls = t.messages[2].tool_calls
    assert [c.id for c in calls] == ["call_a", "call_b"]
    assert calls[1].arguments == {"city": "Tokyo", "unit": "C"}
    assert calls[1].arguments_raw == '{"city":"Tokyo",  "unit":"C"}'  # original spacing kept
    assert not calls[0].id_generated
    assert t.messages[2].content is None
    assert t.tools[0].name == "get_weather" and t.tools[0].parameters["required"] == ["city"]


def test_openai_missing_ids_generated_and_results_paired():
    t = ir("openai", rows("openai_golden.jsonl")[1])
    call = t.messages[1].tool_calls[0]
    assert call.id == "call_000000" and call.id_generated
    assert t.messages[2].role == "tool" and t.messages[2].tool_call_id == "call_000000"
    assert t.id.startswith("openai-")  # deterministic content id for an id-less record
    assert ir("openai", rows("openai_golden.jsonl")[1]).id == t.id
    assert t.messages[0].content == "Crème brûlée recipe? 日本語 ok 🍮"


def test_openai_content_parts_and_weight():
    t = ir("openai", rows("openai_golden.jsonl")[2])
    parts = t.messages[0].content
    assert isinstance(parts[0], TextPart) and parts[0].text == "What is in this image?"
    assert isinstance(parts[1], ImagePart) and parts[1].url == "https://example.com/cat.png" and parts[1].detail == "low"
    assert isinstance(parts[2], PassthroughPart) and parts[2].source_type == "input_audio"
    assert t.messages[1].train is True
    assert t.metadata == {"split": "train"}


def test_openai_legacy_function_call():
    t = ir("openai", rows("openai_golden.jsonl")[3])
    call = t.messages[1].tool_calls[0]
    assert call.name == "calc" and call.arguments == {"expr": "2+2"} and call.id_generated
    res = t.messages[2]
    assert res.role == "tool" and res.name == "calc" and res.tool_call_id == call.id
    assert t.messages[3].train is False
    assert t.tools[0].name == "calc"


def test_openai_bad_arguments_not_repaired_and_double_encoded_decoded_once():
    t = ir("openai", rows("openai_golden.jsonl")[4])
    broken, double, custom = t.messages[2].tool_calls
    assert broken.arguments is None and broken.arguments_raw == "{not json"
    # double-encoded: the content is unambiguous, so it is decoded (and the original string kept)
    assert double.arguments == {"a": 1} and json.loads(json.loads(double.arguments_raw)) == {"a": 1}
    assert custom.type == "custom" and custom.input == "ls -la"
    assert t.messages[2].reasoning_content == "thinking..."


def test_openai_wrong_types_raise_conversion_error():
    with pytest.raises(ConversionError) as e:
        get_format("openai").to_ir({"messages": [{"role": "user", "content": 5}]})
    assert e.value.rule == "E204"
    with pytest.raises(ConversionError) as e:
        get_format("openai").to_ir({"messages": [{"role": "robot", "content": "x"}]})
    assert e.value.rule == "E203"
    with pytest.raises(ConversionError):
        get_format("openai").to_ir({"messages": "nope"})


# ------------------------------------------------------------------------------ ADP specifics


def test_adp_v1_code_action_and_positional_pairing():
    t = ir("adp", rows("adp_golden.jsonl")[0])
    assert [m.role for m in t.messages] == ["user", "assistant", "tool", "assistant"]
    call = t.messages[1].tool_calls[0]
    assert call.code == CodeAction(language="python", source="a, b = 0, 1\nfor _ in range(10):\n    a, b = b, a + b\nprint(a)")
    assert call.id == "call_000000" and call.id_generated
    assert t.messages[1].thought == "I will compute it in Python."
    assert t.messages[2].tool_call_id == "call_000000"
    assert t.metadata == {"dataset": "code_feedback"}


def test_adp_web_observation_parts():
    t = ir("adp", rows("adp_golden.jsonl")[1])
    web, img = t.messages[1].content
    assert isinstance(web, WebPart) and web.viewport_size == [1280, 720] and web.axtree == "[12] button 'Search'"
    assert isinstance(img, ImagePart) and img.path == "screens/0001.png"
    assert t.messages[1].role == "user" and t.messages[1].origin == "environment"  # no call pending yet
    # two actions then two observations: answered by position
    assert t.messages[4].tool_call_id == t.messages[2].tool_calls[0].id
    assert t.messages[5].tool_call_id == t.messages[3].tool_calls[0].id


def test_adp_1x_ids_reasoning_reward():
    t = ir("adp", rows("adp_golden.jsonl")[2])
    assert t.provenance.source_version == "1.2.0"
    a = t.messages[1]
    assert a.tool_calls[0].id == "t-1" and not a.tool_calls[0].id_generated
    assert a.reasoning_content == "The user wants a booking; search."
    assert t.messages[3].tool_call_id == "t-2" and t.messages[3].name == "get_time"
    assert t.messages[4].reward == 0.5 and t.reward == 1.0
    assert [x.name for x in t.tools] == ["find_restaurant", "get_time"]


def test_adp_v1_export_drops_ids_and_1x_keeps_them():
    t = ir("openai", rows("openai_golden.jsonl")[0])
    v1, rep1 = get_format("adp").from_ir(t, version="1")
    assert "schema_version" not in v1 and "call_ids" in rep1.losses
    assert all("tool_call_id" not in it for it in v1["content"])
    v12, rep12 = get_format("adp").from_ir(t)
    assert v12["schema_version"] == "1.2.0" and "call_ids" not in rep12.losses
    assert [it.get("tool_call_id") for it in v12["content"] if it["class_"] == "api_action"] == ["call_a", "call_b"]
    # ADP 1.x output re-imports to the same calls and pairings
    back = ir("adp", v12)
    assert [(m.role, m.tool_call_id) for m in back.messages if m.role == "tool"] == [("tool", "call_a"), ("tool", "call_b")]


def test_adp_rejects_unknown_class():
    with pytest.raises(ConversionError):
        get_format("adp").to_ir({"id": "x", "content": [{"class_": "teleport"}]})


# ------------------------------------------------------------------------------ cross-format losses


def rich_traj() -> Trajectory:
    """Hand-built IR exercising every field a lossy export can drop."""
    return Trajectory(
        id="rich",
        messages=[
            Message(role="system", content="sys"),
            Message(role="user", content="do it", train=False),
            Message(role="assistant", thought="plan", reasoning_content="hidden", train=True, tool_calls=[
                ToolCall(id="k1", name="search", arguments={"q": "x"}),
                ToolCall(id="k2", name="run", code=CodeAction(language="bash", source="ls"), arguments={"code": "ls"}),
                ToolCall(id="k3", type="custom", name="shell", input="pwd"),
            ]),
            Message(role="tool", tool_call_id="k1", content="r1", reward=0.1),
            Message(role="tool", tool_call_id="k2", content="r2"),
            Message(role="tool", tool_call_id="k3", content="r3"),
            Message(role="user", origin="environment", content=[WebPart(url="http://a", axtree="[1] link")]),
            Message(role="assistant", content="done"),
        ],
        tools=[ToolSpec(name="search", parameters={"type": "object", "properties": {"q": {"type": "string"}}})],
        reward=1.0,
        reference=Reference(kind="bfcl_ast", data=[{"search": {"q": ["x"]}}]),
    )


EXPECTED_LOSSES = {
    # what each export must declare for rich_traj(), derived from each format's spec
    "openai": {"thought", "code_action", "message_reward", "observation_source", "web_observation", "reward", "reference"},
    "adp": {"system_role", "message_grouping", "custom_input", "train_flags", "reference"},
    "sharegpt": {"thought", "reasoning_content", "train_flags", "message_reward", "call_ids", "code_action",
                 "custom_input", "reward", "reference", "non_text_content", "observation_source"},
    "xlam": {"thought", "reasoning_content", "train_flags", "message_reward", "code_action", "custom_input",
             "reward", "reference", "non_text_content"},
    "react": {"reasoning_content", "message_reward", "call_ids", "parallel_calls", "code_language", "tools",
              "reward", "reference", "non_text_content"},
    "hermes": {"thought", "train_flags", "message_reward", "call_ids", "code_action", "custom_input",
               "reward", "reference", "non_text_content"},
}


@pytest.mark.parametrize("fmt", sorted(EXPECTED_LOSSES))
def test_cross_format_losses_declared(fmt):
    rec, rep = get_format(fmt).from_ir(rich_traj())
    missing = EXPECTED_LOSSES[fmt] - set(rep.losses)
    assert not missing, f"{fmt} failed to declare {missing}; declared {rep.losses}"
    json.dumps(rec)  # exports are plain JSON
    back, _ = get_format(fmt).to_ir(rec)  # and re-import cleanly
    assert any(m.role == "assistant" for m in back.messages)


def test_lossless_where_the_target_can_carry_it():
    rec, rep = get_format("react").from_ir(rich_traj())
    assert "train_flags" not in rep.losses and "thought" not in rep.losses  # loss flags / Thought: lines
    assert [c.get("loss") for c in rec["conversations"]][1:3] == [False, True]
    rec, rep = get_format("hermes").from_ir(rich_traj())
    assert "reasoning_content" not in rep.losses and "<think>\nhidden\n</think>" in rec["conversations"][2]["value"]
    rec, rep = get_format("xlam").from_ir(rich_traj())
    assert "call_ids" not in rep.losses


@pytest.mark.parametrize("src,fixture", [("openai", "openai_golden.jsonl"), ("adp", "adp_golden.jsonl"),
                                         ("sharegpt", "sharegpt.jsonl"), ("xlam", "xlam.jsonl"),
                                         ("react", "react.jsonl"), ("hermes", "hermes.jsonl")])
def test_every_pair_converts_without_crashing(src, fixture):
    for rec in rows(fixture):
        t = ir(src, rec)
        for dst in ("openai", "adp", "sharegpt", "xlam", "react", "hermes", "ir"):
            out, rep = get_format(dst).from_ir(t)
            assert isinstance(rep, ConversionReport)
            get_format(dst).to_ir(json.loads(json.dumps(out)))


def test_openai_to_sharegpt_keeps_calls_and_texts():
    t = ir("openai", rows("openai_golden.jsonl")[0])
    rec, rep = get_format("sharegpt").from_ir(t)
    assert rec["system"] == "You are a weather bot."
    assert [c["from"] for c in rec["conversations"]] == ["human", "function_call", "observation", "gpt"]
    back = ir("sharegpt", rec)
    calls = back.messages[2].tool_calls
    assert [c.arguments for c in calls] == [{"city": "Paris"}, {"city": "Tokyo", "unit": "C"}]
    assert [m.content for m in back.messages if m.role == "tool"] == ["18C", "22C"]
    assert rep.losses == ["call_ids"]


# ------------------------------------------------------------------------------ ShareGPT / xLAM / ReAct / Hermes


def test_sharegpt_parallel_calls_and_tools_string():
    t = ir("sharegpt", rows("sharegpt.jsonl")[0])
    assert [m.role for m in t.messages] == ["system", "user", "assistant", "tool", "tool", "assistant"]
    assert [c.id for c in t.messages[2].tool_calls] == ["call_000000", "call_000001"]
    assert [m.tool_call_id for m in t.messages[3:5]] == ["call_000000", "call_000001"]
    assert t.tools[0].name == "get_weather"


def test_sharegpt_bad_tools_json_and_alternation():
    with pytest.raises(ConversionError) as e:
        get_format("sharegpt").to_ir({"conversations": [{"from": "human", "value": "x"}], "tools": "[{oops"})
    assert "tools" in e.value.message
    t = Trajectory(id="a", messages=[Message(role="user", content="a"), Message(role="user", content="b"),
                                     Message(role="assistant", content="c"), Message(role="user", content="d")])
    rec, rep = get_format("sharegpt").from_ir(t)
    assert rec["conversations"] == [{"from": "human", "value": "a\n\nb"}, {"from": "gpt", "value": "c"}]
    assert {"merged_turns", "trailing_turn"} <= set(rep.losses)


def test_xlam_mismatched_ids_repaired_and_reported():
    t, rep = get_format("xlam").to_ir(rows("xlam.jsonl")[0])
    assert t.messages[0].role == "system" and t.messages[0].content == "You are an API agent."
    assert t.messages[2].tool_calls[0].arguments == {"uid": 7}
    assert t.messages[3].tool_call_id == "a1"
    assert t.messages[3].extra["xlam"]["original_tool_call_id"] == "zz-mismatch"
    assert any("zz-mismatch" in w for w in rep.warnings)


def test_react_agentinstruct_loss_flags_and_actions():
    t = ir("react", rows("react.jsonl")[0])
    assert [m.train for m in t.messages] == [False, True, False, True, None]
    search = t.messages[1].tool_calls[0]
    assert (search.type, search.name, search.input) == ("custom", "search", "red mug")
    click = t.messages[3].tool_calls[0]
    assert (click.type, click.arguments) == ("function", {"id": "B01"})
    assert t.messages[4].role == "tool" and t.messages[4].content == "bought"  # final observation kept


def test_react_fireact_text():
    t = ir("react", rows("react.jsonl")[1])
    assert [m.role for m in t.messages] == ["user", "assistant", "tool", "assistant"]
    assert t.messages[1].thought == "Search Dune."
    assert t.messages[3].tool_calls[0].name == "Finish" and t.messages[3].tool_calls[0].input == "Frank Herbert"


def test_react_text_after_action_is_declared():
    rec = {"conversations": [{"from": "human", "value": "q"},
                             {"from": "gpt", "value": "Thought: t\nAction: a[b]\nObservation: invented", "loss": True}]}
    t, rep = get_format("react").to_ir(rec)
    assert t.messages[1].tool_calls[0].input == "b"
    assert "text_after_action" in rep.losses


def test_hermes_calls_reasoning_and_tools():
    t = ir("hermes", rows("hermes.jsonl")[0])
    a = t.messages[2]
    assert a.reasoning_content == "need two calls" and a.content is None
    assert [c.arguments for c in a.tool_calls] == [{"symbol": "AAPL"}, {"symbol": "MSFT"}]
    assert [m.content for m in t.messages[3:5]] == ['{"price": 1}', '{"price": 2}']
    assert t.tools[0].name == "get_stock"  # parsed from a Python-literal <tools> block


@pytest.mark.parametrize("text,warn", [
    ('<tool_call>\n{"name": "f", "arguments": {bad}\n</tool_call>', "invalid JSON"),
    ('<tool_call>{"name": "f"}', "unterminated <tool_call>"),
    ('<tool_call>{"arguments": {}}</tool_call>', "lacks a 'name'"),
])
def test_hermes_bad_blocks_reported_kept_as_text(text, warn):
    t, rep = get_format("hermes").to_ir({"conversations": [{"from": "human", "value": "x"}, {"from": "gpt", "value": text}]})
    assert t.messages[1].content == text and t.messages[1].tool_calls is None
    assert any(warn in w for w in rep.warnings)


def test_hermes_text_after_last_block():
    text = 'Let me check.\n<tool_call>{"name": "f", "arguments": {}}</tool_call>\nand more'
    t, rep = get_format("hermes").to_ir({"conversations": [{"from": "human", "value": "x"}, {"from": "gpt", "value": text}]})
    assert t.messages[1].tool_calls[0].name == "f"
    assert t.messages[1].content == "Let me check.\nand more"
    assert any("after the last" in w for w in rep.warnings)


# ------------------------------------------------------------------------------ registry and loading


@pytest.mark.parametrize("fixture,fmt", [("openai_golden.jsonl", "openai"), ("adp_golden.jsonl", "adp"),
                                         ("sharegpt.jsonl", "sharegpt"), ("xlam.jsonl", "xlam"),
                                         ("react.jsonl", "react"), ("hermes.jsonl", "hermes")])
def test_detect_format(fixture, fmt):
    assert detect_format(rows(fixture)[0]) == fmt


def test_detect_ambiguous_and_unknown():
    both = {"conversations": [{"from": "human", "value": "x", "loss": False},
                              {"from": "gpt", "value": '<tool_call>{"name": "f"}</tool_call>', "loss": True}]}
    with pytest.raises(FormatDetectionError, match="ambiguous.*hermes.*react"):
        detect_format(both)
    with pytest.raises(FormatDetectionError, match="could not recognise"):
        detect_format({"foo": 1})


def test_register_custom_format_and_aliases():
    class Upper:
        NAME = "upper"

        @staticmethod
        def detect(rec):
            return 0.99 if isinstance(rec, dict) and "UPPER" in rec else 0.0

        @staticmethod
        def to_ir(rec, *, line=None):
            return Trajectory(id=rec["UPPER"], messages=[Message(role="user", content="x")]), ConversionReport()

        @staticmethod
        def from_ir(t):
            return {"UPPER": t.id}, ConversionReport()

    register_format("upper", Upper())
    assert "upper" in list_formats()
    assert detect_format({"UPPER": "a"}) == "upper"
    assert get_format("llamafactory") is get_format("sharegpt")
    with pytest.raises(TypeError):
        register_format("bad", object())
    with pytest.raises(KeyError, match="unknown format"):
        get_format("nope")


def test_load_any_streams_ir_and_foreign(tmp_path):
    from trajtune.schema import write_trajectories

    trajs = [ir("openai", r) for r in rows("openai_golden.jsonl")]
    write_trajectories(tmp_path / "a.jsonl", trajs)
    got = list(load_any(tmp_path / "a.jsonl", format="trajtune"))
    assert [t.id for t in got] == [t.id for t in trajs]
    assert [t.id for t in load_any(tmp_path / "a.jsonl")] == [t.id for t in trajs]  # detected as IR
    it = load_any(FIX / "sharegpt.jsonl", format="sharegpt")
    assert next(it).messages[0].role == "system"  # lazily streamed


def test_load_any_skip_invalid_counts(tmp_path):
    p = tmp_path / "mixed.jsonl"
    good = json.dumps(rows("openai_golden.jsonl")[0])
    p.write_text(good + "\n{broken\n" + json.dumps({"messages": [{"role": "user", "content": 3}]}) + "\n" + good + "\n")
    with pytest.raises(RecordError) as e:
        list(load_any(p, "openai"))
    assert e.value.line == 2 and e.value.rule == "E101"
    st = LoadStats()
    assert len(list(load_any(p, "openai", skip_invalid=True, stats=st))) == 2
    assert (st.records, st.converted, st.skipped) == (4, 2, 2)
    assert st.by_rule == {"E101": 1, "E204": 1}


def test_generated_ids_deterministic_and_skip_collisions():
    rec = {"messages": [{"role": "user", "content": "x"},
                        {"role": "assistant", "tool_calls": [
                            {"type": "function", "function": {"name": "a", "arguments": "{}"}},
                            {"id": "call_000001", "type": "function", "function": {"name": "b", "arguments": "{}"}},
                            {"type": "function", "function": {"name": "c", "arguments": "{}"}}]}]}
    ids = [c.id for c in ir("openai", rec).messages[1].tool_calls]
    assert ids == ["call_000000", "call_000001", "call_000002"]
    assert ids == [c.id for c in ir("openai", rec).messages[1].tool_calls]
    # export gives the id-less calls back without ids
    back, _ = get_format("openai").from_ir(ir("openai", rec))
    assert canonical_json(back) == canonical_json(rec)


def test_sharegpt_export_groups_consecutive_calls_and_results():
    """ADP-style one-call-per-message data becomes one parallel function_call turn."""
    t = ir("adp", rows("adp_golden.jsonl")[1])
    rec, rep = get_format("sharegpt").from_ir(t)
    froms = [c["from"] for c in rec["conversations"]]
    assert froms == ["human", "function_call", "observation", "gpt"]
    calls = json.loads(rec["conversations"][1]["value"])
    assert [c["name"] for c in calls] == ["click", "type"]
    assert json.loads(rec["conversations"][2]["value"])[1] == "typed"
    assert "message_grouping" in rep.losses and "merged_turns" in rep.losses


ODD_VALUES = [None, 0, 1.5, True, "", "x", [], {}, [1], {"a": 1}, '{"a":1}', -1]


def _odd(rng):
    return json.loads(json.dumps(rng.choice(ODD_VALUES)))  # a fresh copy: shared values could form cycles


def _mutate(obj, rng) -> None:
    if isinstance(obj, dict) and obj:
        k = rng.choice(list(obj))
        r = rng.random()
        if r < 0.5:
            obj[k] = _odd(rng)
        elif r < 0.75:
            del obj[k]
        else:
            _mutate(obj[k], rng)
    elif isinstance(obj, list) and obj:
        i = rng.randrange(len(obj))
        if rng.random() < 0.5:
            obj[i] = _odd(rng)
        else:
            _mutate(obj[i], rng)


@pytest.mark.parametrize("src,fixture", [("openai", "openai_golden.jsonl"), ("adp", "adp_golden.jsonl"),
                                         ("sharegpt", "sharegpt.jsonl"), ("xlam", "xlam.jsonl"),
                                         ("react", "react.jsonl"), ("hermes", "hermes.jsonl")])
def test_mutated_records_fail_cleanly(src, fixture):
    """Wrong types anywhere give ConversionError/ValidationError, never a TypeError deep inside."""
    import random

    from pydantic import ValidationError

    from trajtune.validate import validate_trajectory

    rng = random.Random(1234)
    recs = rows(fixture)
    converted = 0
    for _ in range(300):
        r = json.loads(json.dumps(rng.choice(recs)))
        for _ in range(rng.randint(1, 3)):
            _mutate(r, rng)
        try:
            t, _ = get_format(src).to_ir(r)
        except (ConversionError, ValidationError):
            continue
        converted += 1
        validate_trajectory(t)
        for dst in ("openai", "adp", "sharegpt", "xlam", "react", "hermes"):
            get_format(dst).from_ir(t)
    assert converted > 0


PAIR_LOSSES = [
    # (source format, fixture line, target, losses that must be declared) — from each format's capabilities
    ("adp", 0, "openai", {"thought", "code_action"}),                      # descriptions, code_action class
    ("adp", 1, "openai", {"thought", "web_observation", "image_path", "observation_source"}),
    ("adp", 2, "sharegpt", {"thought", "reasoning_content", "call_ids", "reward", "message_reward", "metadata"}),
    ("adp", 2, "react", {"reasoning_content", "reward", "tools", "call_ids"}),
    ("adp", 0, "react", {"code_language"}),
    ("openai", 0, "adp", {"system_role", "message_grouping"}),
    ("openai", 2, "sharegpt", {"non_text_content", "train_flags", "metadata", "extra.openai"}),
    ("openai", 4, "xlam", {"invalid_arguments", "reasoning_content", "custom_input"}),
    ("hermes", 0, "openai", set()),                                        # reasoning_content has a key there
    ("hermes", 0, "sharegpt", {"reasoning_content"}),
    ("react", 0, "openai", {"train_flags"}),                               # loss=false on user turns
    ("react", 0, "hermes", {"train_flags", "custom_input"}),
    ("xlam", 0, "sharegpt", {"call_ids"}),
]


@pytest.mark.parametrize("src,idx,dst,must", PAIR_LOSSES)
def test_pairwise_declared_losses(src, idx, dst, must):
    fixture = {"adp": "adp_golden.jsonl", "openai": "openai_golden.jsonl", "hermes": "hermes.jsonl",
               "react": "react.jsonl", "xlam": "xlam.jsonl"}[src]
    t = ir(src, rows(fixture)[idx])
    _, rep = get_format(dst).from_ir(t)
    assert must <= set(rep.losses), f"{src}->{dst}: missing {must - set(rep.losses)} (declared {rep.losses})"
    if not must:
        assert rep.losses == []


def test_adp_v1_export_format_registered():
    t = ir("adp", rows("adp_golden.jsonl")[2])  # ADP 1.2.0 with ids, reasoning, rewards
    rec, rep = get_format("adp-v1").from_ir(t)
    assert "schema_version" not in rec and "tools" not in rec
    assert {"call_ids", "reasoning_content", "reward", "tools"} <= set(rep.losses)
