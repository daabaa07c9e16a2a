"""The documentation a user is pointed to exists in the repository, and agrees with the code."""

from __future__ import annotations

import re
from pathlib import Path

import typer
from typer.testing import CliRunner

from trajtune.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
DOC_REF = re.compile(r"(?<![\w/.-])((?:\.\./)*[\w-]+(?:/[\w.-]+)*\.(?:md|yaml|jinja))\b")


def _command_paths(group: object, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [prefix]
    for name, cmd in getattr(group, "commands", {}).items():
        if getattr(cmd, "commands", None):
            out += _command_paths(cmd, prefix + (name,))
        else:
            out.append(prefix + (name,))
    return out


def test_every_file_a_help_text_names_exists():
    runner = CliRunner()
    paths = _command_paths(typer.main.get_command(app))
    assert ("eval",) in paths and ("data", "validate") in paths
    named: set[str] = set()
    for p in paths:
        r = runner.invoke(app, [*p, "--help"], terminal_width=400)
        assert r.exit_code == 0, p
        named |= set(DOC_REF.findall(r.output))
    assert "docs/architecture.md" in named  # the exit-code table is referenced from `trajtune --help`
    # Documentation pages and example files must ship with the repository; other names in help texts
    # are files a run writes (config.yaml, demo_config.yaml) or the user's own paths (runs/, data/).
    shipped = {n for n in named if n.endswith(".md") or n.startswith(("docs/", "examples/"))}
    assert "docs/eval.md" in shipped
    missing = sorted(n for n in shipped if not (ROOT / n).exists())
    assert not missing, missing


def test_docs_named_in_code_readme_and_docs_exist_and_nothing_points_outside():
    files = [*ROOT.joinpath("src").rglob("*.py"), ROOT / "README.md", *ROOT.joinpath("docs").glob("*.md"),
             *ROOT.joinpath("examples").glob("*.yaml"), ROOT / "Makefile"]
    for f in files:
        text = f.read_text(encoding="utf-8")
        assert "../shared" not in text and "shared/design" not in text, f
        for name in re.findall(r"\b(docs/[\w.-]+\.md)\b", text):
            assert (ROOT / name).exists(), (f, name)
        if f.parent.name == "docs":  # relative links between docs pages
            for target in re.findall(r"\]\(([\w.-]+\.md)\)", text):
                assert (f.parent / target).exists(), (f, target)
        for bare in ("FORMATS.md", "ALGORITHMS.md", "ARCHITECTURE.md"):
            assert bare not in text, (f, bare)


def test_formats_doc_lists_every_validation_rule_and_format():
    from trajtune.formats import list_formats
    from trajtune.validate import RULES

    doc = (ROOT / "docs" / "formats.md").read_text()
    for rule in RULES.values():
        assert f"| `{rule.id}` | {rule.name} |" in doc, rule.id
    for name in list_formats():
        assert f"`{name}`" in doc, name


def test_algorithms_doc_names_every_estimator_aggregation_and_termination_choice():
    import typing

    from trajtune.algorithms.advantages import Estimator
    from trajtune.algorithms.episode_transforms import DEFAULT_TERMINATION_POLICY, TerminationPolicy
    from trajtune.algorithms.policy_gradient import Aggregation

    doc = (ROOT / "docs" / "algorithms.md").read_text()
    for lit in (Estimator, Aggregation, TerminationPolicy):
        for v in typing.get_args(lit):
            assert f"`{v}`" in doc, v
    for termination, action in DEFAULT_TERMINATION_POLICY.items():
        row = next(ln for ln in doc.splitlines() if f"`{termination}`" in ln and ln.startswith("|"))
        assert f"`{action}`" in row.split("|")[2], (termination, action)
