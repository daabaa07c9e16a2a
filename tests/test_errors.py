"""The one error policy: user errors are one line with the documented exit code; bugs show a traceback."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

import trajtune.errors as errors
from trajtune.cli.main import app
from trajtune.errors import (
    EXIT_CODES,
    ConfigError,
    DataError,
    EnvError,
    InputNotFoundError,
    ModelLoadError,
    OutputError,
    RenderError,
    UsageError,
    UserError,
)

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]


def _cli(*args):
    return runner.invoke(app, [str(a) for a in args])


def _sft_yaml(tmp_path: Path, model: Path | str, data: Path, out: Path) -> Path:
    p = tmp_path / "sft.yaml"
    p.write_text(f"model: {model}\noutput_dir: {out}\ndata: {{path: {data}, format: ir}}\ntrain: {{steps: 2}}\n")
    return p


def _one_chat(tmp_path: Path) -> Path:
    p = tmp_path / "ok.jsonl"
    p.write_text(json.dumps({"id": "a", "messages": [{"role": "user", "content": "hi"},
                                                      {"role": "assistant", "content": "hello"}]}) + "\n")
    return p


def test_a_bug_shows_its_traceback_and_exits_1(tmp_path, monkeypatch):
    """A ValueError that is not a UserError is a bug: it must not be dressed up as a user error."""
    import trajtune.train

    def broken(*a, **k):
        raise ValueError("internal inconsistency")

    monkeypatch.setattr(trajtune.train, "run", broken)
    r = _cli("sft", "--config", _sft_yaml(tmp_path, tmp_path, _one_chat(tmp_path), tmp_path / "o"))
    assert r.exit_code == 1
    assert "Traceback (most recent call last)" in r.output and "ValueError: internal inconsistency" in r.output
    assert "this is a bug" in r.output


def test_a_user_error_is_one_line_with_its_code_and_debug_shows_the_traceback(tmp_path):
    missing = tmp_path / "nope.jsonl"
    r = _cli("data", "validate", missing)
    assert r.exit_code == InputNotFoundError.exit_code
    assert r.output.strip().splitlines() == [f"error: {missing}: no such file or directory"]
    r = _cli("--debug", "data", "validate", missing)
    assert r.exit_code == InputNotFoundError.exit_code
    assert "Traceback (most recent call last)" in r.output and "InputNotFoundError" in r.output


def test_a_missing_input_file_has_the_same_code_in_every_command(tmp_path, tiny_dir):
    missing = tmp_path / "missing.jsonl"
    ok = _one_chat(tmp_path)
    runs = {
        "data validate": _cli("data", "validate", missing),
        "data convert": _cli("data", "convert", missing, "--to", "ir", "-o", tmp_path / "c.jsonl"),
        "data stats": _cli("data", "stats", missing),
        "sft data.path": _cli("sft", "--config", _sft_yaml(tmp_path, tiny_dir, missing, tmp_path / "o1")),
        "sft --config": _cli("sft", "--config", tmp_path / "missing.yaml"),
        "doctor --template": _cli("doctor", "--model", tiny_dir, "--template", tmp_path / "missing.jinja"),
    }
    for name, r in runs.items():
        assert r.exit_code == InputNotFoundError.exit_code == 3, (name, r.output)
        assert "no such file" in r.output and "Traceback" not in r.output, name
    assert not (tmp_path / "o1").exists()
    # A model path that does not exist: one code whether training or evaluating.
    gone = tmp_path / "no-model"
    for r in (_cli("sft", "--config", _sft_yaml(tmp_path, gone, ok, tmp_path / "o2")),
              _cli("eval", "--model", gone, "--env", "home", "--tasks", 1)):
        assert r.exit_code == ModelLoadError.exit_code == 4, r.output
    # An output that exists: one code for data files, generated data and run directories.
    (tmp_path / "taken.jsonl").write_text("x\n")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "keep.txt").write_text("x")
    for r in (_cli("data", "convert", ok, "--to", "ir", "-o", tmp_path / "taken.jsonl"),
              _cli("data", "generate", "--env", "home", "--n", 1, "-o", tmp_path / "taken.jsonl"),
              _cli("sft", "--config", _sft_yaml(tmp_path, tiny_dir, ok, tmp_path / "run"))):
        assert r.exit_code == OutputError.exit_code == 7, r.output


def test_unknown_names_are_usage_or_environment_errors(tmp_path):
    ok = _one_chat(tmp_path)
    assert _cli("data", "convert", ok, "--to", "klingon", "-o", tmp_path / "x.jsonl").exit_code == UsageError.exit_code
    r = _cli("eval", "--model", "m", "--env", "nope")
    assert r.exit_code == EnvError.exit_code and "unknown environment 'nope'" in r.output
    r = _cli("data", "generate", "--env", "home", "--n", 1, "-o", tmp_path / "g.jsonl")
    assert r.exit_code == 0
    # wrong environment arguments are named, not a TypeError traceback
    r = _cli("eval", "--model", "m", "--env", "home", "--env-arg", "colour=3")
    assert r.exit_code == EnvError.exit_code and "colour" in r.output and "Traceback" not in r.output


def test_every_user_error_kind_has_a_documented_exit_code():
    kinds = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, UserError)]
    assert {ConfigError, DataError, ModelLoadError, RenderError, EnvError, OutputError} <= set(kinds)
    for k in kinds:
        assert k.exit_code in EXIT_CODES and k.exit_code not in (0, 1), k
    # The existing classes next to their code belong to the family, with the code of their kind.
    from trajtune.chat.render import RenderError as RE
    from trajtune.config import ConfigError as CE
    from trajtune.formats import FormatDetectionError
    from trajtune.models.loading import ModelLoadError as ME
    from trajtune.schema import RecordError
    from trajtune.train import RunDirError

    assert RE.exit_code == 5 and CE.exit_code == 2 and ME.exit_code == 4 and RecordError.exit_code == 3
    assert FormatDetectionError.exit_code == 3 and RunDirError.exit_code == 7


def test_the_exit_code_table_is_in_help_and_docs():
    help_text = re.sub(r"\s+", " ", runner.invoke(app, ["--help"]).output)
    doc = (ROOT / "docs" / "architecture.md").read_text()
    for code in EXIT_CODES:
        assert f"{code}: " in help_text, code
        assert re.search(rf"^\| {code} \|", doc, re.M), f"docs/architecture.md lacks exit code {code}"


@pytest.mark.parametrize("cls", [UsageError, DataError, OutputError])
def test_user_errors_keep_their_builtin_bases(cls):
    """Callers that caught ValueError / FileExistsError before keep working."""
    base = FileExistsError if cls is OutputError else ValueError
    assert issubclass(cls, base)


def test_data_truncation_error_is_a_data_error_naming_the_record(tmp_path, tiny_dir):
    ok = _one_chat(tmp_path)
    r = _cli("sft", "--config", _sft_yaml(tmp_path, tiny_dir, ok, tmp_path / "o"), "--set", "data.max_length=10",
             "--set", "data.truncation=error")
    assert r.exit_code == DataError.exit_code and "'a'" in r.output and "max_length 10" in r.output, r.output
    assert "Traceback" not in r.output and not (tmp_path / "o").exists()


def test_an_unknown_eval_env_is_refused_before_the_run_directory_is_made(tmp_path, tiny_dir):
    ok = _one_chat(tmp_path)
    r = _cli("sft", "--config", _sft_yaml(tmp_path, tiny_dir, ok, tmp_path / "o"), "--set", "eval.env=nope")
    assert r.exit_code == EnvError.exit_code and "unknown environment 'nope'" in r.output
    assert not (tmp_path / "o").exists()
