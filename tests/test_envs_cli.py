"""`trajtune envs list/show` and the `generate` command function."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from trajtune.cli.main import app
from trajtune.envs.builtin import BUILTIN_ENVS
from trajtune.errors import EnvError, OutputError, UsageError
from trajtune.schema import read_trajectories

runner = CliRunner()


def test_envs_list_names_every_builtin():
    r = runner.invoke(app, ["envs", "list", "--json"])
    assert r.exit_code == 0, r.output
    names = {row["name"] for row in json.loads(r.output)}
    assert set(BUILTIN_ENVS) <= names
    r = runner.invoke(app, ["envs", "list"])
    assert r.exit_code == 0 and "workspace" in r.output and "sokoban" in r.output


def test_envs_show_prints_tools_task_and_expert():
    r = runner.invoke(app, ["envs", "show", "memory"])
    assert r.exit_code == 0, r.output
    assert "memory_create(key: string, value: string)" in r.output
    assert "example task memory-train-0" in r.output and "success=True" in r.output


def test_envs_show_unknown_is_a_clean_error():
    r = runner.invoke(app, ["envs", "show", "nope"])
    assert r.exit_code == EnvError.exit_code and "unknown environment 'nope'" in r.output and "Traceback" not in r.output


def test_help_has_examples():
    for args in (["envs", "--help"], ["envs", "list", "--help"], ["envs", "show", "--help"]):
        r = runner.invoke(app, args)
        assert r.exit_code == 0 and "Example:" in r.output
    assert "Example:" in runner.invoke(app, ["data", "generate", "--help"]).output


def test_generate_writes_ir_and_refuses_to_overwrite(tmp_path):
    out = tmp_path / "d" / "ttt.jsonl"
    r = runner.invoke(app, ["data", "generate", "--env", "tictactoe", "--n", "4", "-o", str(out), "--split", "test", "--seed", "2"])
    assert r.exit_code == 0, r.output
    trajs = list(read_trajectories(out))
    assert len(trajs) == 4 and all(t.metadata["split"] == "test" and t.metadata["policy"] == "expert:tictactoe" for t in trajs)
    assert "4/4 expert successes" in r.output
    before = out.read_text()
    r = runner.invoke(app, ["data", "generate", "--env", "tictactoe", "--n", "2", "-o", str(out)])
    assert r.exit_code == OutputError.exit_code and "--overwrite" in r.output and out.read_text() == before
    r = runner.invoke(app, ["data", "generate", "--env", "tictactoe", "--n", "2", "-o", str(out), "--overwrite"])
    assert r.exit_code == 0 and len(list(read_trajectories(out))) == 2
    assert not [p for p in out.parent.iterdir() if p.name.endswith(".tmp")]


def test_generate_only_success_and_bad_input(tmp_path):
    out = tmp_path / "b.jsonl"
    r = runner.invoke(app, ["data", "generate", "--env", "bandit", "--n", "30", "-o", str(out), "--only-success"])
    assert r.exit_code == 0, r.output
    trajs = list(read_trajectories(out))
    assert trajs and all(t.outcome.success for t in trajs)
    n_ok = int(r.output.split("(")[1].split("/")[0])
    assert len(trajs) == n_ok
    r = runner.invoke(app, ["data", "generate", "--env", "nope", "--n", "1", "-o", str(tmp_path / "x.jsonl")])
    assert r.exit_code == EnvError.exit_code and "unknown environment" in r.output
    r = runner.invoke(app, ["data", "generate", "--env", "bandit", "--n", "1", "-o", str(tmp_path / "x.jsonl"), "--split", "dev"])
    assert r.exit_code == UsageError.exit_code and "train or test" in r.output


def test_envs_show_lists_the_options_an_environment_takes():
    """`config show` says an environment's options are listed by `envs show`: from the signature
    (trip's difficulty) or from the options model of an environment that takes **options (fncall)."""
    from typer.testing import CliRunner

    from trajtune.cli.main import app
    from trajtune.envs.fncall import FncallOptions

    out = CliRunner().invoke(app, ["envs", "show", "trip"]).output
    assert "options (--env-arg KEY=VALUE" in out and "\n  difficulty = None\n" in out
    out = CliRunner().invoke(app, ["envs", "show", "fncall"]).output
    for name, field in FncallOptions.model_fields.items():
        assert f"\n  {name} = {field.default!r}  (" in out
    out = CliRunner().invoke(app, ["envs", "show", "home"]).output
    assert "options (--env-arg KEY=VALUE, or env.kwargs in a config):" in out


def test_envs_show_names_the_extra_and_the_reward_terms_an_environment_reports():
    """The reward terms `envs show` lists are the ones a step's info really carries (reward.terms can
    weigh them), and a plug-in on an optional extra says how to install it."""
    from trajtune.envs import make_env

    for name, kwargs in (("fncall", {"single_turn": True}), ("reasoning_gym", {}), ("tau2", {}), ("home", {})):
        env = make_env(name, **kwargs)
        task = env.tasks("test", 1)[0]
        env.reset(task)
        traj = env.expert(task)
        r = runner.invoke(app, ["envs", "show", name])
        assert r.exit_code == 0, r.output
        line = next(x for x in r.output.splitlines() if x.startswith("reward terms"))
        shown = line.split(": ", 1)[1].split("  (")[0].split(", ")
        assert shown == list(type(env).reward_terms)
        assert set(shown) == set(traj.metadata.get("reward_terms") or _terms_of(env, task)), name
    r = runner.invoke(app, ["envs", "show", "reasoning_gym"])
    assert "install: pip install 'trajtune[reasoning-gym]'" in r.output
    r = runner.invoke(app, ["envs", "show", "tau2"])
    assert "\ntasks: train 30, test 20\n" in r.output and "install: pip install 'trajtune[tau2]'" in r.output
    r = runner.invoke(app, ["envs", "show", "home"])
    assert "install:" not in r.output and "\ntasks:" not in r.output
    r = runner.invoke(app, ["envs", "show", "bandit"])
    assert r.exit_code == 0 and "reward terms" not in r.output


def _terms_of(env, task):
    """The reward terms the environment reports in info, replaying the expert's replies until a step has them
    (the first for single-step environments, the last for a conversation such as tau2's)."""
    res = env.reset(task)
    replies = [m for m in env.expert(task).messages[len(res.messages):] if m.role == "assistant"]
    env.reset(task)
    for m in replies:
        info = env.step(m).info
        if "reward_terms" in info:
            return info["reward_terms"]
    raise AssertionError(f"no step of {env.name}'s expert reported reward terms")


def test_envs_show_a_benchmark_with_only_a_test_split():
    """BFCL has no train split: `envs show` (default --split train) shows one of its test entries."""
    for name, first in (("bfcl_single_turn", "simple_python_0"), ("bfcl_multi_turn", "multi_turn_base_0")):
        r = runner.invoke(app, ["envs", "show", name])
        assert r.exit_code == 0, r.output
        assert "tasks: test " in r.output and f"example task {first}:" in r.output
