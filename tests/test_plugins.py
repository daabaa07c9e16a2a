"""Plug-ins: a third party's environment and eval suite, registered by entry point or by one call,
become usable by name; and the generic layers (envs, eval) name no benchmark.

The third party here is a real module written to a temporary directory on ``sys.path``, and its
entry points are what ``importlib.metadata`` would report for an installed package declaring

    [project.entry-points."trajtune.envs"]
    toy_world = "toy_plugin_pkg:ToyWorld"
    [project.entry-points."trajtune.eval_suites"]
    toy_bench = "toy_plugin_pkg:ToyBench"
"""

from __future__ import annotations

import ast
import re
import sys
import textwrap
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

import trajtune
from trajtune import plugins
from trajtune.envs import list_envs, make_env
from trajtune.envs.registry import UnknownEnvError
from trajtune.errors import UsageError
from trajtune.eval.backends import TextBackend
from trajtune.eval.harness import EvalSettings, run_evaluation
from trajtune.eval.suites import EvalSuite, eval_suite_names, get_eval_suite, register_eval_suite
TOY_PLUGIN = '''
"""A third party's package: one environment and one eval suite (single-turn prompts)."""
from trajtune.envs.base import Environment, ResetResult, StepResult, Task
from trajtune.eval.suites import EvalSuite, Suite
from trajtune.schema import Message, Outcome, Trajectory


class ToyWorld(Environment):
    name = "toy_world"
    max_turns = 1

    def __init__(self, word: str = "ping"):
        self.word = word

    def tasks(self, split, n, seed=0):
        return [Task(id=f"toy-{split}-{i}", seed=seed + i, split=split) for i in range(n)]

    def reset(self, task):
        self.said = None
        return ResetResult(messages=[Message(role="user", content=f"say {self.word}")], tools=[])

    def step(self, action):
        self.said = action.text()
        return StepResult(observations=[], reward=float(self.success()), done=True)

    def success(self):
        return self.said == self.word


def score(ref, text, parser):
    ok = text is not None and text.strip() == ref.reference.data["answer"]
    out = ref.model_copy(deep=True)
    out.messages.append(Message(role="assistant", content=text or "", origin="agent"))
    out.reward = float(ok)
    out.outcome = Outcome(success=ok, termination="done")
    return out


class ToyBench(EvalSuite):
    name = "toy_bench"
    takes_categories = True

    def suites(self, settings):
        from trajtune.schema import Reference

        prompts = {}
        for i, answer in enumerate(["4", "6", "9"][: settings.limit or 3]):
            prompts[f"sum-{i}"] = Trajectory(id=f"sum-{i}", messages=[Message(role="user", content=f"q{i}")],
                                             reference=Reference(kind="answer", data={"answer": answer}))
        tasks = [Task(id=k, seed=i, split="test") for i, k in enumerate(prompts)]
        return [Suite(name="toy_bench:sums", tasks=tasks, category="sums", prompts=prompts, score=score)]

    def report(self, episodes):
        return {"solved": sorted(t.id for t in episodes if t.outcome and t.outcome.success)}
'''


@pytest.fixture
def third_party(tmp_path, monkeypatch):
    """The toy package on sys.path, declared through entry points as an installed package would be."""
    (tmp_path / "toy_plugin_pkg.py").write_text(textwrap.dedent(TOY_PLUGIN), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    declared = {plugins.ENVS: [EntryPoint("toy_world", "toy_plugin_pkg:ToyWorld", plugins.ENVS)],
                plugins.EVAL_SUITES: [EntryPoint("toy_bench", "toy_plugin_pkg:ToyBench", plugins.EVAL_SUITES)]}
    monkeypatch.setattr(plugins.metadata, "entry_points", lambda group: declared.get(group, []))
    yield
    from trajtune.envs import registry
    from trajtune.eval import suites

    registry._REGISTRY.pop("toy_world", None)  # the registries are per process: leave them as found
    suites._SUITES.pop("toy_bench", None)
    sys.modules.pop("toy_plugin_pkg", None)


def test_an_entry_point_environment_is_made_by_name_and_listed(third_party):
    assert "toy_plugin_pkg" not in sys.modules  # declared, not imported: its dependency may be missing
    env = make_env("toy_world", word="pong")
    assert type(env).__name__ == "ToyWorld" and env.word == "pong"
    assert "toy_world" in list_envs()
    with pytest.raises(Exception, match="unexpected keyword"):  # arguments are checked as for a built-in
        make_env("toy_world", colour="red")


def test_an_unknown_environment_lists_the_plug_ins_too(third_party):
    with pytest.raises(UnknownEnvError, match="toy_world"):
        make_env("no_such_world")


def test_an_entry_point_eval_suite_runs_through_the_harness_with_its_own_score_and_report(third_party):
    assert "toy_bench" in eval_suite_names()
    answers = {"q0": "4", "q1": "5", "q2": "9"}  # the second is wrong

    def model(messages, tools):
        return answers[messages[-1].text()]

    s = EvalSettings(model="toy", benchmark="toy_bench", categories=["sums"], parser="hermes")
    results = run_evaluation(s, TextBackend(model))
    assert results["kind"] == "benchmark" and results["target"] == "toy_bench"
    assert results["metrics"]["episodes"] == 3 and results["metrics"]["success"] == pytest.approx(2 / 3)
    assert results["toy_bench"] == {"solved": ["sum-0", "sum-2"]}  # the suite's report section


def test_an_entry_point_environment_is_an_eval_target_too(third_party):
    s = EvalSettings(model="toy", env="toy_world", tasks=2, parser="hermes")
    results = run_evaluation(s, TextBackend(lambda messages, tools: "ping"))
    assert results["metrics"]["episodes"] == 2 and results["metrics"]["success"] == 1.0


def test_the_eval_suite_plug_in_of_docs_envs_md_runs_as_written(tmp_path, monkeypatch):
    """The example in docs/envs.md ("Plug-ins"), as a package declared by its entry point."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "envs.md").read_text(encoding="utf-8")
    code = re.search(r"```python\n# echo_bench/suite.py\n(.*?)```", doc, re.S).group(1)
    (tmp_path / "echo_bench_suite.py").write_text(code, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    declared = [EntryPoint("echo_bench", "echo_bench_suite:EchoBench", plugins.EVAL_SUITES)]
    monkeypatch.setattr(plugins.metadata, "entry_points",
                        lambda group: declared if group == plugins.EVAL_SUITES else [])
    from trajtune.eval import suites

    try:
        s = EvalSettings(model="echo", benchmark="echo_bench", limit=2, parser="hermes")
        results = run_evaluation(s, TextBackend(lambda messages, tools: messages[-1].text().split(": ")[1]))
        assert results["metrics"]["episodes"] == 2 and results["metrics"]["success"] == 1.0
        assert results["echo_bench"] == {"wrong": []}
    finally:
        suites._SUITES.pop("echo_bench", None)
        sys.modules.pop("echo_bench_suite", None)


def test_one_registry_call_makes_an_eval_suite_usable_by_name():
    class Empty(EvalSuite):
        name = "empty_bench"

        def suites(self, settings):
            return []

    from trajtune.eval import suites

    try:
        register_eval_suite(Empty())
        assert "empty_bench" in eval_suite_names()
        assert get_eval_suite("empty_bench").name == "empty_bench"
        with pytest.raises(UsageError, match="--categories"):  # it has no categories to choose among
            EvalSettings(model="m", benchmark="empty_bench", categories=["x"]).validate()
        with pytest.raises(ValueError, match="already registered"):
            register_eval_suite(Empty())
    finally:
        suites._SUITES.pop("empty_bench", None)


def test_an_unknown_benchmark_names_the_known_ones():
    with pytest.raises(UsageError, match="bfcl, tau2, textworld"):
        EvalSettings(model="m", benchmark="no_such_bench").validate()


def test_trajtunes_own_plug_ins_resolve_to_what_they_name():
    """BFCL and TextWorld are declared like a third party's entry points, and each reference loads."""
    from trajtune.envs.base import Environment

    for name in plugins.BUILTIN[plugins.ENVS]:
        assert issubclass(plugins.load(plugins.ENVS, name), Environment)
    for name in plugins.BUILTIN[plugins.EVAL_SUITES]:
        suite = get_eval_suite(name)
        assert isinstance(suite, EvalSuite) and suite.name == name
    assert get_eval_suite("bfcl").takes_categories and not get_eval_suite("textworld").takes_categories


def test_an_installed_package_cannot_replace_a_built_in_plug_in(monkeypatch):
    fake = [EntryPoint("textworld", "elsewhere:Impostor", plugins.ENVS)]
    monkeypatch.setattr(plugins.metadata, "entry_points", lambda group: fake if group == plugins.ENVS else [])
    assert plugins.references(plugins.ENVS)["textworld"] == plugins.BUILTIN[plugins.ENVS]["textworld"]


# --------------------------------------------------------------------------------------------
# the layering the plug-in point exists for

SRC = Path(trajtune.__file__).parent


def _imports(path: Path) -> list[str]:
    """Every module an ``import`` in ``path`` names (function-local ones included), absolute."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    pkg = ".".join(path.relative_to(SRC.parent).with_suffix("").parts)
    if path.name == "__init__.py":
        pkg += ".__init__"
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(pkg.split(".")[: -node.level] + ([node.module] if node.module else []))
            out += [base] + [f"{base}.{a.name}" for a in node.names]
    return out


IMPORT_STRING = re.compile(r"^trajtune\.plugins\.[\w.]+(:[\w.]+)?$")  # "module" or "module:attr"


def _strings(path: Path) -> list[str]:
    return [n.value for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def test_no_module_outside_the_plug_ins_imports_one_by_name():
    """Only ``trajtune.plugins`` itself (the list of names) is imported from outside; a plug-in's
    module is reached through its reference, never an import or an import string elsewhere."""
    offenders = []
    for path in SRC.rglob("*.py"):
        if (SRC / "plugins") in path.parents:
            continue
        offenders += [f"{path.relative_to(SRC)}: import {m}" for m in _imports(path)
                      if m.startswith("trajtune.plugins.") and m not in ("trajtune.plugins.ENVS", "trajtune.plugins.EVAL_SUITES")]
        offenders += [f"{path.relative_to(SRC)}: {s!r}" for s in _strings(path) if IMPORT_STRING.match(s)]
    assert offenders == []


def test_the_environment_protocol_imports_no_registry_and_envs_modules_not_their_package():
    base = [m for m in _imports(SRC / "envs" / "base.py") if m.startswith("trajtune")]
    assert all(m.split(".")[1] in ("errors", "schema") for m in base), base
    submodules = {p.stem for p in (SRC / "envs").iterdir()} | {"adapters"}
    for path in (SRC / "envs").rglob("*.py"):
        if path.name == "__init__.py" and path.parent == SRC / "envs":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "trajtune.envs":
                assert all(a.name in submodules for a in node.names), f"{path.name} imports the envs package"
            assert not (isinstance(node, ast.Import) and any(a.name == "trajtune.envs" for a in node.names))


def test_environments_and_eval_import_nothing_from_safety():
    for layer in ("envs", "eval"):
        for path in (SRC / layer).rglob("*.py"):
            bad = [m for m in _imports(path) if m.startswith("trajtune.safety")]
            assert bad == [], f"{path.relative_to(SRC)} imports {bad}"


def test_a_plug_in_that_cannot_be_imported_is_a_user_error_naming_it_and_is_left_out_of_the_list(monkeypatch):
    from trajtune.errors import EnvError

    broken = {plugins.ENVS: [EntryPoint("broken_world", "no_such_module_xyz:World", plugins.ENVS)],
              plugins.EVAL_SUITES: [EntryPoint("broken_bench", "no_such_module_xyz:Bench", plugins.EVAL_SUITES)]}
    monkeypatch.setattr(plugins.metadata, "entry_points", lambda group: broken.get(group, []))
    with pytest.raises(EnvError, match="broken_world.*no_such_module_xyz:World.*cannot be loaded"):
        make_env("broken_world")
    assert "broken_world" not in list_envs()
    with pytest.raises(UsageError, match="broken_bench.*cannot be loaded"):
        EvalSettings(model="m", benchmark="broken_bench").validate()


def test_the_missing_nltk_resource_is_read_from_the_plain_or_coloured_banner():
    from trajtune.plugins import missing_nltk_resource

    plain = LookupError("\n****\n  Resource 'words' not found.\n  Please use the NLTK Downloader\n****")
    coloured = LookupError("\n****\n  Resource \x1b[93mwords\x1b[0m not found.\n  Please use the NLTK Downloader")
    assert missing_nltk_resource(plain) == "words" and missing_nltk_resource(coloured) == "words"
    assert missing_nltk_resource(LookupError("unknown encoding: foo")) is None
    assert missing_nltk_resource(ValueError("Resource 'words' not found")) is None  # only NLTK's LookupError
