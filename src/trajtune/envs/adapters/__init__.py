"""Adapters that turn what users already have into trajtune environments and policies.

- ``python_tools.PythonToolsEnv``: a plain Python class whose public methods are the tools;
- ``gym_text.GymTextEnv``: any gymnasium-style text environment (duck-typed, gymnasium optional);
- ``mcp_tools.MCPToolsEnv``: the tools of an MCP server started over stdio (needs ``mcp``);
- ``openai_policy.OpenAIChatPolicy``: an OpenAI-compatible chat endpoint acting as a policy.
"""
