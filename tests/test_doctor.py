"""`check_template` / `trajtune doctor`: each failure mode of a template is flagged by its check."""

from __future__ import annotations

import json

import pytest
from chat_fixtures import FAMILIES, tokenizer_for
from typer.testing import CliRunner

from trajtune.chat.doctor import check_template
from trajtune.chat.render import RenderConfig
from trajtune.cli.main import app
from trajtune.errors import ModelLoadError, UsageError

CHATML = FAMILIES["chatml"].template


def status(report, name):
    c = report.get(name)
    assert c is not None, f"no check {name!r} in {[c.name for c in report.checks]}"
    return c.status


@pytest.mark.parametrize("name", list(FAMILIES))
def test_families(name):
    fam = FAMILIES[name]
    report = check_template(tokenizer_for(name))
    assert report.prefix_stable is fam.prefix_stable
    assert report.ok is fam.prefix_stable
    assert report.end_of_turn == fam.eot and report.parser == fam.parser
    for check in ("end_of_turn", "system_and_tools", "render", "provenance", "tool_call_roundtrip"):
        assert status(report, check) == "pass", report.format_text()
    if fam.prefix_stable:
        assert report.failures == []
    else:
        assert [c.name for c in report.failures] == ["prefix_stability"]
        assert "not prefix-stable" in report.failures[0].detail
        relaxed = check_template(tokenizer_for(name), config=RenderConfig(non_prefix="split"))
        assert relaxed.ok and status(relaxed, "prefix_stability") == "warn"


def test_family_specific_findings():
    assert status(check_template(tokenizer_for("chatml")), "generation_markers") == "pass"
    assert status(check_template(tokenizer_for("llama3")), "parallel_calls") == "warn"  # one call per turn
    assert status(check_template(tokenizer_for("llama3")), "assistant_content") == "warn"  # content dropped
    assert status(check_template(tokenizer_for("deepseek")), "thinking") == "warn"  # reasoning stripped
    qwen = check_template(tokenizer_for("qwen3"), config=RenderConfig(non_prefix="split"))
    assert status(qwen, "thinking") == "pass"
    assert status(check_template(tokenizer_for("mistral")), "call_ids") == "pass"


def test_tiny_template_passes():
    from trajtune.models.tiny import build_tokenizer

    report = check_template(build_tokenizer(["hello world"], vocab_size=300))
    assert report.ok and report.prefix_stable and report.warnings == []
    assert status(report, "generation_markers") == "pass"


def test_markers_that_leave_out_the_end_of_turn_token_warn():
    tpl = CHATML.replace("{{- '<|im_end|>' }}\n{%- endgeneration %}", "{%- endgeneration %}\n{{- '<|im_end|>' }}")
    assert tpl != CHATML
    report = check_template(tokenizer_for("chatml"), chat_template=tpl)
    assert status(report, "generation_markers") == "warn" and report.ok


def test_template_that_drops_the_system_prompt_fails():
    tpl = CHATML.replace("{{- messages[0].content + '\\n\\n' }}", "")
    assert tpl != CHATML
    report = check_template(tokenizer_for("chatml"), chat_template=tpl)
    assert not report.ok and status(report, "system_and_tools") == "fail"
    assert "careful home assistant" in report.get("system_and_tools").detail


def test_template_that_drops_tool_calls_fails():
    tpl = CHATML.replace("{%- for tool_call in message.tool_calls or [] %}", "{%- for tool_call in [] %}")
    assert tpl != CHATML
    native = check_template(tokenizer_for("chatml"), chat_template=tpl, config=RenderConfig(tool_format="native"))
    assert not native.ok and status(native, "render") == "fail"
    assert "tool call 'get_weather' is not rendered" in native.get("render").detail
    # auto writes the calls as Hermes text instead, and says why
    auto = check_template(tokenizer_for("chatml"), chat_template=tpl)
    assert auto.ok and auto.tool_format == "hermes"
    assert "does not render tool calls" in auto.get("tool_format").detail


def test_wrong_parser_fails_the_round_trip():
    report = check_template(tokenizer_for("chatml"), parser="mistral")
    assert [c.name for c in report.failures] == ["tool_call_roundtrip"]


def test_multi_token_end_of_turn_fails():
    report = check_template(tokenizer_for("chatml"), config=RenderConfig(end_of_turn="<|im_end|>\n"))
    assert "end_of_turn" in [c.name for c in report.failures]


def test_no_template_fails_cleanly():
    from transformers import PreTrainedTokenizerFast

    tok = tokenizer_for("chatml")
    bare = PreTrainedTokenizerFast(tokenizer_object=tok.backend_tokenizer, eos_token="<|im_end|>")
    report = check_template(bare)
    assert not report.ok and report.failures[0].name == "template" and "no chat template" in report.failures[0].detail


def test_cli(tmp_path):
    tok = tokenizer_for("chatml")
    tok.save_pretrained(tmp_path / "tok")
    runner = CliRunner()
    res = runner.invoke(app, ["doctor", "--model", str(tmp_path / "tok"), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["ok"] is True and data["parser"] == "hermes"
    assert {c["name"] for c in data["checks"]} >= {"prefix_stability", "provenance", "tool_call_roundtrip"}
    qwen3 = tmp_path / "qwen3.jinja"
    qwen3.write_text(FAMILIES["qwen3"].template)
    res = runner.invoke(app, ["doctor", "--model", str(tmp_path / "tok"), "--template", str(qwen3)])
    assert res.exit_code == 1 and "FAIL  prefix_stability" in res.output
    res = runner.invoke(app, ["doctor", "--model", str(tmp_path / "tok"), "--template", str(qwen3),
                              "--non-prefix", "split"])
    assert res.exit_code == 0 and "WARN  prefix_stability" in res.output
    res = runner.invoke(app, ["doctor", "--model", str(tmp_path / "missing")])
    assert res.exit_code == ModelLoadError.exit_code and "cannot load a tokenizer" in res.output
    res = runner.invoke(app, ["doctor", "--model", str(tmp_path / "tok"), "--parser", "nope"])
    assert res.exit_code == UsageError.exit_code and "unknown parser" in res.output
    res = runner.invoke(app, ["doctor", "--help"])
    assert res.exit_code == 0 and "Example:" in res.output


def test_cli_shows_the_tool_format_and_takes_render_options(tmp_path):
    from test_render_adapt import SMOLLM2

    tok = tokenizer_for("chatml")
    tok.save_pretrained(tmp_path / "tok")
    tpl = tmp_path / "smollm2.jinja"
    tpl.write_text(SMOLLM2)
    runner = CliRunner()
    res = runner.invoke(app, ["doctor", "--model", str(tmp_path / "tok"), "--template", str(tpl)])
    assert res.exit_code == 0, res.output
    assert "PASS  tool_format          hermes: the template does not render tools or tool calls" in res.output
    res = runner.invoke(app, ["doctor", "--model", str(tmp_path / "tok"), "--template", str(tpl),
                              "--set", "render.tool_format=native"])
    assert res.exit_code == 1 and "FAIL  system_and_tools" in res.output
    res = runner.invoke(app, ["doctor", "--model", str(tmp_path / "tok"), "--set", "render.tool_format=bogus"])
    assert res.exit_code == 2 and "render.tool_format" in res.output
