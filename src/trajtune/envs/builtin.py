"""Imports the built-in environments so that ``@register_env`` runs for each of them."""

from trajtune.envs import bandit, code_math, fncall, memory, safety, search_qa, sokoban, tictactoe, trip, workspace  # noqa: F401

BUILTIN_ENVS = ("workspace", "code_math", "search_qa", "bandit", "tictactoe", "sokoban", "memory", "fncall", "trip", "safety")
