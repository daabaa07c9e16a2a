"""Environments: the protocol, built-in verifiable worlds and adapters to external ones."""

from trajtune.envs.base import Environment, ResetResult, StepResult, Task, list_envs, make_env, register_env

__all__ = ["Environment", "ResetResult", "StepResult", "Task", "list_envs", "make_env", "register_env"]

from trajtune.envs import home as _home  # noqa: E402,F401  (registers "home")
from trajtune.envs import builtin as _builtin  # noqa: E402,F401  (registers the other built-in environments)
from trajtune.envs.adapters import from_config as _from_config  # noqa: E402,F401  (python_tools, gym, mcp)
from trajtune.envs.adapters import feedback_slot as _feedback_slot  # noqa: E402,F401  (feedback_slot)
from trajtune.envs.adapters import experiences as _experiences  # noqa: E402,F401  (with_experiences)


def _register_benchmarks() -> None:
    """Benchmark environments register lazily: their heavy packages load only when used."""
    import importlib

    for mod in ("trajtune.benchmarks.bfcl.multi_turn", "trajtune.benchmarks.textworld_env"):
        try:
            importlib.import_module(mod)
        except ImportError:  # optional extra not installed
            pass


_register_benchmarks()
