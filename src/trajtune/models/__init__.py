"""trajtune.models."""
