"""Configs people can discover: every field of a run config with its type, default and description
(``trajtune config show``), a commented starter file (``trajtune config init``), and "did you
mean" for a mistyped key. All of it is read from the pydantic models, so it cannot drift from
what the validator accepts.
"""

from __future__ import annotations

import difflib
import json
import types
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

#: Values a starter file gives the fields that have no default (the user edits them).
STARTER = {"model.name_or_path": "smollm2-135m", "env": "home", "env.name": "home", "data.path": "data/train.jsonl"}


@dataclass
class FieldDoc:
    key: str  # dotted path
    type: str
    default: Any
    required: bool
    description: str
    section: bool  # a nested model (its fields follow)
    optional_section: bool  # a nested model that is off (None) by default


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    args = typing.get_args(annotation) or (annotation,)
    return [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]


def type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return "|".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        parts = [type_name(a) for a in args if a is not type(None)]
        return " or ".join(parts) + (" (optional)" if type(None) in args else "")
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(type_name(a) for a in args)}]"
    if isinstance(annotation, type):
        return "section" if issubclass(annotation, BaseModel) else annotation.__name__
    return str(annotation)


def field_docs(cls: type[BaseModel], prefix: str = "") -> list[FieldDoc]:
    out: list[FieldDoc] = []
    for name, f in cls.model_fields.items():
        key = f"{prefix}{name}"
        models = _models_in(f.annotation)
        default = None if f.is_required() else f.get_default(call_default_factory=True)
        sub = models[0] if models else None
        optional_section = sub is not None and default is None and not f.is_required()
        out.append(FieldDoc(key, type_name(f.annotation), default, f.is_required(), f.description or "",
                            sub is not None, optional_section))
        if sub is not None:
            out += field_docs(sub, key + ".")
    return out


def yaml_value(v: Any) -> str:
    if isinstance(v, BaseModel):
        v = v.model_dump(mode="json")
    return json.dumps(v, ensure_ascii=False)  # JSON is YAML: quoting is always right


def _comment(text: str, indent: str, width: int = 100) -> list[str]:
    import textwrap

    return [f"{indent}# {line}" for line in textwrap.wrap(text, width - len(indent) - 2)] if text else []


def commented_yaml(cls: type[BaseModel], algorithm: str) -> str:
    """The whole config as YAML: every field with its description above it; optional sections
    commented out with their fields; required fields filled with a starter value to edit."""
    lines = [f"# trajtune {algorithm} config: every setting with its default (trajtune config show {algorithm}).",
             "# Edit the lines marked REQUIRED; delete any other line to keep its default.", ""]

    def emit(model: type[BaseModel], prefix: str, indent: str, off: bool) -> None:
        for name, f in model.model_fields.items():
            key = f"{prefix}{name}"
            models = _models_in(f.annotation)
            default = None if f.is_required() else f.get_default(call_default_factory=True)
            desc = (f.description or "") + ("; REQUIRED" if f.is_required() else "")
            if prefix == "" and lines[-1] != "":
                lines.append("")
            lines.extend(_comment(desc, indent))
            hash_ = "# " if off else ""
            if name == "algorithm":
                lines.append(f"{indent}algorithm: {algorithm}")
            elif models and (default is not None or f.is_required() or key in STARTER):
                # a section: required, on by default, or (dpo's env) on in the starter
                lines.append(f"{indent}{hash_}{name}:")
                emit(models[0], key + ".", indent + "  ", off)
            elif models:
                lines.append(f"{indent}# {name}:  (off by default; uncomment to use)")
                emit(models[0], key + ".", indent + "  ", True)
            elif f.is_required():
                starter = STARTER.get(key, f"runs/{algorithm}" if name == "output_dir" else "")
                lines.append(f"{indent}{hash_}{name}: {yaml_value(starter)}")
            else:
                lines.append(f"{indent}{hash_}{name}: {yaml_value(default)}")

    emit(cls, "", "", False)
    return "\n".join(lines) + "\n"


def fields_at(cls: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Field names of the section at ``loc`` (a validation error's location without its last part)."""
    model: type[BaseModel] | None = cls
    for part in loc:
        if model is None or not isinstance(part, str) or part not in model.model_fields:
            return []
        models = _models_in(model.model_fields[part].annotation)
        model = models[0] if models else None
    return list(model.model_fields) if model is not None else []


def did_you_mean(cls: type[BaseModel], loc: tuple[Any, ...]) -> str | None:
    if not loc or not isinstance(loc[-1], str):
        return None
    close = difflib.get_close_matches(loc[-1], fields_at(cls, loc[:-1]), n=1, cutoff=0.6)
    return close[0] if close else None
