"""`ctx erase` (a user's data out of every store; the ledger replayed after a restore) and
`ctx retention enforce`."""

from __future__ import annotations

import json

import typer

retention_app = typer.Typer(help="Delete what is older than each org's data_retention_policy.")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root app."""
    app.command("erase")(erase)
    retention_app.command("enforce")(retention_enforce)
    app.add_typer(retention_app, name="retention")


def retention_enforce(
    dry_run: bool = typer.Option(False, "--dry-run", help="Count what would go; delete nothing."),
    as_of: str = typer.Option(
        None,
        "--as-of",
        help="With --dry-run only: count what would go at this ISO-8601 time (e.g. "
        "2026-12-31T00:00:00+00:00) instead of now.",
    ),
) -> None:
    """Delete route-trace lines, L3 points and preferences older than their organisation's
    data_retention_policy (orgs of CTX_API_KEYS_FILE); print the receipt (JSON: cut-offs and
    counts per store, no values), also appended to the audit log. Idempotent."""
    from context_app.governance import run_retention
    from context_core.config import get_settings
    from context_core.errors import ContextError

    at = None
    if as_of is not None:
        import datetime as dt

        if not dry_run:
            typer.secho("--as-of needs --dry-run: deletes use the real clock", fg="red", err=True)
            raise typer.Exit(2)
        try:
            when = dt.datetime.fromisoformat(as_of)
        except ValueError as e:
            typer.secho(f"--as-of {as_of!r}: not an ISO-8601 time ({e})", fg="red", err=True)
            raise typer.Exit(2) from e
        at = (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).timestamp()
    settings = get_settings()
    try:
        receipt = run_retention(settings, dry_run=dry_run, at=at)
    except ContextError as e:
        typer.secho(str(e), fg="red", err=True)
        raise typer.Exit(2) from e
    typer.echo(json.dumps(receipt, indent=2))


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
    from context_app.governance import erasure_target
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
            target = erasure_target(settings, platform)
            receipt = replay_ledger(target) if replay else erase_user(target, org, user)
    except ContextError as e:
        typer.secho(str(e), fg="red", err=True)
        raise typer.Exit(2) from e
    typer.echo(json.dumps(receipt.to_dict(), indent=2))
