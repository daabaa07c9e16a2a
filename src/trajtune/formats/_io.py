"""Streaming, crash-proof reading of JSONL: one bad line never stops the file.

``schema.iter_jsonl`` raises on the first bad line, which is right for trusted IR files. Data
tooling needs every problem of a file at once, bounded memory on huge lines, and a BOM warning,
so this reader yields an outcome per line instead of raising.

Datasets are often shipped gzipped (``*.jsonl.gz``): gzip input is recognised by its magic bytes
(not its name) and decompressed on the fly, so every reader (validate, convert, stats, training)
accepts it. Other compressions are named in the error instead of producing one "invalid UTF-8"
finding per binary line; a path that is missing or a directory is refused before reading.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trajtune.errors import DataError
from trajtune.schema import MAX_RECORD_DEPTH, depth_exceeds

DEFAULT_MAX_LINE_BYTES = 32 * 1024 * 1024  # a trajectory this big cannot be trained on anyway
_CHUNK = 1024 * 1024
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


@dataclass
class LineProblem:
    """Why one line could not be turned into a JSON value (rule id from ``trajtune.validate``)."""

    rule: str
    message: str
    hint: str


@dataclass
class Line:
    lineno: int
    value: Any = None
    problem: LineProblem | None = None
    bom: bool = False
    # True when the text holds a \\uD800-\\uDFFF escape: only then can a parsed string hold a
    # lone surrogate, so the (costly) walk over every string is skipped for all other lines.
    maybe_surrogate: bool = False
    # How many '{' and '[' the text holds: a bound on how deep any value in the record (or parsed
    # out of its strings by a converter) can nest, so depth walks are skipped for almost every line.
    brackets: int = 0


class InputFileError(DataError):
    """The input path cannot be read as a JSONL file at all (missing, a directory, another compression):
    a data error (one line, exit code 3) in every command."""


_GZIP_MAGIC = b"\x1f\x8b"
# Compressions we do not decompress: named so the user knows what to do instead.
_OTHER_MAGIC = {b"\x28\xb5\x2f\xfd": "zstd", b"\xfd7zXZ\x00": "xz", b"BZh": "bzip2", b"PK\x03\x04": "zip"}


def input_problem(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` cannot be read as a data file (one line naming it and what to pass), or None."""
    p = Path(path)
    if p.is_dir():
        inside = sorted(x.name for x in p.iterdir() if x.name.endswith((".jsonl", ".jsonl.gz")))[:3]
        eg = f" (e.g. {p / inside[0]})" if inside else ""
        return f"{p}: is a directory; pass a JSONL file (.jsonl or .jsonl.gz){eg}"
    if not p.exists():
        return f"{p}: no such file"
    if not p.is_file():
        return f"{p}: not a regular file; pass a JSONL file (.jsonl or .jsonl.gz)"
    return None


def check_input(path: str | os.PathLike[str]) -> Path:
    """``path`` as a Path if it is a readable data file; else :class:`InputFileError`."""
    why = input_problem(path)
    if why is not None:
        raise InputFileError(why)
    return Path(path)


def open_data(path: str | os.PathLike[str]) -> Any:
    """A binary file object over the (decompressed) bytes of ``path``; gzip by magic bytes."""
    p = check_input(path)
    with p.open("rb") as probe:
        head = probe.read(6)
    if head.startswith(_GZIP_MAGIC):
        return gzip.open(p, "rb")
    for magic, name in _OTHER_MAGIC.items():
        if head.startswith(magic):
            raise InputFileError(f"{p}: is {name}-compressed; decompress it first (gzip, .jsonl.gz, is read directly)")
    return p.open("rb")


def iter_json_lines(path: str | os.PathLike[str], max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> Iterator[Line]:
    """Yield a :class:`Line` per non-blank line; never raises for bad content.

    Lines longer than ``max_line_bytes`` are skipped without being held in memory. A gzip file
    is read through ``gzip``; a gzip stream that is cut off or corrupt ends the file with one
    E102 line instead of an exception. Raises :class:`InputFileError` for a path that is not a
    readable file.
    """
    with open_data(path) as f:
        lineno = 0
        while True:
            try:
                raw, too_long = _read_line(f, max_line_bytes)
            except (EOFError, zlib.error, gzip.BadGzipFile) as e:
                yield Line(lineno + 1, problem=LineProblem(
                    "E102", f"gzip stream is truncated or corrupt ({e})",
                    "the compressed file was cut off; download or compress it again"))
                break
            if raw is None:
                break
            lineno += 1
            if too_long:
                yield Line(lineno, problem=LineProblem(
                    "E106", f"line longer than {max_line_bytes / (1024 * 1024):g} MiB",
                    "split huge observations (e.g. HTML) out of the record or raise --max-line-mb"))
                continue
            bom = False
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
                bom = True
            at_eof = not raw.endswith(b"\n")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield Line(lineno, bom=bom, problem=LineProblem(
                    "E103", f"invalid UTF-8 at byte {e.start}", "re-encode the file as UTF-8"))
                continue
            if not text.strip():
                if bom:
                    yield Line(lineno, bom=True, value=_BLANK)
                continue
            try:
                value = json.loads(text)
            except json.JSONDecodeError as e:
                truncated = at_eof and (e.pos >= len(text.rstrip()) - 1 or e.msg.startswith("Unterminated string"))
                if truncated:
                    yield Line(lineno, bom=bom, problem=LineProblem(
                        "E102", f"truncated JSON at end of file ({e.msg})",
                        "the file was cut off mid-record; re-export it or drop the last line"))
                else:
                    yield Line(lineno, bom=bom, problem=LineProblem(
                        "E101", f"invalid JSON: {e.msg} at column {e.colno}",
                        "each line must be one complete JSON object"))
                continue
            except RecursionError:
                value = _TOO_DEEP
            brackets = text.count("{") + text.count("[")
            if value is _TOO_DEEP or (brackets > MAX_RECORD_DEPTH and depth_exceeds(value, MAX_RECORD_DEPTH)):
                yield Line(lineno, bom=bom, problem=LineProblem(
                    "E112", f"record nested deeper than {MAX_RECORD_DEPTH} levels",
                    "flatten the deeply nested value (usually tool-call arguments or an observation)"))
                continue
            yield Line(lineno, value=value, bom=bom, maybe_surrogate=_SURROGATE_ESCAPE.search(text) is not None,
                       brackets=brackets)


def _read_line(f: Any, max_line_bytes: int) -> tuple[bytes | None, bool]:
    """Next line in chunks: ``(bytes, False)``, ``(None, False)`` at EOF, or ``(b"", True)`` when the
    line exceeds the limit (its chunks are dropped as they come, so memory stays under the limit)."""
    chunks: list[bytes] = []
    size = 0
    too_long = False
    while True:
        part = f.readline(_CHUNK)
        if not part:
            break
        if not too_long:
            size += len(part)
            if size > max_line_bytes:
                too_long = True
                chunks = []
            else:
                chunks.append(part)
        if part.endswith(b"\n"):
            break
    if too_long:
        return b"", True
    if not chunks:
        return None, False
    return (chunks[0] if len(chunks) == 1 else b"".join(chunks)), False


_TOO_DEEP = object()


class _Blank:
    """Marker for a BOM-only first line (so the BOM is still reported)."""


_BLANK = _Blank()


def is_blank(line: Line) -> bool:
    return line.value is _BLANK
