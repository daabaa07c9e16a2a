"""τ²-bench (airline, retail) on its domains' MCP servers: ``env.py`` runs episodes, ``score.py`` judges them."""

from trajtune.plugins.tau2.env import Tau2Env

__all__ = ["Tau2Env"]
