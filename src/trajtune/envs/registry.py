"""Finding an environment by name: the built-ins, what ``register_env`` added, and plug-ins.

Why a module of its own, above the protocol: every environment imports ``trajtune.envs.base``; if
the registry lived there, looking a name up would have to import the environments from below them
(a circle through the whole package). Here the registry imports the built-ins (``builtin``) and
nothing imports the registry but callers that want an environment by name.

A name is looked up in this order:

1. ``register_env`` (the built-ins, the two wrappers below, and anything a program registered);
2. the plug-ins: ``trajtune.plugins`` lists trajtune's own (BFCL, TextWorld) and reads the
   ``trajtune.envs`` entry-point group of installed packages; the first use imports the plug-in
   and registers it, so nothing generic names a benchmark;
3. ``module:Class`` / ``module:factory`` (``envs/adapters/from_config.py``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from trajtune import plugins
from trajtune.envs.adapters.experiences import WithExperiences, load_experiences
from trajtune.envs.adapters.feedback_slot import FeedbackSlot
from trajtune.envs.adapters.from_config import make_from_ref
from trajtune.envs.adapters.fold import FoldEnv, FoldOptions
from trajtune.envs.adapters.retry import RetryEnv, RetryOptions
from trajtune.envs.adapters.roles import RolesEnv, RolesOptions
from trajtune.envs.adapters.simulated_user import SimulatedUser, make_user
from trajtune.envs.base import Environment, parse_env_options
from trajtune.envs.builtin import ADAPTERS, WORLDS
from trajtune.errors import EnvError

EnvFactory = Callable[..., Environment]
_REGISTRY: dict[str, EnvFactory] = {}


class UnknownEnvError(EnvError, KeyError):
    """No environment is registered under the name (a KeyError too, for callers that look names up)."""


def register_env(name: str) -> Callable[[EnvFactory], EnvFactory]:
    """Register ``factory`` (an ``Environment`` class or a function returning one) under ``name``."""
    def deco(factory: EnvFactory) -> EnvFactory:
        if name in _REGISTRY and _REGISTRY[name] is not factory:
            raise ValueError(f"environment {name!r} is already registered")
        _REGISTRY[name] = factory
        return factory

    return deco


def _plugin(name: str) -> EnvFactory | None:
    """The plug-in environment ``name`` (imported and registered now), or None if no plug-in has it."""
    refs = plugins.references(plugins.ENVS)
    if name not in refs:
        return None
    try:
        factory = plugins.load(plugins.ENVS, name)
    except (ImportError, AttributeError) as e:  # e.g. the plug-in's optional dependency is missing
        raise EnvError(f"environment {name!r} is a plug-in ({refs[name]}) that cannot be loaded: "
                       f"{type(e).__name__}: {e}") from None
    return register_env(name)(factory)


def make_env(name: str, /, **kwargs: Any) -> Environment:
    factory = _REGISTRY.get(name) or _plugin(name)
    if factory is None and ":" in name:  # module:Class / module:factory (envs/adapters/from_config.py)
        return make_from_ref(name, **kwargs)
    if factory is None:
        known = ", ".join(sorted(set(_REGISTRY) | set(plugins.references(plugins.ENVS)))) or "(none)"
        raise UnknownEnvError(f"unknown environment {name!r}; known environments: {known}; or give module:Class, "
                              "{python_tools: module:ToolClass}, {gym: ID} or {mcp: {command: [...]}} (docs/envs.md)")
    try:  # wrong arguments (e.g. a typo in --env-arg / env.kwargs) are the user's, not a bug
        inspect.signature(factory).bind(**kwargs)
    except TypeError as e:
        raise EnvError(f"environment {name!r}: {e}") from None
    except ValueError:  # no signature to check (a builtin): let the call decide
        pass
    try:
        return factory(**kwargs)
    except ValueError as e:  # an option value the environment refuses (--env-arg difficulty=banana)
        shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        raise EnvError(f"environment {name!r} rejected its options ({shown}): {e}") from None


def list_envs() -> dict[str, EnvFactory]:
    """Every environment by name, plug-ins included (one whose optional package is missing is left out)."""
    for name in plugins.references(plugins.ENVS):
        if name not in _REGISTRY:
            try:
                _plugin(name)
            except EnvError:  # an optional extra that is not installed
                pass
    return dict(sorted(_REGISTRY.items()))


# -- environments that wrap another one (they look the inner environment up by name) ----------

def feedback_slot(env: str, text: str = "all constraints pass", kwargs: dict[str, Any] | None = None) -> Environment:
    """An environment (``env``, with ``kwargs``) whose request ends with a FAFT feedback slot (``text``)."""
    return FeedbackSlot(make_env(env, **(kwargs or {})), text)


def with_experiences(env: str, path: str | None = None, lessons: list[str] | None = None,
                     kwargs: dict[str, Any] | None = None) -> Environment:
    """An environment (``env``, with ``kwargs``) whose prompt carries lessons: those of a tfgrpo run
    (``path``: its directory or experiences.json) or given inline (``lessons``)."""
    if (path is None) == (lessons is None):
        raise EnvError("with_experiences: give one of path (a tfgrpo run or its experiences.json) or lessons")
    return WithExperiences(make_env(env, **(kwargs or {})),
                           load_experiences(path, "with_experiences.path") if path is not None else lessons or [])


def simulated_user(env: str, user: str = "scripted", user_model: str = "", timeout_s: float = 60.0,
                   max_new_tokens: int = 120, kwargs: dict[str, Any] | None = None) -> Environment:
    """An environment (``env``, with ``kwargs``) whose user is simulated: ``user`` is scripted, openai:URL
    (``user_model`` names the model there) or a local model; it speaks from the request, which the agent
    sees only through it (envs/adapters/simulated_user.py)."""
    return SimulatedUser(make_env(env, **(kwargs or {})),
                         make_user(user, user_model=user_model, max_new_tokens=max_new_tokens, timeout_s=timeout_s),
                         timeout_s=timeout_s)


def retry(env: str, kwargs: dict[str, Any] | None = None, **options: Any) -> Environment:
    """An environment (``env``, with ``kwargs``) in which a failed attempt gets feedback, an optional
    reflection turn and another try (options retries, reflect, feedback, inject_error; envs/adapters/retry.py)."""
    return RetryEnv(make_env(env, **(kwargs or {})), parse_env_options(RetryOptions, "retry", options))


def fold(env: str, kwargs: dict[str, Any] | None = None, **options: Any) -> Environment:
    """An environment (``env``, with ``kwargs``) with ``branch`` / ``return`` tools: a returned sub-task's turns
    leave the agent's context, only its summary stays (options max_summary_chars, instructions;
    envs/adapters/fold.py)."""
    return FoldEnv(make_env(env, **(kwargs or {})), parse_env_options(FoldOptions, "fold", options))


def roles(env: str, kwargs: dict[str, Any] | None = None, **options: Any) -> Environment:
    """An environment (``env``, with ``kwargs``) acted in by several roles in turn, each with its own
    instructions and tools (options roles: [{name, tools, prompt, expert_weight}], order; envs/adapters/roles.py)."""
    return RolesEnv(make_env(env, **(kwargs or {})), parse_env_options(RolesOptions, "roles", options))


_REGISTRY.update(WORLDS)
_REGISTRY.update(ADAPTERS)
_REGISTRY.update(feedback_slot=feedback_slot, with_experiences=with_experiences, simulated_user=simulated_user,
                 retry=retry, fold=fold, roles=roles)
