"""trajtune's own implementation of BFCL's single-turn AST matching rules.

Why our own: BFCL's checker lives in a package whose imports pull model SDKs, and it takes
*decoded Python call strings*; we score tool calls already parsed from the model's text (JSON
arguments), and nothing of the model's output is ever evaluated. The rules follow
``bfcl_eval/eval_checker/ast_eval/ast_checker.py`` (2026.3.23), Python language only:

- exactly the expected number of calls (1 for simple/multiple; N for parallel*);
- parallel categories: the calls must pair one-to-one with the expected calls, in any order
  (BFCL pairs greedily in answer order; we find a perfect matching, which accepts everything
  the greedy pass accepts plus the rare valid set the greedy pass mis-pairs);
- function name must match (``a.b`` may also be called ``a_b``, as OpenAI-style names cannot
  contain dots);
- every ``required`` parameter present; a parameter not in the schema or not in the possible
  answer is unexpected; a possible-answer parameter without ``""`` among its values must be given;
- types are exact (``True`` is not an integer) except int -> float for ``float`` parameters, never
  the reverse; ``tuple`` is a list; ``any`` is checked as a string (as BFCL does);
  a value of the possible answers' type where they differ from the schema (BFCL's "variable"
  case) is accepted and compared as is;
- strings compare after removing spaces and ``,./-_*^``, lower-casing and ``'`` -> ``"``;
- lists are order-sensitive (strings inside standardised the same way); dicts compare key by key;
  lists of dicts compare element-wise in order;
- other values: ``value in possible_values``.

Result: ``CheckResult(valid, reason, message, detail)`` with stable ``reason`` codes (see
``REASONS``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trajtune.schema import ToolCall

# Stable reason codes (documented; tests and reports rely on them).
REASONS = {
    "ok": "the calls match one possible answer",
    "format_error": "the model text could not be parsed into tool calls",
    "wrong_count": "a different number of calls than expected",
    "wrong_func_name": "the call names a different function",
    "missing_required": "a required parameter is missing",
    "unexpected_param": "a parameter not in the schema or not in the possible answer",
    "missing_optional": "a parameter the answer requires (no \"\" among its values) is missing",
    "type_error": "a value has the wrong type (only int -> float is coerced)",
    "nested_type_error": "an element of a list/tuple has the wrong type",
    "value_error:string": "a string value matches none of the possible answers",
    "value_error:list": "a list value (order-sensitive) matches none of the possible answers",
    "value_error:dict_key": "a dict value has an unexpected or missing key",
    "value_error:dict_value": "a dict value has a wrong entry",
    "value_error:list_dict_count": "a list of dicts has the wrong length",
    "value_error:other": "a value matches none of the possible answers",
    "parallel_no_match": "an expected call matched none of the remaining model calls",
    "irrelevance_called": "a function was called although none fits the request",
    "relevance_no_call": "no function was called although one fits the request",
    "unknown_function": "the expected function has no description in the record",
}

_PY_TYPES: dict[str, type] = {
    "string": str, "integer": int, "float": float, "boolean": bool,
    "array": list, "tuple": list, "dict": dict, "any": str,
}
_NESTED = ("array", "tuple")
_STRIP = re.compile(r"[ \,\.\/\-\_\*\^]")


@dataclass
class CheckResult:
    valid: bool
    reason: str = "ok"
    message: str = ""
    #: For ``parallel_no_match``: the reason of the closest failed candidate.
    detail: dict[str, Any] = field(default_factory=dict)

    def as_tuple(self) -> tuple[bool, str, str]:
        return self.valid, self.reason, self.message


def _ok() -> CheckResult:
    return CheckResult(True, "ok", "")


def _fail(reason: str, message: str, **detail: Any) -> CheckResult:
    return CheckResult(False, reason, message, dict(detail))


def standardize_string(s: str) -> str:
    """BFCL's normalisation: drop spaces and ``,./-_*^``, lower-case, single -> double quotes."""
    return _STRIP.sub("", s).lower().replace("'", '"')


def normalize_calls(calls: Sequence[ToolCall | Mapping[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """Accept ``ToolCall`` objects, ``{name, arguments}`` dicts (arguments may be a JSON string)
    or BFCL's own ``{name: {args}}`` shape; return ``[(name, args)]``.

    Raises ``ValueError`` for a call whose arguments are not a JSON object (a format error).
    """
    out: list[tuple[str, dict[str, Any]]] = []
    for i, c in enumerate(calls):
        if isinstance(c, ToolCall):
            name, args = c.name, c.arguments
            if args is None and c.arguments_raw is not None:
                args = _loads_obj(c.arguments_raw, i)
            if args is None:
                args = {}
        elif isinstance(c, Mapping):
            if "name" in c and ("arguments" in c or "parameters" in c or len(c) == 1):
                name = c["name"]
                args = c.get("arguments", c.get("parameters", {}))
                if isinstance(args, str):
                    args = _loads_obj(args, i)
                if args is None:
                    args = {}
            elif len(c) == 1:
                name, args = next(iter(c.items()))
            else:
                raise ValueError(f"call {i}: expected {{name, arguments}}, got keys {sorted(c)}")
        else:
            raise ValueError(f"call {i}: expected a ToolCall or a dict, got {type(c).__name__}")
        if not isinstance(name, str) or not isinstance(args, dict):
            raise ValueError(f"call {i}: name must be a string and arguments a JSON object")
        out.append((name, args))
    return out


def _loads_obj(raw: str, i: int) -> dict[str, Any]:
    try:
        v = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"call {i}: arguments are not valid JSON ({e.msg})") from None
    if not isinstance(v, dict):
        raise ValueError(f"call {i}: arguments must be a JSON object")
    return v


def _possible_answer_type(values: list[Any]) -> type | None:
    for v in values:
        if v != "":
            return type(v)
    return None


def _type_check(param: str, value: Any, possible: list[Any], type_name: str,
                expected: type, nested: type | None) -> tuple[CheckResult, bool]:
    """BFCL's ``type_checker``: returns (result, is_variable)."""
    pa_type = _possible_answer_type(possible)
    is_variable = pa_type is not None and pa_type is not expected
    if type(value) is expected:
        if nested is None:
            return _ok(), is_variable
        for item_answers in possible:
            good = True
            if type(item_answers) is list:
                for v in value:
                    r, _ = _type_check(param, v, item_answers, nested.__name__, nested, None)
                    if not r.valid:
                        good = False
                        break
            if good:
                return _ok(), is_variable
        return _fail("nested_type_error",
                     f"parameter {param!r}: expected {type_name} of {nested.__name__}, got {value!r}"), False
    if pa_type is not None and type(value) is pa_type:
        return _ok(), True
    return _fail("type_error", f"parameter {param!r}: expected type {type_name}, got "
                               f"{type(value).__name__} ({value!r})"), False


def _string_check(param: str, value: str, possible: list[Any]) -> CheckResult:
    std = [standardize_string(p) for p in possible if type(p) is str]
    if standardize_string(value) not in std:
        return _fail("value_error:string", f"parameter {param!r}: {value!r} is not one of {possible!r}")
    return _ok()


def _std_list(xs: list[Any]) -> list[Any]:
    return [standardize_string(x) if type(x) is str else x for x in xs]


def _list_check(param: str, value: list[Any], possible: list[Any]) -> CheckResult:
    std_value = _std_list(list(value))
    std_possible = [_std_list(p) if isinstance(p, list) else p for p in possible]
    if std_value not in std_possible:
        return _fail("value_error:list", f"parameter {param!r}: {value!r} is not one of {possible!r} (order matters)")
    return _ok()


def _dict_check(param: str, value: dict[str, Any], possible: list[Any]) -> CheckResult:
    result = _fail("value_error:dict_key", f"parameter {param!r}: no possible dict answer")
    for answer in possible:
        if answer == "":
            continue
        if not isinstance(answer, dict):
            continue
        result = _ok()
        for key, v in value.items():
            if key not in answer:
                result = _fail("value_error:dict_key", f"parameter {param!r}: unexpected key {key!r}")
                break
            sv = standardize_string(v) if type(v) is str else v
            sp = [standardize_string(p) if type(p) is str else p for p in answer[key]]
            if sv not in sp:
                result = _fail("value_error:dict_value",
                               f"parameter {param!r}: key {key!r} = {v!r} is not one of {answer[key]!r}")
                break
        if result.valid:
            for key, vals in answer.items():
                if key not in value and "" not in vals:
                    result = _fail("value_error:dict_key", f"parameter {param!r}: missing key {key!r}")
                    break
        if result.valid:
            return result
    return result


def _list_dict_check(param: str, value: list[Any], possible: list[Any]) -> CheckResult:
    result = _fail("value_error:list_dict_count", f"parameter {param!r}: no possible list-of-dict answer")
    for answer in possible:
        if not isinstance(answer, list) or len(value) != len(answer):
            result = _fail("value_error:list_dict_count",
                           f"parameter {param!r}: {len(value)} dicts, expected {len(answer) if isinstance(answer, list) else '?'}")
            continue
        good = True
        for v, a in zip(value, answer):
            result = _dict_check(param, v, [a]) if isinstance(v, dict) else _fail(
                "value_error:dict_value", f"parameter {param!r}: element {v!r} is not a dict")
            if not result.valid:
                good = False
                break
        if good:
            return _ok()
    return result


def _name_matches(model_name: str, expected: str) -> bool:
    return model_name == expected or model_name == expected.replace(".", "_")


def check_single_call(func: Mapping[str, Any], name: str, args: Mapping[str, Any],
                      answer: Mapping[str, Mapping[str, list[Any]]]) -> CheckResult:
    """One model call against one expected call ``{func_name: {param: [possible values]}}``.

    ``func`` is the BFCL function description (BFCL types) of the expected function.
    """
    expected_name, possible_params = next(iter(answer.items()))
    if not _name_matches(name, func["name"]):
        return _fail("wrong_func_name", f"called {name!r}, expected {func['name']!r}")
    params = func.get("parameters") or {}
    details: Mapping[str, Any] = params.get("properties") or {}
    for req in params.get("required") or []:
        if req not in args:
            return _fail("missing_required", f"missing required parameter {req!r} of {func['name']!r}")
    for param, value in args.items():
        if param not in details or param not in possible_params:
            return _fail("unexpected_param", f"unexpected parameter {param!r} for {func['name']!r}")
        spec = details[param]
        type_name = spec.get("type", "any") if isinstance(spec, Mapping) else "any"
        expected = _PY_TYPES.get(type_name)
        if expected is None:
            return _fail("type_error", f"parameter {param!r}: unsupported BFCL type {type_name!r}")
        nested = None
        if type_name in _NESTED:
            item_type = (spec.get("items") or {}).get("type", "any")
            nested = _PY_TYPES.get(item_type, str)
        if type_name == "float" and type(value) is int:
            value = float(value)  # the one coercion BFCL allows
        possible = possible_params[param]
        tr, is_variable = _type_check(param, value, possible, type_name, expected, nested)
        if not tr.valid:
            return tr
        if not is_variable:
            if expected is dict:
                r = _dict_check(param, value, possible)
                if not r.valid:
                    return r
                continue
            if expected is list and nested is dict:
                r = _list_dict_check(param, value, possible)
                if not r.valid:
                    return r
                continue
            if expected is str:
                r = _string_check(param, value, possible)
                if not r.valid:
                    return r
                continue
            if expected is list:
                r = _list_check(param, value, possible)
                if not r.valid:
                    return r
                continue
        if value not in possible:
            return _fail("value_error:other", f"parameter {param!r}: {value!r} is not one of {possible!r}")
    for param, vals in possible_params.items():
        if param not in args and "" not in vals:
            return _fail("missing_optional", f"parameter {param!r} is required by the answer but missing")
    return _ok()


def _find_func(functions: Sequence[Mapping[str, Any]], name: str) -> Mapping[str, Any] | None:
    for f in functions:
        if f.get("name") == name:
            return f
    return None


def check_ast(functions: Sequence[Mapping[str, Any]], calls: Sequence[ToolCall | Mapping[str, Any]],
              ground_truth: Sequence[Mapping[str, Any]], category: str) -> CheckResult:
    """Score parsed calls against a BFCL possible answer for an AST category.

    ``functions``: the record's BFCL function docs; ``ground_truth``: the answer record's
    ``ground_truth`` list; ``category``: e.g. ``"live_parallel_multiple"`` (its name decides
    the rule, as in BFCL: "parallel" > "multiple" > simple).
    """
    try:
        model = normalize_calls(calls)
    except ValueError as e:
        return _fail("format_error", str(e))
    if "parallel" in category:
        if len(model) != len(ground_truth):
            return _fail("wrong_count", f"{len(model)} calls, expected {len(ground_truth)}")
        # results[i][j]: expected call i against model call j. BFCL pairs them greedily in
        # answer order, which can reject a valid set whose calls come in another order (e.g.
        # parallel_178 reversed); we look for a perfect matching instead, so order never matters.
        results: list[list[CheckResult]] = []
        for i, answer in enumerate(ground_truth):
            name = next(iter(answer))
            func = _find_func(functions, name)
            if func is None:
                return _fail("unknown_function", f"no description for expected function {name!r}")
            results.append([check_single_call(func, mname, margs, answer) for mname, margs in model])
        match_of_model: dict[int, int] = {}

        def augment(i: int, seen: set[int]) -> bool:
            for j, r in enumerate(results[i]):
                if r.valid and j not in seen:
                    seen.add(j)
                    if j not in match_of_model or augment(match_of_model[j], seen):
                        match_of_model[j] = i
                        return True
            return False

        for i in range(len(ground_truth)):
            if not augment(i, set()):
                name = next(iter(ground_truth[i]))
                row = results[i]
                fails = [r for r in row if not r.valid]
                named = [r for r in fails if r.reason != "wrong_func_name"]
                if named:
                    sub = named[0]
                elif any(r.valid for r in row):
                    sub = _fail("call_taken", "every matching model call is needed by another expected call")
                else:
                    sub = fails[0] if fails else _fail("wrong_count", "no model call")
                return _fail("parallel_no_match",
                             f"expected call {i} ({name}) matched no model call; closest: {sub.message}",
                             sub_reason=sub.reason, expected_index=i)
        return _ok()
    if "multiple" in category:
        if len(model) != len(ground_truth):
            return _fail("wrong_count", f"{len(model)} calls, expected {len(ground_truth)}")
    elif len(model) != 1:
        return _fail("wrong_count", f"{len(model)} calls, expected 1")
    answer = ground_truth[0]
    name = next(iter(answer))
    func = _find_func(functions, name) if "multiple" in category else (functions[0] if functions else None)
    if func is None:
        return _fail("unknown_function", f"no description for expected function {name!r}")
    return check_single_call(func, model[0][0], model[0][1], answer)


def check_relevance(calls: Sequence[ToolCall | Mapping[str, Any]] | None, category: str) -> CheckResult:
    """Irrelevance categories pass when no call is made; ``live_relevance`` when one is.

    ``calls=None`` means the text could not be parsed; like BFCL (a decode failure counts as
    "no call"), that passes irrelevance and fails relevance.
    """
    n = 0
    if calls is not None:
        try:
            n = len(normalize_calls(calls))
        except ValueError:
            n = 0
    if "irrelevance" in category:
        return _ok() if n == 0 else _fail("irrelevance_called", f"{n} call(s) made; none was expected")
    return _ok() if n > 0 else _fail("relevance_no_call", "no call made; one was expected")


# ---------------------------------------------------------------------------------------------
# Ground truth -> concrete calls (the single-turn "expert", and the checker's self-test)


class UnsatisfiableAnswer(ValueError):
    """A possible answer no call can match under BFCL's own rules (a dataset defect)."""


def _first_value(vals: Any) -> tuple[Any, bool]:
    if not isinstance(vals, list):
        return vals, True
    for v in vals:
        if v != "":
            return v, True
    return None, False


def _concrete_dict(answer: Mapping[str, Any], minimal: bool) -> dict[str, Any]:
    out = {}
    for k, vals in answer.items():
        if minimal and isinstance(vals, list) and "" in vals:
            continue
        v, ok = _first_value(vals)
        if ok:
            out[k] = v
    return out


def ground_truth_calls(ground_truth: Sequence[Mapping[str, Any]], functions: Sequence[Mapping[str, Any]],
                       minimal: bool = False) -> list[dict[str, Any]]:
    """One concrete call per expected call: the first non-optional acceptable value of each
    parameter. ``minimal=True`` leaves out every parameter marked optional (``""``) unless the
    schema requires it; otherwise every parameter with a concrete value is given.

    Raises ``UnsatisfiableAnswer`` when a schema-required parameter has no acceptable value (a
    few BFCL records are like that; BFCL's own checker cannot pass them either).
    """
    calls = []
    for answer in ground_truth:
        name, params = next(iter(answer.items()))
        func = _find_func(functions, name) or {}
        fparams = func.get("parameters") or {}
        required = set(fparams.get("required") or [])
        props = fparams.get("properties") or {}
        args: dict[str, Any] = {}
        for p, vals in params.items():
            if minimal and "" in vals and p not in required:
                continue
            v, ok = _first_value(vals)
            if not ok:
                if p in required:
                    raise UnsatisfiableAnswer(f"{name}: required parameter {p!r} has no acceptable value in the answer")
                continue
            if p not in props:
                if "" in vals:
                    continue  # an optional answer key the schema does not have: leave it out
                raise UnsatisfiableAnswer(f"{name}: answer parameter {p!r} is not in the function's schema")
            spec = props.get(p) if isinstance(props, Mapping) else None
            ptype = spec.get("type") if isinstance(spec, Mapping) else None
            item_type = ((spec or {}).get("items") or {}).get("type") if isinstance(spec, Mapping) else None
            if ptype == "dict" and isinstance(v, dict):
                v = _concrete_dict(v, minimal)
            elif ptype in _NESTED and item_type == "dict" and isinstance(v, list):
                v = [_concrete_dict(e, minimal) if isinstance(e, dict) else e for e in v]
            args[p] = v
        for p in required:
            if p not in args and p not in params:
                raise UnsatisfiableAnswer(f"{name}: required parameter {p!r} is absent from the answer")
        calls.append({"name": name, "arguments": args})
    return calls
