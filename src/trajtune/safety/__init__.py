"""Agentic safety: refusal detection (``refusal``) for the ``safety`` environment and its metrics."""
