"""Import a helper module of ``benchmarks/`` for a test.

``benchmarks/`` is not a package: its scripts import their helpers by name (Python puts a script's
own directory on the path). A test loads the file by path instead and registers it under that name,
so that the module sees itself as the benchmarks do.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None, name
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
