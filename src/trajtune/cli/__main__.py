"""``python -m trajtune.cli`` (and ``accelerate launch -m trajtune.cli train ...``)."""

from trajtune.cli.main import app

app()
