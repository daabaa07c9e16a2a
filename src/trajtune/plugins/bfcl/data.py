"""Find and load BFCL's data files from the installed ``bfcl-eval`` wheel (never the network).

We only use the wheel's *data* (``bfcl_eval/data/*.json`` JSON Lines, answers in
``possible_answer/``, multi-turn function docs in ``multi_turn_func_doc/``) and, for the
multi-turn categories, its executable API classes. The wheel is installed without its
dependencies (they include model SDKs trajtune has no use for), so we never import
``bfcl_eval``'s top-level helpers here: files are located through ``importlib.resources``.
"""

from __future__ import annotations

import copy
import importlib.util
import json
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from trajtune.errors import EnvError, UsageError
from trajtune.formats.bfcl import to_ir
from trajtune.schema import Trajectory

BFCL_PACKAGE = "bfcl_eval"
BFCL_VERSION_PIN = "2026.3.23"
INSTALL_HINT = (f"pip install --no-deps bfcl-eval=={BFCL_VERSION_PIN}  "
                "(or `pip install trajtune[bfcl]` and then that line; its dependencies are not needed)")
FILE_PREFIX = "BFCL_v4"

#: Single-turn categories scored by the AST checker (possible answers exist).
AST_CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple",
                  "live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")
#: Single-turn categories with no answer file: success is (not) calling a function at all.
RELEVANCE_CATEGORIES = ("irrelevance", "live_irrelevance", "live_relevance")
#: Stateful categories run as environments.
MULTI_TURN_CATEGORIES = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param",
                         "multi_turn_long_context")
SINGLE_TURN_CATEGORIES = AST_CATEGORIES + RELEVANCE_CATEGORIES
ALL_CATEGORIES = SINGLE_TURN_CATEGORIES + MULTI_TURN_CATEGORIES
#: Short names users type -> file category.
ALIASES = {"simple": "simple_python"}
#: Groups usable on the command line.
GROUPS = {
    "single_turn": SINGLE_TURN_CATEGORIES,
    "multi_turn": MULTI_TURN_CATEGORIES,
    "live": tuple(c for c in SINGLE_TURN_CATEGORIES if c.startswith("live_")),
    "non_live": tuple(c for c in SINGLE_TURN_CATEGORIES if not c.startswith("live_")),
    "all": ALL_CATEGORIES,
}
#: Known BFCL categories we deliberately do not run, with the reason (for clear errors).
UNSUPPORTED = {
    "simple_java": "needs BFCL's Java value converters (values are Java source strings)",
    "simple_javascript": "needs BFCL's JavaScript value converters (values are JS source strings)",
    "memory": "agentic category backed by vector stores / BM25 (extra dependencies)",
    "web_search": "agentic category that calls a live search API (no network here)",
    "format_sensitivity": "prompt-format study, not a tool-calling score",
}

# Which func-doc file describes which API class (mirrors bfcl_eval.constants, kept here so we
# never import bfcl_eval's constants package and its dependencies).
FUNC_DOC_FILES = {
    "GorillaFileSystem": "gorilla_file_system.json",
    "MathAPI": "math_api.json",
    "MessageAPI": "message_api.json",
    "TwitterAPI": "posting_api.json",
    "TicketAPI": "ticket_api.json",
    "TradingBot": "trading_bot.json",
    "TravelAPI": "travel_booking.json",
    "VehicleControlAPI": "vehicle_control.json",
}


class BFCLNotInstalledError(EnvError, ImportError):
    """The bfcl-eval wheel (our data source) is not installed."""


def bfcl_available() -> bool:
    return importlib.util.find_spec(BFCL_PACKAGE) is not None


def bfcl_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("bfcl-eval")
    except Exception:  # noqa: BLE001 - metadata missing means "unknown", not an error
        return None


def data_dir() -> Path:
    """The directory holding ``BFCL_v4_*.json``; a clear error if the wheel is missing."""
    if not bfcl_available():
        raise BFCLNotInstalledError(f"BFCL data needs the bfcl-eval wheel, which is not installed. Install it with: {INSTALL_HINT}")
    root = resources.files(BFCL_PACKAGE) / "data"
    path = Path(str(root))
    if not (path / f"{FILE_PREFIX}_simple_python.json").is_file():
        raise BFCLNotInstalledError(f"bfcl-eval is installed but {path} has no {FILE_PREFIX}_*.json files; "
                                    f"reinstall it with: {INSTALL_HINT}")
    return path


def resolve_categories(names: list[str] | tuple[str, ...] | str | None) -> list[str]:
    """Expand aliases and groups, keep order, drop duplicates; unknown names are an error."""
    if names is None:
        names = ["all"]
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    out: list[str] = []
    for n in names:
        n = ALIASES.get(n, n)
        if n in GROUPS:
            expanded = list(GROUPS[n])
        elif n in ALL_CATEGORIES:
            expanded = [n]
        elif n in UNSUPPORTED:
            raise UsageError(f"BFCL category {n!r} is not supported: {UNSUPPORTED[n]}")
        else:
            known = ", ".join(list(ALIASES) + list(ALL_CATEGORIES) + list(GROUPS))
            raise UsageError(f"unknown BFCL category {n!r}; known: {known}")
        for c in expanded:
            if c not in out:
                out.append(c)
    return out


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    out = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: invalid JSON in BFCL data ({e.msg}); "
                                 f"reinstall bfcl-eval: {INSTALL_HINT}") from None
    return out


@lru_cache(maxsize=32)
def _load_raw_cached(category: str) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    d = data_dir()
    records = _read_jsonl(d / f"{FILE_PREFIX}_{category}.json")
    answers: dict[str, dict[str, Any]] = {}
    ans_path = d / "possible_answer" / f"{FILE_PREFIX}_{category}.json"
    if ans_path.is_file():
        for a in _read_jsonl(ans_path):
            answers[a["id"]] = a
    return records, answers


@lru_cache(maxsize=16)
def func_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    """The function docs BFCL offers for one multi-turn API class."""
    if class_name not in FUNC_DOC_FILES:
        raise ValueError(f"unknown BFCL API class {class_name!r}; known: {', '.join(FUNC_DOC_FILES)}")
    return tuple(_read_jsonl(data_dir() / "multi_turn_func_doc" / FUNC_DOC_FILES[class_name]))


def _populate_multi_turn(record: dict[str, Any]) -> dict[str, Any]:
    """Add function docs the way BFCL does: all docs of the involved classes, held-out ones removed.

    (BFCL also ships an ``excluded_function`` field, which bfcl-eval 2026.3.23 does not use; we
    follow the package and ignore it.)
    """
    rec = copy.deepcopy(record)
    functions: list[dict[str, Any]] = []
    for cls in rec.get("involved_classes", []):
        functions.extend(copy.deepcopy(list(func_docs(cls))))
    held: dict[str, list[dict[str, Any]]] = {}
    for turn, names in (rec.get("missed_function") or {}).items():
        held[turn] = []
        for name in names:
            for i, doc in enumerate(functions):
                if doc["name"] == name:
                    held[turn].append(functions.pop(i))
                    break
    rec["function"] = functions
    rec["missed_function_docs"] = held
    return rec


def load_raw(category: str) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """Records (copies) and answers by id for one category, as the files have them."""
    category = resolve_categories([category])[0]
    records, answers = _load_raw_cached(category)
    return copy.deepcopy(records), copy.deepcopy(answers)


def load_bfcl(category: str, limit: int | None = None) -> list[Trajectory]:
    """Load one BFCL category as trajectories with the ground truth in ``reference``.

    ``reference.kind`` is ``"bfcl_ast"`` (single-turn) or ``"bfcl_multi_turn"``. ``limit`` takes
    the first N records (file order) to keep smoke runs short.
    """
    cats = resolve_categories([category])
    if len(cats) != 1:
        raise ValueError(f"load_bfcl takes one category, {category!r} names {len(cats)}; call it per category")
    cat = cats[0]
    records, answers = _load_raw_cached(cat)
    if limit is not None:
        records = records[:limit]
    version = bfcl_version()
    out = []
    for rec in records:
        if cat in MULTI_TURN_CATEGORIES:
            rec = _populate_multi_turn(rec)
        ans = answers.get(rec["id"])
        if cat not in RELEVANCE_CATEGORIES and ans is None:
            raise ValueError(f"BFCL {cat}: record {rec['id']!r} has no possible answer; reinstall bfcl-eval: {INSTALL_HINT}")
        out.append(to_ir(rec, ans, category=cat, source_version=version))
    return out


def record_ids(category: str, limit: int | None = None) -> list[str]:
    """Entry ids of one category in file order (cheap: no conversion)."""
    cat = resolve_categories([category])[0]
    records, _ = _load_raw_cached(cat)
    return [r["id"] for r in (records if limit is None else records[:limit])]


def load_bfcl_entry(category: str, record_id: str) -> Trajectory:
    """One entry as a trajectory (what ``load_bfcl`` gives, without converting the others)."""
    cat = resolve_categories([category])[0]
    records, answers = _load_raw_cached(cat)
    rec = next((r for r in records if r["id"] == record_id), None)
    if rec is None:
        raise KeyError(f"no BFCL entry {record_id!r} in category {cat}")
    if cat in MULTI_TURN_CATEGORIES:
        rec = _populate_multi_turn(rec)
    return to_ir(rec, answers.get(record_id), category=cat, source_version=bfcl_version())
