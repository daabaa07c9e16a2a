"""`trajtune data …`: validate, convert, inspect, mix, split and dedup trajectory files.

Commands are thin: the logic lives in ``trajtune.formats`` and ``trajtune.validate``. Every command
streams its input, writes outputs atomically and refuses to replace an existing output without
``--overwrite``. User errors are ``trajtune.errors.UserError``s (one line and the documented exit
code, see ``trajtune --help``), never a traceback. Every output is named with ``--out/-o``.
(A ``generate`` command — synthesising trajectories from environments — is added by another module.)
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import statistics
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import typer

from trajtune.errors import DataError, OutputError, UsageError, require_at_least, require_input
from trajtune.formats import LoadStats, canonical_json, get_format, iter_records
from trajtune.formats._io import DEFAULT_MAX_LINE_BYTES, input_problem, open_data
from trajtune.schema import AtomicJsonlWriter, RecordError, Trajectory, atomic_write_text, iter_jsonl, parse_trajectory

data_app = typer.Typer(
    help="Validate, convert and prepare trajectory datasets.\n\nExample: trajtune data validate data.jsonl",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

FromOpt = typer.Option(None, "--from", "-f", help="Input format (auto-detected from the first record when omitted).")
OverwriteOpt = typer.Option(False, "--overwrite", help="Replace an existing output file.")
SkipOpt = typer.Option(False, "--skip-invalid", help="Skip invalid records (counted and reported) instead of stopping.")
MaxLineOpt = typer.Option(DEFAULT_MAX_LINE_BYTES // (1024 * 1024), "--max-line-mb", help="Longest accepted line, in MiB.")


@contextmanager
def _path_errors(skippable: bool = False) -> Iterator[None]:
    """An input path that is a directory or unreadable is a data error, reported with its name;
    ``skippable``: the command has ``--skip-invalid``, so a bad record's message says so."""
    try:
        yield
    except RecordError as e:
        if not skippable:
            raise
        raise DataError(f"{e}\n(pass --skip-invalid to skip invalid records; they are counted and reported)") from None
    except (IsADirectoryError, PermissionError) as e:
        raise DataError(f"{e.filename}: {e.strerror}") from None


def _input(path: Path, *, records: bool = True) -> Path:
    """The same check, message and exit code for a missing or unreadable input file in every command
    (gzip files are fine). ``records``: a file with no records is an error too (E104), before an
    empty output is written; ``data validate`` reports it as a finding instead."""
    require_input(path)
    why = input_problem(path)
    if why is not None:
        raise DataError(why)
    if records and not _has_records(path):
        from trajtune.validate import RULES  # as record_check: validate loads every converter

        rule = RULES["E104"]
        raise DataError(f"{path}: no records in file (E104 {rule.name}); {rule.hint}")
    return path


def _has_records(path: Path) -> bool:
    """Whether any line holds something other than whitespace (reads up to the first such line)."""
    with open_data(path) as f:
        return any(line.strip() for line in f)


def _format(name: str) -> Any:
    """The converter for ``name``; an unknown name is a usage error (``get_format`` raises KeyError)."""
    try:
        return get_format(name)
    except KeyError as e:
        raise UsageError(str(e.args[0]) if e.args else str(e)) from None


def _valid(path: Path) -> Any:
    """The validation rules as a record check, so outputs hold only what `data validate` accepts."""
    # lazy: the CLI's start-up loads only the command modules, not what they run
    from trajtune.validate import record_check

    return record_check(path)


def _print_warnings(check: Any, path: Path) -> None:
    """The validation warnings the records passed with (``check`` from ``_valid``), as `data validate`
    names them: duplicate ids and double-encoded arguments are not silently written back out."""
    summary = check.summary()
    if summary:
        typer.echo(f"warnings in {path} (records affected): {summary}; `trajtune data validate {path}` shows each")


def _check_output(out: Path, overwrite: bool, inputs: list[Path]) -> None:
    if out.is_dir():
        raise OutputError(f"cannot write {out}: it is a directory; name a file inside it")
    if out.exists() and not overwrite:
        raise OutputError(f"{out} exists; pass --overwrite to replace it")
    for i in inputs:
        if i.exists() and out.exists() and i.resolve() == out.resolve():
            raise UsageError(f"output {out} is also an input; write to a new file")


def _exporter(to: str) -> Callable[[Trajectory], tuple[Any, Any]]:
    return _format(to).from_ir


def _print_skips(stats: LoadStats, label: str = "") -> None:
    if stats.skipped:
        rules = ", ".join(f"{r}×{n}" for r, n in sorted(stats.by_rule.items()))
        typer.echo(f"skipped {stats.skipped} invalid record(s){label} ({rules})", err=True)
        for e in stats.errors[:5]:
            typer.echo(f"  {e}", err=True)
        if stats.skipped > 5:
            typer.echo(f"  … {stats.skipped - 5} more", err=True)


# ----------------------------------------------------------------------------------- validate


@data_app.command()
def validate(
    files: list[Path] = typer.Argument(..., help="JSONL files to check (plain or gzipped)."),
    format: Optional[str] = FromOpt,
    strict: bool = typer.Option(False, "--strict", help="Also fail (exit 1) on warnings."),
    as_json: bool = typer.Option(False, "--json", help="Print findings as JSON instead of a table."),
    export_format: Optional[str] = typer.Option(None, "--for", help="Target the data is meant for (e.g. openai): tightens order rules."),
    no_sft: bool = typer.Option(False, "--no-sft", help="Do not warn when a record does not end with an assistant turn."),
    max_rows: int = typer.Option(200, "--max-rows", help="Most findings shown in the table (all are counted)."),
    max_line_mb: int = MaxLineOpt,
) -> None:
    """Check trajectory files against the validation rules (docs/formats.md); exit 1 on any error.

    Example: trajtune data validate train.jsonl --strict
    """
    # lazy: the CLI's start-up loads only the command modules, not what they run
    from trajtune.validate import iter_findings

    report: list[dict[str, Any]] = []
    rows: list[Any] = []
    any_bad = False
    with _path_errors():
        if format:
            _format(format)
        for path in files:
            _input(path, records=False)  # an empty file is reported as finding E104 with the others
            stats: dict[str, int] = {}
            counts = Counter()
            findings = []
            for f in iter_findings(path, format, export_format=export_format, sft=not no_sft,
                                   max_line_bytes=max_line_mb * 1024 * 1024, stats=stats):
                counts[f.severity] += 1
                if as_json:
                    findings.append(f.to_dict())
                elif len(rows) < max_rows:
                    rows.append(f)
            bad = counts["E"] > 0 or (strict and counts["W"] > 0)
            any_bad |= bad
            report.append({"file": str(path), "records": stats.get("records", 0), "valid": stats.get("valid", 0),
                           "errors": counts["E"], "warnings": counts["W"], "ok": not bad, "findings": findings})
    if as_json:
        typer.echo(json.dumps({"ok": not any_bad, "files": report}, ensure_ascii=False, indent=1))
    else:
        _print_findings_table(rows, report, max_rows)
    if any_bad:
        raise typer.Exit(1)


def _print_findings_table(rows: list[Any], report: list[dict[str, Any]], max_rows: int) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(soft_wrap=False, width=max(120, Console().width))
    if rows:
        t = Table(show_lines=False, header_style="bold")
        for col in ("sev", "rule", "location", "trajectory", "msg", "problem", "fix"):
            t.add_column(col, overflow="fold")
        for f in rows:
            t.add_row("[red]E[/red]" if f.severity == "E" else "[yellow]W[/yellow]", f"{f.rule} {f.name}",
                      f"{f.file}:{f.line}" if f.line is not None else str(f.file), f.trajectory_id or "",
                      "" if f.message_index is None else str(f.message_index), f.message, f.hint)
        console.print(t)
    total = sum(r["errors"] + r["warnings"] for r in report)
    if total > len(rows) and rows:
        console.print(f"(showing {len(rows)} of {total} findings; use --json for all)")
    for r in report:
        status = "[green]ok[/green]" if r["ok"] else "[red]FAILED[/red]"
        console.print(f"{r['file']}: {r['records']} records, {r['valid']} valid, {r['errors']} errors, "
                      f"{r['warnings']} warnings — {status}")


# ----------------------------------------------------------------------------------- convert


@data_app.command()
def convert(
    input: Path = typer.Argument(..., help="Input JSONL file (plain or gzipped, e.g. data.jsonl.gz)."),
    output: Path = typer.Option(..., "--out", "-o", help="Output JSONL file (written atomically)."),
    to: str = typer.Option(..., "--to", "-t", help="Output format: ir, openai, adp, sharegpt, xlam, react, hermes, …"),
    format: Optional[str] = FromOpt,
    skip_invalid: bool = SkipOpt,
    overwrite: bool = OverwriteOpt,
    max_line_mb: int = MaxLineOpt,
) -> None:
    """Convert a trajectory file between formats, declaring what each conversion loses.

    Records are checked with the same rules as `data validate`: any error stops the conversion
    (nothing is written) unless --skip-invalid, which leaves them out and reports them. Input may
    be gzipped (.jsonl.gz).

    Example: trajtune data convert agent.jsonl --from sharegpt --to openai -o agent.openai.jsonl
    """
    with _path_errors(skippable=True):
        _input(input)
        _check_output(output, overwrite, [input])
        export = _exporter(to)
        if format:
            _format(format)
        stats = LoadStats()
        losses = Counter()
        warnings = 0
        check = _valid(input)
        with AtomicJsonlWriter(output, overwrite=overwrite) as w:
            for _, traj, rep in iter_records(input, format, skip_invalid=skip_invalid, stats=stats,
                                             max_line_bytes=max_line_mb * 1024 * 1024, check=check):
                rec, rep2 = export(traj)
                for loss in rep2.losses:
                    losses[loss] += 1
                warnings += len(rep.warnings) + len(rep2.warnings)
                w.write(rec)
    typer.echo(f"converted {w.count} record(s) {stats.format} -> {to}: {output}")
    if stats.losses or losses:
        all_losses = stats.losses + losses
        typer.echo("declared losses (records affected): " + ", ".join(f"{k}={v}" for k, v in sorted(all_losses.items())))
    if warnings:
        typer.echo(f"{warnings} conversion warning(s); run `trajtune data validate` for details")
    _print_warnings(check, input)
    _print_skips(stats)


# ----------------------------------------------------------------------------------- stats


def _percentile(xs: list[int], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _token_length(tok: Any, traj: Trajectory) -> int:
    """Tokens of the trajectory as the model would see it; falls back to plain text without a template."""
    msgs: list[dict[str, Any]] = []
    for m in traj.messages:
        d: dict[str, Any] = {"role": m.role, "content": m.text()}
        if m.tool_calls:
            d["tool_calls"] = [{"type": "function", "function": {"name": c.name, "arguments": c.arguments or {}}}
                               for c in m.tool_calls]
        msgs.append(d)
    if getattr(tok, "chat_template", None):
        # Render to text, then tokenize as training does (ChatRenderer.encode). Not tokenize=True:
        # transformers 5 returns a BatchEncoding there, whose len() is its number of keys.
        try:
            text = tok.apply_chat_template(msgs, tools=[t.to_openai() for t in traj.tools] or None, tokenize=False)
        except Exception:  # a template that rejects this shape: count the plain text instead
            text = None
        if isinstance(text, str):
            return len(tok(text, add_special_tokens=False)["input_ids"])
    text = "\n".join(filter(None, [m.thought or "" for m in traj.messages] + [m["content"] for m in msgs] +
                            [json.dumps(c["function"], ensure_ascii=False) for m in msgs for c in m.get("tool_calls", [])]))
    return len(tok(text, add_special_tokens=False)["input_ids"])


@data_app.command()
def stats(
    input: Path = typer.Argument(..., help="Input JSONL file (plain or gzipped, e.g. data.jsonl.gz)."),
    format: Optional[str] = FromOpt,
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Tokenizer for token lengths: a model alias, .gguf file or local path."),
    skip_invalid: bool = typer.Option(True, "--skip-invalid/--no-skip-invalid", help="Count invalid records instead of stopping."),
    as_json: bool = typer.Option(False, "--json", help="Print the statistics as JSON."),
    top: int = typer.Option(20, "--top", help="Tools shown in the usage histogram."),
) -> None:
    """Summarise a trajectory file: records, turns, tool usage, argument validity, token lengths.

    Example: trajtune data stats train.jsonl --model ./tokenizer
    """
    tok = None
    with _path_errors():
        _input(input)
        if model:
            tok = _stats_tokenizer(model)
        ls = LoadStats()
        counts = _Counts()
        for _, traj, _ in iter_records(input, format, skip_invalid=skip_invalid, stats=ls):
            counts.add(traj, tok)
    out = _stats_summary(input, ls, counts, top, tokens=tok is not None)
    if as_json:
        typer.echo(json.dumps(out, ensure_ascii=False, indent=1))
        return
    _print_stats(input, ls, counts, out, top)


def _stats_tokenizer(model: str) -> Any:
    """The tokenizer for token lengths; one that cannot be loaded is the user's to fix (exit 4), not a bug."""
    # lazy: the CLI's start-up loads only the command modules, not what they run
    from trajtune.models.errors import ModelLoadError
    from trajtune.models.loading import read_tokenizer
    from trajtune.models.resolve import resolve_model

    try:
        return read_tokenizer(resolve_model(model).path, user_errors=())
    except ModelLoadError as e:  # says its own fix
        raise ModelLoadError(f"could not load tokenizer {model!r}: {e}") from None
    except Exception as e:  # missing/invalid tokenizer is a user error
        raise ModelLoadError(f"could not load tokenizer {model!r}: {type(e).__name__}: "
                             f"{str(e).splitlines()[0][:200]}") from None


@dataclass
class _Counts:
    """What ``data stats`` counts over a file, one record at a time (the file is streamed)."""

    roles: Counter[str] = field(default_factory=Counter)
    tools: Counter[str] = field(default_factory=Counter)
    arg_status: Counter[str] = field(default_factory=Counter)
    turns: list[int] = field(default_factory=list)
    msgs_per: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    with_calls: int = 0

    def add(self, traj: Trajectory, tok: Any) -> None:
        # lazy: the CLI's start-up loads only the command modules, not what they run
        from trajtune.validate import validate_trajectory

        self.msgs_per.append(len(traj.messages))
        self.turns.append(sum(1 for m in traj.messages if m.role == "assistant"))
        has = False
        for m in traj.messages:
            self.roles[m.role] += 1
            for c in m.tool_calls or []:
                has = True
                self.tools[c.name] += 1
        self.with_calls += has
        # one finding per call for these rules, so counts are calls
        by_rule = Counter(f.rule for f in validate_trajectory(traj, sft=False)
                          if f.rule in ("E220", "E221", "W222", "W223"))
        n_calls = sum(len(m.tool_calls or []) for m in traj.messages)
        self.arg_status["invalid_json_or_type"] += by_rule["E220"] + by_rule["E221"]
        self.arg_status["double_encoded"] += by_rule["W222"]
        self.arg_status["schema_violation"] += by_rule["W223"]
        self.arg_status["calls"] += n_calls
        if tok is not None:
            self.tokens.append(_token_length(tok, traj))


def _stats_summary(input: Path, ls: LoadStats, c: _Counts, top: int, *, tokens: bool) -> dict[str, Any]:
    """The statistics as the JSON ``--json`` prints (the table shows the same numbers)."""
    n = len(c.msgs_per)
    out: dict[str, Any] = {
        "file": str(input), "format": ls.format, "records": n, "invalid_records": ls.skipped,
        "invalid_by_rule": dict(ls.by_rule),
        "messages": {"total": sum(c.msgs_per), "mean": round(statistics.fmean(c.msgs_per), 2) if n else 0, "by_role": dict(c.roles)},
        "assistant_turns": {"mean": round(statistics.fmean(c.turns), 2) if n else 0, "max": max(c.turns, default=0)},
        "records_with_tool_calls": c.with_calls,
        "tool_calls": c.arg_status["calls"],
        "tool_usage": dict(c.tools.most_common(top)),
        "arguments": {"calls": c.arg_status["calls"], "invalid": c.arg_status["invalid_json_or_type"],
                      "double_encoded": c.arg_status["double_encoded"], "schema_violations": c.arg_status["schema_violation"]},
    }
    if tokens:
        t = c.tokens
        out["tokens"] = {"min": min(t, default=0), "mean": round(statistics.fmean(t), 1) if t else 0,
                         "p50": _percentile(t, 0.5), "p95": _percentile(t, 0.95), "max": max(t, default=0),
                         "total": sum(t)}
    return out


def _print_stats(input: Path, ls: LoadStats, c: _Counts, out: dict[str, Any], top: int) -> None:
    """The summary table, then a histogram of tool usage."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(100, Console().width))
    n = out["records"]
    t = Table(title=f"{input} ({ls.format})", show_header=False)
    t.add_column("k")
    t.add_column("v")
    t.add_row("records", f"{n} (+{ls.skipped} invalid)" if ls.skipped else str(n))
    t.add_row("messages", f"{out['messages']['total']} (mean {out['messages']['mean']}/record) " +
              ", ".join(f"{k}={v}" for k, v in sorted(c.roles.items())))
    t.add_row("assistant turns", f"mean {out['assistant_turns']['mean']}, max {out['assistant_turns']['max']}")
    t.add_row("tool calls", f"{c.arg_status['calls']} in {c.with_calls} records")
    a = out["arguments"]
    t.add_row("arguments", f"invalid {a['invalid']}, double-encoded {a['double_encoded']}, schema violations {a['schema_violations']}")
    if "tokens" in out:
        tk = out["tokens"]
        t.add_row("tokens", f"min {tk['min']}, mean {tk['mean']}, p50 {tk['p50']:.0f}, p95 {tk['p95']:.0f}, max {tk['max']}")
    console.print(t)
    if c.tools:
        h = Table(title="tool usage")
        h.add_column("tool")
        h.add_column("calls", justify="right")
        h.add_column("")
        peak = max(c.tools.values())
        for name, k in c.tools.most_common(top):
            h.add_row(name, str(k), "█" * max(1, round(30 * k / peak)))
        console.print(h)


# ----------------------------------------------------------------------------------- mix


def _parse_source(spec: str) -> tuple[Path, float]:
    path, sep, w = spec.rpartition(":")
    if not sep or not path:
        raise UsageError(f"source {spec!r} must be PATH:WEIGHT, e.g. a.jsonl:0.7")
    try:
        weight = float(w)
    except ValueError:
        raise UsageError(f"weight {w!r} in {spec!r} is not a number") from None
    if not weight > 0:
        raise UsageError(f"weight in {spec!r} must be > 0")
    return Path(path), weight


@data_app.command()
def mix(
    sources: list[str] = typer.Argument(..., help="Sources as PATH:WEIGHT (weights are normalised)."),
    output: Path = typer.Option(..., "--out", "-o", help="Output JSONL file."),
    seed: int = typer.Option(0, "--seed", help="Random seed (same seed + inputs = same output)."),
    n: Optional[int] = typer.Option(None, "--n", help="Records to write (default: the most the weights allow without repeats)."),
    replace: bool = typer.Option(False, "--replace", help="Sample with replacement when a source is too small for --n."),
    to: str = typer.Option("ir", "--to", "-t", help="Output format."),
    format: Optional[str] = FromOpt,
    skip_invalid: bool = SkipOpt,
    overwrite: bool = OverwriteOpt,
) -> None:
    """Mix several datasets with weights (FireAct-style multi-method / multi-task mixing).

    Example: trajtune data mix react.jsonl:0.7 cot.jsonl:0.3 -o mixed.jsonl --seed 1
    """
    with _path_errors(skippable=True):
        parsed = [_parse_source(s) for s in sources]
        for p, _ in parsed:
            _input(p)
        _check_output(output, overwrite, [p for p, _ in parsed])
        export = _exporter(to)
        total_w = sum(w for _, w in parsed)
        # pass 1: count valid records per source (streaming)
        counts = []
        for p, _ in parsed:
            ls = LoadStats()
            check = _valid(p)
            counts.append(sum(1 for _ in iter_records(p, format, skip_invalid=skip_invalid, stats=ls, check=check)))
            _print_warnings(check, p)
            _print_skips(ls, f" in {p}")
        if n is None:
            n = min(int(c * total_w / w) for c, (_, w) in zip(counts, parsed))
        rng = random.Random(seed)
        chosen: list[list[int]] = []
        for c, (p, w) in zip(counts, parsed):
            k = round(n * w / total_w)
            if k > c and not replace:
                raise UsageError(f"{p} has {c} records but {k} are needed for --n {n}; lower --n or pass --replace")
            if c == 0 and k > 0:
                raise DataError(f"{p} has no valid records")
            idx = sorted(rng.choices(range(c), k=k)) if k > c else sorted(rng.sample(range(c), k))
            chosen.append(idx)
        picked: list[Trajectory] = []
        for (p, _), idx in zip(parsed, chosen):
            want = Counter(idx)
            for i, (_, traj, _) in enumerate(iter_records(p, format, skip_invalid=skip_invalid, stats=LoadStats(),
                                                          check=_valid(p))):
                for _ in range(want.get(i, 0)):
                    t = traj.model_copy(deep=True)
                    if t.provenance is not None and t.provenance.dataset is None:
                        t.provenance.dataset = p.stem
                    picked.append(t)
        rng.shuffle(picked)
        with AtomicJsonlWriter(output, overwrite=overwrite) as wtr:
            for t in picked:
                wtr.write(export(t)[0])
    parts = ", ".join(f"{p.name}={len(i)}" for (p, _), i in zip(parsed, chosen))
    typer.echo(f"mixed {wtr.count} record(s) ({parts}) -> {output}")


# ----------------------------------------------------------------------------------- split


def _bucket(key: str, seed: int) -> float:
    h = hashlib.sha256(f"{seed}:{key}".encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(h[:8], "big") / 2**64


@data_app.command()
def split(
    input: Path = typer.Argument(..., help="Input JSONL file (plain or gzipped, e.g. data.jsonl.gz)."),
    out_dir: Path = typer.Option(..., "--out", "-o", help="Directory for the split files (NAME.jsonl)."),
    ratios: str = typer.Option("train=0.9,val=0.1", "--ratios", help="NAME=FRACTION,… (normalised)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the id hash."),
    to: str = typer.Option("ir", "--to", "-t", help="Output format."),
    format: Optional[str] = FromOpt,
    skip_invalid: bool = SkipOpt,
    overwrite: bool = OverwriteOpt,
) -> None:
    """Split a file by a seeded hash of each trajectory id: streaming and stable when data grows.

    Example: trajtune data split all.jsonl -o splits/ --ratios train=0.8,val=0.1,test=0.1
    """
    with _path_errors(skippable=True):
        parts: list[tuple[str, float]] = []
        for item in ratios.split(","):
            name, sep, frac = item.partition("=")
            if not sep or not re.fullmatch(r"[\w.-]+", name.strip()):
                raise UsageError(f"bad --ratios entry {item!r}; use NAME=FRACTION")
            try:
                parts.append((name.strip(), float(frac)))
            except ValueError:
                raise UsageError(f"bad fraction in {item!r}") from None
        if any(f < 0 for _, f in parts) or sum(f for _, f in parts) <= 0:
            raise UsageError("fractions must be >= 0 and sum to more than 0")
        _input(input)
        outs = [out_dir / f"{name}.jsonl" for name, _ in parts]
        for o in outs:
            _check_output(o, overwrite, [input])
        export = _exporter(to)
        total = sum(f for _, f in parts)
        edges = []
        acc = 0.0
        for _, f in parts:
            acc += f / total
            edges.append(acc)
        ls = LoadStats()
        writers = [AtomicJsonlWriter(o, overwrite=overwrite) for o in outs]
        check = _valid(input)
        try:
            for _, traj, _ in iter_records(input, format, skip_invalid=skip_invalid, stats=ls, check=check):
                b = _bucket(traj.id, seed)
                k = next((i for i, e in enumerate(edges) if b < e), len(edges) - 1)
                writers[k].write(export(traj)[0])
        except BaseException:
            for w in writers:
                w.__exit__(RuntimeError, None, None)
            raise
        for w in writers:
            w.__exit__(None, None, None)
    typer.echo("split: " + ", ".join(f"{name}={w.count}" for (name, _), w in zip(parts, writers)) + f" -> {out_dir}")
    _print_warnings(check, input)
    _print_skips(ls)


# ----------------------------------------------------------------------------------- dedup


_WS = re.compile(r"\s+")


def dedup_key(traj: Trajectory, mode: str) -> bytes:
    """Hash of what makes two trajectories the same example (ids/provenance ignored)."""
    if mode == "exact":
        body = canonical_json({"messages": [m.model_dump(mode="json", exclude_none=True) for m in traj.messages],
                               "tools": [t.model_dump(mode="json", exclude={"raw", "extra"}) for t in traj.tools]})
        # call ids are bookkeeping, not content
        body = re.sub(r'"(id|tool_call_id)":"[^"]*"', "", body)
    else:
        parts = []
        for m in traj.messages:
            txt = _WS.sub(" ", (m.text() or "")).strip().lower()
            calls = ";".join(f"{c.name}:{canonical_json(c.arguments) if c.arguments is not None else (c.arguments_raw or c.input or '')}"
                             for c in m.tool_calls or [])
            parts.append(f"{m.role}|{txt}|{calls.lower()}")
        body = "\n".join(parts)
    return hashlib.blake2b(body.encode("utf-8", "surrogatepass"), digest_size=16).digest()


@data_app.command()
def dedup(
    input: Path = typer.Argument(..., help="Input JSONL file (plain or gzipped, e.g. data.jsonl.gz)."),
    output: Path = typer.Option(..., "--out", "-o", help="Output JSONL file."),
    mode: str = typer.Option("normalized", "--mode", help="exact (same messages and calls) or normalized (case/whitespace-insensitive text)."),
    to: str = typer.Option("ir", "--to", "-t", help="Output format."),
    format: Optional[str] = FromOpt,
    skip_invalid: bool = SkipOpt,
    overwrite: bool = OverwriteOpt,
) -> None:
    """Drop duplicate trajectories, keeping the first occurrence (memory: 16 bytes per record).

    Example: trajtune data dedup all.jsonl -o unique.jsonl --mode normalized
    """
    if mode not in ("exact", "normalized", "normalised"):
        raise UsageError(f"--mode must be exact or normalized, got {mode!r}")
    mode = "normalized" if mode == "normalised" else mode
    with _path_errors(skippable=True):
        _input(input)
        _check_output(output, overwrite, [input])
        export = _exporter(to)
        seen: set[bytes] = set()
        dropped = 0
        ls = LoadStats()
        check = _valid(input)
        with AtomicJsonlWriter(output, overwrite=overwrite) as w:
            for _, traj, _ in iter_records(input, format, skip_invalid=skip_invalid, stats=ls, check=check):
                k = dedup_key(traj, mode)
                if k in seen:
                    dropped += 1
                    continue
                seen.add(k)
                w.write(export(traj)[0])
    typer.echo(f"kept {w.count}, dropped {dropped} duplicate(s) ({mode}) -> {output}")
    _print_warnings(check, input)
    _print_skips(ls)


@data_app.command(name="filter")
def filter_(
    input: Path = typer.Argument(..., help="Input JSONL file (plain or gzipped)."),
    output: Path = typer.Option(..., "--out", "-o", help="Output JSONL file of the kept records."),
    consistency: bool = typer.Option(False, "--consistency", help="Remove records that repeat a failed call "
                                     "unchanged or answer on an unrecovered error."),
    errors: bool = typer.Option(False, "--errors", help="Remove records with any error turn (invalid call, error "
                                "observation, verifier flag)."),
    format_check: bool = typer.Option(False, "--format-check", help="Remove records with a validation error or "
                                      "arguments that violate their tool's schema."),
    min_turns: Optional[int] = typer.Option(None, "--min-turns", help="Remove records with fewer assistant turns."),
    max_turns: Optional[int] = typer.Option(None, "--max-turns", help="Remove records with more assistant turns."),
    max_chars: Optional[int] = typer.Option(None, "--max-chars", help="Remove records with more characters of text."),
    judge: Optional[str] = typer.Option(None, "--judge", help="An LLM judge: openai:URL or a local model; records "
                                        "scored under --judge-min-score are removed, judge failures keep the record."),
    judge_model: str = typer.Option("default", "--judge-model", help="With an openai: judge: the model name."),
    judge_rubric: Optional[str] = typer.Option(None, "--judge-rubric", help="A rubric file (default: 0-10)."),
    judge_min_score: float = typer.Option(5.0, "--judge-min-score", help="The lowest score a kept record may have."),
    rejected: Optional[Path] = typer.Option(None, "--rejected", help="Also write the removed records here, each "
                                            "with metadata.filter = {rule, detail}."),
    to: str = typer.Option("ir", "--to", "-t", help="Output format."),
    format: Optional[str] = FromOpt,
    skip_invalid: bool = SkipOpt,
    overwrite: bool = OverwriteOpt,
) -> None:
    """Remove low-quality records before training, naming the rule that removed each: stepwise
    consistency, mistakes, format, length, an LLM judge (the same filters as `data.filters` in SFT
    and RFT configs; docs/formats.md, Filtering data).

    Example: trajtune data filter logs.jsonl -o clean.jsonl --consistency --format-check --max-turns 20 --rejected removed.jsonl
    """
    from trajtune.config import FilterSpec
    from trajtune.filters import RULE_ORDER, apply_filters, make_filter_judge

    for flag, value in (("--min-turns", min_turns), ("--max-turns", max_turns), ("--max-chars", max_chars)):
        if value is not None:
            require_at_least((flag, value, 1))
    if not (consistency or errors or format_check or judge or min_turns or max_turns or max_chars):
        raise UsageError("name at least one filter: --consistency, --errors, --format-check, --min-turns, "
                         "--max-turns, --max-chars or --judge")
    if min_turns and max_turns and min_turns > max_turns:
        raise UsageError(f"--min-turns ({min_turns}) > --max-turns ({max_turns}): every record would be removed")
    given = {"consistency": consistency, "errors": errors, "format": format_check, "min_turns": min_turns,
             "max_turns": max_turns, "max_chars": max_chars, "judge": judge}
    if judge is not None:
        given.update(judge_model=judge_model, judge_rubric=judge_rubric, judge_min_score=judge_min_score)
    elif judge_model != "default" or judge_rubric is not None or judge_min_score != 5.0:
        raise UsageError("--judge-model / --judge-rubric / --judge-min-score only apply with --judge")
    spec = FilterSpec.model_validate({k: v for k, v in given.items() if v not in (None, False)})
    with _path_errors(skippable=True):
        _input(input)
        _check_output(output, overwrite, [input])
        if rejected is not None:
            _check_output(rejected, overwrite, [input, output])
        export = _exporter(to)
        scorer = make_filter_judge(spec)  # an unreachable endpoint is refused before anything is written
        ls = LoadStats()
        check = _valid(input)
        records = (traj for _, traj, _ in iter_records(input, format, skip_invalid=skip_invalid, stats=ls, check=check))
        with AtomicJsonlWriter(output, overwrite=overwrite) as w:
            if rejected is None:
                kept, report = apply_filters(records, spec, scorer)
            else:
                with AtomicJsonlWriter(rejected, overwrite=overwrite) as rw:
                    def keep_removed(t: Trajectory, rule: str, detail: str) -> None:
                        rw.write(export(t.model_copy(update={"metadata": {**t.metadata,
                                                                           "filter": {"rule": rule, "detail": detail}}}))[0])
                    kept, report = apply_filters(records, spec, scorer, keep_removed)
            for t in kept:
                w.write(export(t)[0])
    removed = sum(report.removed.values())
    typer.echo(f"kept {report.kept}, removed {removed} -> {output}" + (f" (removed: {rejected})" if rejected else ""))
    for rule in RULE_ORDER:
        if report.removed.get(rule):
            typer.echo(f"  {rule}: {report.removed[rule]}")
    if report.judge_failures:
        typer.echo(f"  the judge failed on {report.judge_failures} record(s); they were kept")
    _print_warnings(check, input)
    _print_skips(ls)


@data_app.command()
def pairs(
    input: Path = typer.Argument(..., help="Episodes JSONL: rollouts.jsonl of an rl run, episodes.jsonl of an eval, "
                                           "or any IR trajectories with an outcome."),
    output: Path = typer.Option(..., "--out", "-o", help="Output JSONL of preference pairs (docs/formats.md)."),
    max_per_task: int = typer.Option(2, "--max-per-task", help="Pairs per task at most."),
    seed: int = typer.Option(0, "--seed", help="Seed for choosing which successes and failures are paired."),
    overwrite: bool = OverwriteOpt,
) -> None:
    """Mine trajectory-level preference pairs (success ≻ failure of the same task) from episodes, for
    inspection or for `algorithm: dpo` with `dpo.pairs`.

    A task is an episode's id (the task id) together with its `step` (rl rollouts) and its metadata
    seed and split, so episodes of different tasks, or of the same task under different policies,
    are never paired. Failures by environment error or timeout are never the rejected side.

    Example: trajtune data pairs runs/rl-home/rollouts.jsonl -o pairs.jsonl --max-per-task 2
    """
    from types import SimpleNamespace

    # lazy: imports torch, which the CLI's start-up (`trajtune --help`) must not load
    from trajtune.algorithms.dpo import mine_trajectory_pairs, pairs_to_jsonl

    require_at_least(("--max-per-task", max_per_task, 1))
    with _path_errors():
        _input(input)
        _check_output(output, overwrite, [input])
        episodes = []
        for line, obj in iter_jsonl(input):
            step = obj.pop("step", None) if isinstance(obj, dict) else None
            t = parse_trajectory(obj, input, line)
            if t.outcome is None or t.outcome.success is None:
                raise RecordError(input, line, "the episode has no outcome.success; pairs need verified outcomes",
                                  rule="P305", record_id=t.id, hint="mine pairs from rl rollouts or eval episodes")
            key = "|".join(str(x) for x in (t.id, step, t.metadata.get("seed"), t.metadata.get("split")))
            episodes.append(SimpleNamespace(trajectory=t, task=SimpleNamespace(id=key), tokens=None))
        mined, counts = mine_trajectory_pairs(episodes, max_per_task, seed)
        if not mined:
            raise DataError(f"{input}: no pair: of {counts['tasks']} tasks, {counts['tasks_all_success']} always "
                            f"succeeded, {counts['tasks_all_fail']} always failed and {counts['tasks_env_failures']} "
                            "failed only by environment errors (a pair needs a success and a failure of one task)")
        out_pairs = [m.pair.model_copy(update={"task_id": m.pair.chosen.id}) for m in mined]
        atomic_write_text(output, pairs_to_jsonl(out_pairs))
    typer.echo(json.dumps({**counts, "output": str(output)}))


# ----------------------------------------------------------------------------------- plant-canaries


@data_app.command("plant-canaries")
def plant_canaries_cmd(
    input: Path = typer.Option(..., "--in", "-i", help="Input trajectory JSONL (IR; plain or gzipped)."),
    output: Path = typer.Option(..., "--out", "-o", help="Output JSONL: every record, n of them with a canary."),
    n: int = typer.Option(..., "--n", help="Records to plant a canary in (each gets its own secret)."),
    seed: int = typer.Option(0, "--seed", help="Seed choosing the records, the messages and the secrets."),
    prefix: str = typer.Option("The secret code is", "--prefix", help="The fixed text before each secret; the "
                                                                       "probe prompts with it."),
    where: str = typer.Option("auto", "--where", help="Message to plant in: auto (a tool observation, else a user "
                                                      "message), tool or user."),
    length: int = typer.Option(10, "--length", help="Characters per secret (lowercase letters and digits)."),
    canaries: Optional[Path] = typer.Option(None, "--canaries", help="Sidecar JSON listing prefix and secrets "
                                                                     "(default: canaries.json next to --out)."),
    overwrite: bool = OverwriteOpt,
) -> None:
    """Plant random canaries (a fixed prefix + a random secret) in n records, for the privacy probe.

    The planted records carry metadata.canary; the sidecar holds the prefix, the secrets and the
    context each was planted in. Fine-tune on --out, then run `trajtune probe privacy` (docs/probes.md).

    Example: trajtune data plant-canaries --in train.jsonl --out train.canaries.jsonl --n 20 --seed 1
    """
    # lazy: the CLI's start-up loads only the command modules, not what they run
    from trajtune.safety.canaries import plant_canaries

    sidecar_path = canaries if canaries is not None else output.parent / "canaries.json"
    with _path_errors():
        _input(input)
        _check_output(output, overwrite, [input])
        _check_output(sidecar_path, overwrite, [input, output])
        records = [traj for _, traj, _ in iter_records(input, None, check=_valid(input))]
        planted, doc = plant_canaries(records, n, seed, prefix=prefix, where=where, length=length)
        with AtomicJsonlWriter(output, overwrite=overwrite) as w:
            for traj in planted:
                w.write(traj)
        atomic_write_text(sidecar_path, json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    typer.echo(f"planted {n} canaries in {w.count} records -> {output} (secrets: {sidecar_path})")


if __name__ == "__main__":  # pragma: no cover
    data_app()
    sys.exit(0)
