"""`ctx erase` (a user's data out of every store; the ledger replayed after a restore) and
`ctx retention enforce`."""

from __future__ import annotations

import json
from typing import Any

import typer

retention_app = typer.Typer(help="Delete what is older than each org's data_retention_policy.")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root app."""
    app.command("erase")(erase)
    retention_app.command("enforce")(retention_enforce)
    app.add_typer(retention_app, name="retention")


def _target(settings: Any, platform: Any) -> Any:
    from context_core.access.auth import DEV_AGENT, KeyStore
    from context_core.gateway.identity import DEFAULT_ORG
    from context_core.governance.erasure import ErasureTarget

    if settings.api_keys_file is not None:
        agent_orgs = {a.agent_id: a.org for a in KeyStore.load(settings.api_keys_file).agents}
    else:  # the service's dev key acts for the default org
        agent_orgs = {DEV_AGENT: DEFAULT_ORG}
    return ErasureTarget.from_settings(
        settings,
        redis=platform.redis,
        compliance=platform.compliance,
        store=platform.store,
        agent_orgs=agent_orgs,
    )


def retention_enforce(
    dry_run: bool = typer.Option(False, "--dry-run", help="Count what would go; delete nothing."),
) -> None:
    """Delete route-trace lines, L3 points and preferences older than their organisation's
    data_retention_policy (orgs of CTX_API_KEYS_FILE); print the receipt (JSON: cut-offs and
    counts per store, no values), also appended to the audit log. Idempotent."""
    from context_core.config import get_settings
    from context_core.errors import ContextError
    from context_core.governance.retention import enforce_retention
    from context_core.platform import build_platform

    settings = get_settings()
    try:
        with build_platform(settings, with_knowledge=False) as platform:
            receipt = enforce_retention(_target(settings, platform), dry_run=dry_run)
    except ContextError as e:
        typer.secho(str(e), fg="red", err=True)
        raise typer.Exit(2) from e
    typer.echo(json.dumps(receipt.to_dict(), indent=2))


def erase(
    org: str = typer.Option(None, "--org", help="The user's organisation (an API key's org)."),
    user: str = typer.Option(None, "--user", help="The user id as agents send it."),
    replay: bool = typer.Option(
        False,
        "--replay",
        help="Re-apply every erasure of the ledger (after restoring Redis, Qdrant or "
        "PostgreSQL from a backup, or after a crashed erasure); --org/--user not needed.",
    ),
) -> None:
    """Erase a user's data in every store of the inventory and print the receipt (JSON:
    counts per store and the user's keyed hash, never values). The erasure is recorded in the
    ledger (<CTX_DATA_DIR>/erasure/ledger.jsonl) first and its receipt appended to the audit
    log. Sessions are attributed to the org through CTX_API_KEYS_FILE (the owner agent's org)."""
    from context_core.config import get_settings
    from context_core.errors import ContextError
    from context_core.governance.erasure import erase_user, replay_ledger
    from context_core.platform import build_platform

    if not replay and (not org or not user):
        typer.secho("give --org and --user (or --replay)", fg="red", err=True)
        raise typer.Exit(2)
    settings = get_settings()
    try:
        with build_platform(settings, with_knowledge=False) as platform:
            target = _target(settings, platform)
            receipt = replay_ledger(target) if replay else erase_user(target, org, user)
    except ContextError as e:
        typer.secho(str(e), fg="red", err=True)
        raise typer.Exit(2) from e
    typer.echo(json.dumps(receipt.to_dict(), indent=2))
