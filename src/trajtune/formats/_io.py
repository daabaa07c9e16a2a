"""Streaming, crash-proof reading of JSONL: one bad line never stops the file.

``schema.iter_jsonl`` raises on the first bad line, which is right for trusted IR files. Data
tooling needs every problem of a file at once, bounded memory on huge lines, and a BOM warning,
so this reader yields an outcome per line instead of raising.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def iter_json_lines(path: str | os.PathLike[str], max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> Iterator[Line]:
    """Yield a :class:`Line` per non-blank line; never raises for bad content.

    Lines longer than ``max_line_bytes`` are skipped without being held in memory.
    """
    p = Path(path)
    with p.open("rb") as f:
        lineno = 0
        while True:
            raw, too_long = _read_line(f, max_line_bytes)
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
                yield Line(lineno, bom=bom, problem=LineProblem(
                    "E101", "invalid JSON: nesting too deep", "flatten the record"))
                continue
            yield Line(lineno, value=value, bom=bom, maybe_surrogate=_SURROGATE_ESCAPE.search(text) is not None)


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


class _Blank:
    """Marker for a BOM-only first line (so the BOM is still reported)."""


_BLANK = _Blank()


def is_blank(line: Line) -> bool:
    return line.value is _BLANK
