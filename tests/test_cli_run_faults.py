"""Run-side mistakes a user can fix: one `error:` line, the documented exit code, no work started."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from trajtune.cli.main import app
from trajtune.errors import UsageError

runner = CliRunner()


def one_error(args: list[str], code: int) -> str:
    r = runner.invoke(app, args)
    errors = [line for line in r.output.splitlines() if line.startswith("error: ")]
    assert r.exit_code == code, r.output
    assert "Traceback" not in r.output and "internal error" not in r.output and len(errors) == 1, r.output
    return errors[0]


@pytest.mark.parametrize("args, needle", [
    # --tasks with BFCL was ignored: every entry of every category was queued (hours on a CPU)
    (["--benchmark", "bfcl", "--tasks", "3"], "use --limit 3"),
    (["--env", "home", "--limit", "5"], "use --tasks 5"),
    (["--benchmark", "textworld", "--limit", "5"], "use --tasks 5"),
    (["--env", "home", "--temperature", "-1"], "--temperature must be at least 0"),
    (["--env", "home", "-t", "-0.5"], "not -0.5"),
    (["--env", "home", "--top-p", "0"], "--top-p must be in (0, 1]"),
    (["--env", "home", "--top-p", "1.5"], "not 1.5"),
    (["--env", "home", "--max-new-tokens", "0"], "--max-new-tokens"),
])
def test_eval_options_that_would_do_nothing_or_nonsense_are_refused(tiny_dir, tmp_path, args, needle) -> None:
    out = tmp_path / "out"
    line = one_error(["eval", "--model", str(tiny_dir), *args, "--out", str(out)], UsageError.exit_code)
    assert needle in line
    assert not out.exists()  # refused before any loading or writing


def test_bfcl_with_the_safety_suite_may_count_its_safety_tasks() -> None:
    """--tasks sizes the safety half next to BFCL: not the ignored option the check refuses."""
    from trajtune.cli import eval_cmd

    eval_cmd._count_options("bfcl", "safety", 3, None)  # no error
    with pytest.raises(UsageError):
        eval_cmd._count_options("bfcl", None, 3, None)


def test_report_refuses_a_folder_that_holds_no_run(tmp_path) -> None:
    from trajtune.errors import InputNotFoundError

    (tmp_path / "notes.txt").write_text("my files")
    line = one_error(["report", str(tmp_path)], InputNotFoundError.exit_code)
    assert "not a run directory" in line and "config.yaml" in line
    assert not (tmp_path / "report.html").exists()


def _sft_config(tmp_path, model, out, home_experts) -> str:
    from trajtune.schema import write_trajectories

    data = tmp_path / "d.jsonl"
    if not data.exists():
        write_trajectories(data, home_experts[:4])
    cfg = tmp_path / f"{out.name}.yaml"
    cfg.write_text(f"model: {model}\noutput_dir: {out}\ndata: {{path: {data}}}\n"
                   "train: {steps: 1, batch_size: 2, micro_batch_size: 2, warmup_steps: 0}\n")
    return str(cfg)


@pytest.fixture()
def corrupt_model(tiny_dir, tmp_path):
    import shutil

    bad = tmp_path / "corrupt"
    shutil.copytree(tiny_dir, bad)
    weights = bad / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # a cut-off copy
    return bad


def test_a_corrupt_weights_file_is_one_line_and_leaves_no_run_dir(corrupt_model, tmp_path, home_experts) -> None:
    from trajtune.models.errors import ModelLoadError

    out = tmp_path / "run"
    cfg = _sft_config(tmp_path, corrupt_model, out, home_experts)
    line = one_error(["sft", "--config", cfg], ModelLoadError.exit_code)
    assert "corrupt or truncated" in line and str(corrupt_model) in line
    assert not out.exists()
    line = one_error(["eval", "--model", str(corrupt_model), "--env", "home", "--tasks", "1", "--out",
                      str(tmp_path / "ev")], ModelLoadError.exit_code)
    assert "corrupt or truncated" in line and not (tmp_path / "ev").exists()


def test_a_run_that_failed_before_its_first_step_does_not_block_the_fixed_rerun(tiny_dir, tmp_path,
                                                                                home_experts) -> None:
    """Before: the rerun was refused, and the --resume it suggested was refused for the changed config."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.yaml").write_text("model: broken\n")  # what a start that failed at loading leaves
    (out / "run.json").write_text('{"kind": "sft"}')
    r = runner.invoke(app, ["sft", "--config", _sft_config(tmp_path, tiny_dir, out, home_experts)])
    assert r.exit_code == 0, r.output
    assert (out / "final").is_dir() and str(tiny_dir) in (out / "config.yaml").read_text()
    # a run that trained steps is never replaced without a flag
    (out / "result.json").unlink()
    import shutil

    shutil.rmtree(out / "final")
    assert "already exists" in one_error(["sft", "--config", _sft_config(tmp_path, tiny_dir, out, home_experts)],
                                         7)


def test_an_output_dir_that_is_a_file(tiny_dir, tmp_path, home_experts) -> None:
    out = tmp_path / "taken"
    out.write_text("not a directory")
    line = one_error(["sft", "--config", _sft_config(tmp_path, tiny_dir, out, home_experts)], 7)
    assert "is an existing file, not a directory" in line and out.read_text() == "not a directory"


def test_an_option_value_the_environment_refuses(tiny_dir, tmp_path) -> None:
    from trajtune.errors import EnvError

    line = one_error(["eval", "--model", str(tiny_dir), "--env", "trip", "--env-arg", "difficulty=banana",
                      "--tasks", "1"], EnvError.exit_code)
    assert "environment 'trip' rejected its options (difficulty='banana')" in line


@pytest.mark.parametrize("code, hint", [(28, "the disk is full"), (30, "read-only"), (13, "no permission")])
def test_a_full_or_read_only_disk_is_one_line_and_leaves_no_temp_dir(tiny_dir, tmp_path, home_experts,
                                                                      monkeypatch, code, hint) -> None:
    """Root ignores permissions and the test disk is not full: the write fails as the OS would fail it."""
    import errno
    import os

    from transformers import PreTrainedModel

    assert {28: errno.ENOSPC, 30: errno.EROFS, 13: errno.EACCES}[code] == code

    def refuse(self, path, *a, **kw):
        raise OSError(code, os.strerror(code), str(path))

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", refuse)
    out = tmp_path / "run"
    line = one_error(["sft", "--config", _sft_config(tmp_path, tiny_dir, out, home_experts)], 7)
    assert hint in line and os.strerror(code) in line and ".tmp-" in line  # names the file it could not write
    assert not [p for p in out.rglob(".tmp-*")]


def test_serve_on_a_taken_port_fails_before_the_model_loads(corrupt_model) -> None:
    """The model here would fail to load: the port error coming first shows the check runs before."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = one_error(["serve", "--model", str(corrupt_model), "--port", str(port)], UsageError.exit_code)
    assert f"cannot serve on 127.0.0.1:{port}" in line and "choose another --port" in line


@pytest.mark.parametrize("args, needle", [(["--sft-steps", "2"], "demo setting sft_steps=2 cannot run"),
                                          (["--rl-steps", "1"], "train.warmup_steps (5) must be below")])
def test_demo_settings_no_stage_can_run_fail_at_start(tmp_path, args, needle) -> None:
    """Before, the demo failed with a traceback after minutes of data generation, SFT and evaluation."""
    out = tmp_path / "demo"
    line = one_error(["demo", "--out", str(out), *args], UsageError.exit_code)
    assert needle in line and not out.exists()


def test_a_problem_a_set_override_causes_names_the_override(tmp_path) -> None:
    """Before, the message blamed the YAML file alone for what `--set train.steps=2` broke."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model: m\noutput_dir: out\ndata: {path: d.jsonl}\ntrain: {steps: 200, save_every: 100}\n")
    line = one_error(["sft", "--config", str(cfg), "--set", "train.steps=2"], UsageError.exit_code)
    assert line.startswith(f"error: {cfg} with --set train.steps=2: invalid configuration")


@pytest.mark.parametrize("args, needle", [(["--n", "0"], "--n must be at least 1, not 0"),
                                          (["--seed", "-1"], "--seed must be at least 0, not -1"),
                                          (["--temperature", "-0.5"], "--temperature must be at least 0, not -0.5")])
def test_data_generate_out_of_range_is_an_error_line_not_a_usage_box(tmp_path, args, needle) -> None:
    out = tmp_path / "g.jsonl"
    line = one_error(["data", "generate", "--env", "home", *args, "-o", str(out)], UsageError.exit_code)
    assert needle in line and not out.exists()


def test_every_run_command_reports_a_corrupt_weights_file_as_one_line(corrupt_model, tiny_dir, tmp_path,
                                                                       home_experts) -> None:
    """The walk: each command that loads weights, given the cut-off copy, says so in one line
    (exit 4, the model-load code) and never shows an internal error."""
    from trajtune.models.errors import ModelLoadError

    bad, good = str(corrupt_model), str(tiny_dir)
    walks = {
        "sft": ["sft", "--config", _sft_config(tmp_path, bad, tmp_path / "w-sft", home_experts)],
        "eval": ["eval", "--model", bad, "--env", "home", "--tasks", "1"],
        "serve": ["serve", "--model", bad, "--port", "0"],
        "merge (a model)": ["merge", "--base", good, "--models", bad, "--method", "ta", "--out", str(tmp_path / "m1")],
        "merge (the base)": ["merge", "--base", bad, "--models", good, "--method", "ta", "--out", str(tmp_path / "m2")],
    }
    for name, args in walks.items():
        line = one_error(args, ModelLoadError.exit_code)
        assert "corrupt or truncated" in line, (name, line)
    assert not [p for p in tmp_path.iterdir() if p.name in ("w-sft", "m1", "m2")]


@pytest.mark.parametrize("args, needle", [
    (["report", "RUN", "--max-episodes", "0"], "--max-episodes must be at least 1, not 0"),
    (["data", "pairs", "IN", "-o", "OUT", "--max-per-task", "0"], "--max-per-task must be at least 1, not 0"),
    (["serve", "--model", "MODEL", "--max-tokens", "0"], "--max-tokens must be at least 1, not 0"),
    (["data", "synth-safety", "--n", "0", "-o", "OUT"], "--n must be at least 1, not 0"),
    (["data", "synth-safety", "--seed", "-2", "-o", "OUT"], "--seed must be at least 0, not -2"),
])
def test_out_of_range_counts_are_an_error_line_before_any_work(tmp_path, tiny_dir, args, needle) -> None:
    """These took typer's min=, which answers with a usage box instead of the `error:` line."""
    run_dir, src, out = tmp_path / "run", tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    run_dir.mkdir()
    src.write_text("")
    names = {"RUN": str(run_dir), "IN": str(src), "OUT": str(out), "MODEL": str(tiny_dir)}
    line = one_error([names.get(a, a) for a in args], UsageError.exit_code)
    assert needle in line
    assert not out.exists() and not (run_dir / "report.html").exists()


def test_eval_on_a_full_disk_is_one_line_and_leaves_no_temp_file(tiny_dir, tmp_path, monkeypatch) -> None:
    """eval writes its results through the atomic writers, which rename at the end: the rename fails
    as a full disk would fail it, and the temp file it would have renamed is gone."""
    import errno
    import os

    real_replace = os.replace

    def full(src, dst, *a, **kw):
        if str(dst).startswith(str(tmp_path)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))
        return real_replace(src, dst, *a, **kw)

    monkeypatch.setattr(os, "replace", full)
    out = tmp_path / "ev"
    line = one_error(["eval", "--model", str(tiny_dir), "--env", "home", "--tasks", "2", "--max-new-tokens", "4",
                      "--out", str(out)], 7)
    assert "the disk is full" in line and str(out) in line
    assert not [p for p in tmp_path.rglob("*") if ".tmp" in p.name]
