"""``python -m context_app.cli``: the ``ctx`` command without its console script (how the
Airflow deployment runs ``ctx db upgrade`` with its own environment)."""

from context_app.cli import app

app(prog_name="ctx")
