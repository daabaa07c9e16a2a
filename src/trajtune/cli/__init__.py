"""The `trajtune` command line (typer). Commands hold no logic: they parse, validate and call."""
