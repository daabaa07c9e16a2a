"""Environments: the protocol, built-in verifiable worlds and adapters to external ones."""

from trajtune.envs.base import Environment, ResetResult, StepResult, Task, list_envs, make_env, register_env

__all__ = ["Environment", "ResetResult", "StepResult", "Task", "list_envs", "make_env", "register_env"]

from trajtune.envs import home as _home  # noqa: E402,F401  (registers "home")
