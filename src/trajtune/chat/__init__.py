"""trajtune.chat."""
