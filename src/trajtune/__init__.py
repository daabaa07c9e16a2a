"""trajtune: turn open language models into better, safer agents."""

__version__ = "0.1.0"
