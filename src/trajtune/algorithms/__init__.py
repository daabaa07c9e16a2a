"""trajtune.algorithms."""
