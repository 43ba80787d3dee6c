"""``ctx``: the platform's command line. Each command group lives in its own module."""

from __future__ import annotations

import typer

from context_core.cli import eval as eval_cmds
from context_core.cli import ingest as ingest_cmds
from context_core.cli import run as run_cmds
from context_core.cli import service as service_cmds
from context_core.cli import session as session_cmds

__all__ = ["app"]

app = typer.Typer(
    name="ctx",
    help="Context platform for long-running agents: memory layers, ingestion, evaluation.",
    no_args_is_help=True,
    add_completion=False,
)
for module in (run_cmds, session_cmds, ingest_cmds, service_cmds):
    module.register(app)
app.add_typer(eval_cmds.app, name="eval", help="Threshold calibration, CER and health reports.")
