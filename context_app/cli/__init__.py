"""``ctx``: the platform's command line. Each command group lives in its own module."""

from __future__ import annotations

import logging

import typer

from context_app.cli import airflow_deploy as airflow_cmds
from context_app.cli import db as db_cmds
from context_app.cli import eval as eval_cmds
from context_app.cli import governance as governance_cmds
from context_app.cli import ingest as ingest_cmds
from context_app.cli import run as run_cmds
from context_app.cli import service as service_cmds
from context_app.cli import session as session_cmds

__all__ = ["app"]

app = typer.Typer(
    name="ctx",
    help="Context platform for long-running agents: memory layers, ingestion, evaluation.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _configure(
    log_level: str = typer.Option(
        None, "--log-level", help="DEBUG, INFO, WARNING or ERROR (default: CTX_LOG_LEVEL, INFO)."
    ),
) -> None:
    """Set up logging once for every command; every log line passes the sanitize gateway."""
    from context_core.config import get_settings
    from context_core.errors import ConfigError
    from context_core.gateway.sanitize import Gateway, install_log_redaction

    try:
        settings = get_settings(**({"log_level": log_level} if log_level else {}))
    except ConfigError as e:
        typer.secho(str(e), fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from e
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # Third-party chatter drowns the progress bars at INFO.
    # (Alembic announces each plugin it loads; its "Running upgrade ..." lines stay)
    noisy_loggers = ("httpx", "sentence_transformers", "great_expectations", "urllib3")
    for noisy in (*noisy_loggers, "alembic.runtime.plugins"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
    install_log_redaction(Gateway.from_settings(settings))


for module in (run_cmds, session_cmds, ingest_cmds, service_cmds, governance_cmds):
    module.register(app)
app.add_typer(eval_cmds.app, name="eval", help="Threshold calibration, CER and health reports.")
app.add_typer(airflow_cmds.app, name="airflow", help="The DAGs under a real local Airflow 3.")
app.add_typer(db_cmds.app, name="db", help="The PostgreSQL schema's migrations (owner role).")
