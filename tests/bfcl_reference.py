"""Test-only: load BFCL's *own* AST checker from the installed wheel, for differential tests.

``bfcl_eval``'s checker imports its model registry (which imports model SDKs we do not
install); its only use there is ``MODEL_CONFIG_MAPPING[model].underscore_to_dot``, so we stub
that one module and load the checker file by path. Never used by the library itself.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from importlib import resources
from pathlib import Path
from typing import Any

_MOD = None

# BFCL error_type -> our reason code.
ERROR_TYPE_TO_REASON = {
    "simple_function_checker:wrong_count": "wrong_count",
    "multiple_function_checker:wrong_count": "wrong_count",
    "parallel_function_checker_no_order:wrong_count": "wrong_count",
    "simple_function_checker:wrong_func_name": "wrong_func_name",
    "simple_function_checker:missing_required": "missing_required",
    "simple_function_checker:unexpected_param": "unexpected_param",
    "simple_function_checker:missing_optional": "missing_optional",
    "type_error:simple": "type_error",
    "type_error:nested": "nested_type_error",
    "value_error:string": "value_error:string",
    "value_error:list/tuple": "value_error:list",
    "value_error:dict_key": "value_error:dict_key",
    "value_error:dict_value": "value_error:dict_value",
    "value_error:list_dict_count": "value_error:list_dict_count",
    "value_error:others": "value_error:other",
    "parallel_function_checker_no_order:cannot_find_match": "parallel_no_match",
}


def reference_module() -> Any:
    global _MOD
    if _MOD is None:
        root = Path(str(resources.files("bfcl_eval")))
        stub = types.ModuleType("bfcl_eval.constants.model_config")

        class _Cfg:
            underscore_to_dot = False

        class _Map(dict):
            def __getitem__(self, key: str) -> _Cfg:
                return _Cfg()

        stub.MODEL_CONFIG_MAPPING = _Map()  # type: ignore[attr-defined]
        saved = sys.modules.get("bfcl_eval.constants.model_config")
        sys.modules["bfcl_eval.constants.model_config"] = stub
        try:
            spec = importlib.util.spec_from_file_location(
                "_bfcl_reference_ast_checker", root / "eval_checker" / "ast_eval" / "ast_checker.py")
            mod = importlib.util.module_from_spec(spec)
            assert spec.loader is not None
            spec.loader.exec_module(mod)
        finally:
            if saved is None:
                sys.modules.pop("bfcl_eval.constants.model_config", None)
            else:
                sys.modules["bfcl_eval.constants.model_config"] = saved
        _MOD = mod
    return _MOD


def reference_check(functions: list[dict], calls: list[dict], ground_truth: list[dict], category: str) -> dict:
    """BFCL's verdict for ``calls`` ([{name, arguments}])."""
    from bfcl_eval.constants.enums import Language

    mod = reference_module()
    model_output = [{c["name"]: c["arguments"]} for c in calls]
    return mod.ast_checker(functions, model_output, ground_truth, Language.PYTHON, category, "stub-model")
