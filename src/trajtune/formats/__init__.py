"""trajtune.formats."""
