"""The environments that ship with trajtune, by the name they are registered under.

Why a table and not ``@register_env`` in each module: an environment module then imports only the
protocol (``trajtune.envs.base``), never the registry, so the registry can import every built-in
without a circle. Plug-ins (BFCL, TextWorld, a third party's) are not here: they are found through
``trajtune.plugins`` when their name is first asked for.
"""

from __future__ import annotations

from trajtune.envs.adapters.from_config import gym, mcp, python_tools
from trajtune.envs.bandit import BanditEnv
from trajtune.envs.code_math import CodeMathEnv
from trajtune.envs.fncall import FncallEnv
from trajtune.envs.home import HomeEnv
from trajtune.envs.masked_search import MaskedSearchEnv
from trajtune.envs.memory import MemoryEnv
from trajtune.envs.safety import SafetyEnv
from trajtune.envs.search_qa import SearchQAEnv
from trajtune.envs.sokoban import SokobanEnv
from trajtune.envs.spec_env import SpecEnv
from trajtune.envs.tictactoe import TicTacToeEnv
from trajtune.envs.trip import TripEnv
from trajtune.envs.workspace import WorkspaceEnv

#: The task worlds (each has tasks, a scripted expert and a verifier).
WORLDS = {
    "home": HomeEnv, "workspace": WorkspaceEnv, "code_math": CodeMathEnv, "search_qa": SearchQAEnv,
    "bandit": BanditEnv, "tictactoe": TicTacToeEnv, "sokoban": SokobanEnv, "memory": MemoryEnv,
    "fncall": FncallEnv, "trip": TripEnv, "safety": SafetyEnv, "masked_search": MaskedSearchEnv,
    "spec": SpecEnv,
}
#: The adapters a config names with a short form (``{python_tools: ...}``, ``{gym: ...}``, ``{mcp: ...}``).
ADAPTERS = {"python_tools": python_tools, "gym": gym, "mcp": mcp}

#: The worlds tests/test_envs_builtin.py checks one by one (``home``, the demo's world, is covered
#: by the rollout and demo tests).
BUILTIN_ENVS = tuple(name for name in WORLDS if name != "home")
