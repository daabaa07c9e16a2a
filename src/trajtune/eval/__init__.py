"""trajtune.eval."""
