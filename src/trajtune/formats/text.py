"""Plain-text corpora for agentic continual pre-training (``data.format: text``).

Why: continual pre-training (AgentFounder, MaskSearch) trains on raw agent logs, tool docs and
search transcripts that are not conversations. A document here is:

- each line of a JSONL file (plain or ``.jsonl.gz``) whose object has a string ``text``;
- a whole ``.txt`` / ``.md`` file;
- each ``.txt`` / ``.md`` / ``.jsonl`` file of a directory, in name order.

A bad line (not JSON, no ``text``, text not a string) stops the load with the file, the line and
what to fix; nothing is skipped silently.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from trajtune.errors import DataError, InputNotFoundError
from trajtune.formats._io import iter_json_lines

TEXT_SUFFIXES = (".txt", ".md")
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz")


def iter_documents(path: str | os.PathLike[str]) -> Iterator[tuple[str, str]]:
    """``(where, text)`` per document (``where`` is ``file`` or ``file:line``)."""
    p = Path(path)
    if not p.exists():
        raise InputNotFoundError(f"{p}: no such file or directory")
    if p.is_dir():
        files = sorted(x for x in p.iterdir() if x.is_file() and x.name.endswith(TEXT_SUFFIXES + JSONL_SUFFIXES))
        if not files:
            raise DataError(f"{p}: no .txt, .md or .jsonl file in this directory")
        for f in files:
            yield from iter_documents(f)
        return
    if p.name.endswith(JSONL_SUFFIXES):
        for line in iter_json_lines(p):
            where = f"{p}:{line.lineno}"
            if line.problem is not None:
                raise DataError(f"{where}: {line.problem.message} [{line.problem.rule}]; {line.problem.hint}")
            v = line.value
            if not isinstance(v, dict) or not isinstance(v.get("text"), str):
                raise DataError(f"{where}: a text-corpus line must be a JSON object with a string \"text\" "
                                f"(got {type(v).__name__}{' without text' if isinstance(v, dict) else ''}); "
                                "fix: {\"text\": \"...\"} per line")
            if v["text"].strip():
                yield where, v["text"]
        return
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{p}: not UTF-8 text ({e.reason} at byte {e.start}); convert it to UTF-8") from None
    if text.strip():
        yield str(p), text
