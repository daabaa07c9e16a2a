"""Environments from YAML and the CLI: module:Class, python_tools, gym, mcp (a real stdio MCP server)."""

from __future__ import annotations

import json
import sys

import pytest
import yaml
from typer.testing import CliRunner

from trajtune.cli.main import app
from trajtune.config import ConfigError, EnvSpec, env_from_cli
from trajtune.envs import make_env
from trajtune.errors import EnvError
from trajtune.schema import Message, ToolCall

runner = CliRunner()


def _invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def mcp_env_spec(tmp_path_factory):
    import envfixtures

    server = tmp_path_factory.mktemp("mcp") / "server.py"
    server.write_text(envfixtures.MCP_SERVER)
    return {"mcp": {"command": [sys.executable, str(server)], "reset_tool": "reset", "name": "counter",
                    "tasks": [{"id": "c5", "prompt": "Make the counter 5.", "target": 5},
                              {"id": "c3", "prompt": "Make the counter 3.", "target": 3, "split": "test"}],
                    "reward_fn": "envfixtures:counter_is_target", "success_fn": "envfixtures:counter_reached"}}


def test_env_forms_normalise_to_a_factory_and_plain_arguments():
    assert EnvSpec.model_validate("home") == EnvSpec(name="home")
    g = EnvSpec.model_validate({"gym": "envfixtures:GuessGame", "kwargs": {"instructions": "Guess."}})
    assert (g.name, g.kwargs) == ("gym", {"id": "envfixtures:GuessGame", "instructions": "Guess."})
    p = EnvSpec.model_validate({"python_tools": {"toolbox": "envfixtures:Bank", "tasks": [{"prompt": "x"}]}})
    assert p.name == "python_tools" and p.kwargs["toolbox"] == "envfixtures:Bank"
    with pytest.raises(ValueError, match="one of python_tools, gym, mcp"):
        EnvSpec.model_validate({"gym": "a:B", "mcp": {"command": ["x"]}})
    with pytest.raises(ValueError, match="unknown key"):
        EnvSpec.model_validate({"gym": "a:B", "instructions": "put me under kwargs"})
    # the CLI takes the same forms inline or from a file, plus --env-arg pairs
    assert env_from_cli("{gym: envfixtures:GuessGame}", {"max_turns": 3}).kwargs == \
        {"id": "envfixtures:GuessGame", "max_turns": 3}
    with pytest.raises(ConfigError, match="--env"):
        env_from_cli("{gym: [unclosed")


def test_bad_references_name_the_module_or_attribute():
    with pytest.raises(EnvError, match=r"cannot import module 'no_such_pkg\.mod': ModuleNotFoundError"):
        make_env("no_such_pkg.mod:Env")
    with pytest.raises(EnvError, match="module 'envfixtures' has no attribute 'Nope'"):
        make_env("python_tools", toolbox="envfixtures:Nope", tasks=[{"prompt": "x"}])
    with pytest.raises(EnvError, match="not a trajtune Environment"):
        make_env("envfixtures:Bank")
    with pytest.raises(EnvError, match="no tasks"):
        make_env("python_tools", toolbox="envfixtures:Bank")
    r = runner.invoke(app, ["data", "generate", "--env", "no_such_pkg.mod:Env", "--n", "1", "-o", "/tmp/x.jsonl"])
    assert r.exit_code == 6 and "no_such_pkg.mod" in r.output


def test_module_class_through_data_generate(tmp_path):
    out = tmp_path / "home.jsonl"
    r = _invoke("data", "generate", "--env", "trajtune.envs.home:HomeEnv", "--n", "4", "-o", out)
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 4 and all(r["outcome"]["success"] for r in rows)


def test_mcp_server_from_yaml_is_a_working_environment(mcp_env_spec):
    spec = EnvSpec.model_validate(mcp_env_spec)
    env = make_env(spec.name, **spec.kwargs)
    # a task without a split is offered in both
    assert [t.id for t in env.tasks("train", 5)] == ["c5"] and [t.id for t in env.tasks("test", 5)] == ["c5", "c3"]
    res = env.reset(env.tasks("train", 1)[0])
    assert {t.name for t in res.tools} == {"add", "get"}  # the reset tool is not offered
    out = env.step(Message(role="assistant", tool_calls=[ToolCall(id="a", name="add", arguments={"amount": 5})]))
    assert out.observations[0].text() == "counter is 5"
    assert env.success()
    final = env.step(Message(role="assistant", content="done"))
    assert final.done and final.reward == 1.0


def test_rl_and_eval_through_the_cli_on_an_mcp_server(tmp_path, tiny_dir, mcp_env_spec):
    from trajtune.envs.adapters import from_config

    cfg = tmp_path / "rl.yaml"
    cfg.write_text(yaml.safe_dump({
        "algorithm": "rl", "model": str(tiny_dir), "output_dir": str(tmp_path / "rl"), "env": mcp_env_spec,
        "rollout": {"max_turns": 2, "max_new_tokens": 8, "max_length": 768, "batch_size": 2},
        "rl": {"tasks_per_step": 1, "group_size": 2, "n_train_tasks": 1}, "train": {"steps": 1}}))
    r = _invoke("rl", "--config", cfg, "--quiet")
    assert r.exit_code == 0, r.output
    eps = [json.loads(line) for line in (tmp_path / "rl" / "rollouts.jsonl").read_text().splitlines()]
    assert len(eps) == 2 and all(e["id"] == "c5" for e in eps)
    assert {t["name"] for t in eps[0]["tools"]} == {"add", "get"}
    assert eps[0]["messages"][1]["content"] == "Make the counter 5."
    # the same env from the run config file, for trajtune eval (its test split)
    r = _invoke("eval", "--model", tiny_dir, "--env", cfg, "--tasks", "5", "--max-turns", "1", "--max-new-tokens", "4",
                "-q")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["metrics"]["episodes"] == 2
    # servers are pooled: no more processes than episodes ran at once
    assert 1 <= len(from_config._SERVERS.all) <= 2


def test_eval_through_the_cli_on_a_gym_style_game(tmp_path, tiny_dir):
    out = tmp_path / "ev"
    r = _invoke("eval", "--model", tiny_dir, "--env", "{gym: envfixtures:GuessGame, kwargs: {instructions: Guess.}}",
                "--tasks", "3", "--max-turns", "2", "--max-new-tokens", "4", "--out", out, "-q", "--no-report")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["metrics"]["episodes"] == 3
    eps = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert all(e["messages"][1]["content"] == "Guess a number from 0 to 9." for e in eps)
    assert all(e["messages"][0]["content"] == "Guess." for e in eps)


def test_rft_through_the_cli_on_python_tools(tmp_path, tiny_dir):
    from trajtune.envs.runner import run_episodes
    from trajtune.schema import write_trajectories

    env_spec = {"python_tools": "envfixtures:Bank",
                "kwargs": {"tasks": [{"id": f"d{k}", "prompt": f"Deposit {k}.", "target": k} for k in range(1, 5)],
                           "reward_fn": "envfixtures:bank_reward"}}
    spec = EnvSpec.model_validate(env_spec)
    tasks = make_env(spec.name, **spec.kwargs).tasks("train", 4)

    def expert(messages, tools):
        if not any(m.role == "tool" for m in messages):
            k = int(messages[-1].text().split()[1].rstrip("."))
            return Message(role="assistant", tool_calls=[ToolCall(id="", name="deposit", arguments={"amount": k})])
        return Message(role="assistant", content="Done.")

    trajs = run_episodes(lambda: make_env(spec.name, **spec.kwargs), tasks, expert, max_turns=3)
    assert all(t.outcome.success for t in trajs)
    write_trajectories(tmp_path / "bank.jsonl", trajs)
    cfg = tmp_path / "rft.yaml"
    cfg.write_text(yaml.safe_dump({
        "algorithm": "rft", "model": str(tiny_dir), "output_dir": str(tmp_path / "rft"), "env": env_spec,
        "data": {"path": str(tmp_path / "bank.jsonl"), "max_length": 768},
        "rollout": {"max_turns": 2, "max_new_tokens": 8, "max_length": 768},
        "rft": {"n_tasks": 4, "k": 1}, "train": {"steps": 2, "batch_size": 2, "micro_batch_size": 2}}))
    r = _invoke("train", "--config", cfg, "--quiet")
    assert r.exit_code == 0, r.output
    result = json.loads((tmp_path / "rft" / "result.json").read_text())
    assert result["step"] == 2 and result["expert_records"] == 4
