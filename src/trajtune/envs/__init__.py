"""Environments: the protocol, built-in verifiable worlds and adapters to external ones.

``base`` is the protocol every environment implements; ``registry`` finds one by name (built-ins,
``register_env``, plug-ins). Modules inside the package import those two directly, never this one.
"""

from trajtune.envs.base import Environment, ResetResult, StepResult, Task
from trajtune.envs.registry import UnknownEnvError, list_envs, make_env, register_env

__all__ = ["Environment", "ResetResult", "StepResult", "Task", "UnknownEnvError", "list_envs", "make_env",
           "register_env"]
