"""The error a user can fix when naming a model: one class, so every command reports it the same way."""

from __future__ import annotations

from trajtune import errors


class ModelLoadError(errors.ModelLoadError):
    """A model name, path or file that cannot be loaded; the message says why and how to fix it."""
