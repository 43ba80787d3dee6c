"""`ctx db upgrade | downgrade | current | check | history`: the PostgreSQL schema's migrations.

The logic is in :mod:`context_core.postgres`; these commands resolve the target (``--dsn`` or
``CTX_POSTGRES_OWNER_URL``, ``--schema`` or ``CTX_POSTGRES_SCHEMA``, ``--app-role`` or
``CTX_POSTGRES_APP_ROLE`` / the user of ``CTX_POSTGRES_URL``) and print one line per result.
Exit codes: 0 done / at head, 1 behind (``check``), 2 a setting or privilege problem, 3 the
server did not answer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from context_core.postgres import MigrationTarget

app = typer.Typer(
    no_args_is_help=True,
    help="The PostgreSQL schema (compliance profiles) as versioned migrations: upgrade it as "
    "the owner role before the service starts.",
)

Dsn = Annotated[
    str | None,
    typer.Option(
        "--dsn",
        help="postgresql://owner@host:port/db of the schema's owner role "
        "(default: CTX_POSTGRES_OWNER_URL; `current`/`check` fall back to CTX_POSTGRES_URL).",
        show_default=False,
    ),
]
Schema = Annotated[
    str | None,
    typer.Option(
        "--schema", help="Schema to migrate (default: CTX_POSTGRES_SCHEMA).", show_default=False
    ),
]
AppRole = Annotated[
    str | None,
    typer.Option(
        "--app-role",
        help="Serving role to grant USAGE + SELECT/INSERT/UPDATE/DELETE, never CREATE "
        "(default: CTX_POSTGRES_APP_ROLE, else the user of CTX_POSTGRES_URL).",
        show_default=False,
    ),
]


def _target(
    dsn: str | None, schema: str | None, app_role: str | None, *, for_reading: bool
) -> MigrationTarget:
    from context_core.config import get_settings
    from context_core.postgres import MigrationTarget

    return MigrationTarget.from_settings(
        get_settings(), dsn=dsn, schema=schema, app_role=app_role, for_reading=for_reading
    )


def _fail(e: Exception) -> typer.Exit:
    from context_core.errors import BackendUnavailableError

    typer.secho(str(e), fg=typer.colors.RED, err=True)
    return typer.Exit(3 if isinstance(e, BackendUnavailableError) else 2)


@app.command()
def upgrade(
    dsn: Dsn = None,
    schema: Schema = None,
    app_role: AppRole = None,
    revision: Annotated[
        str, typer.Option("--revision", help="Revision to reach (default: the newest).")
    ] = "head",
) -> None:
    """Migrate the schema up as the owner role and grant the serving role (idempotent)."""
    from context_core.errors import ContextError
    from context_core.postgres import hide_password, serving_privileges, upgrade

    try:
        target = _target(dsn, schema, app_role, for_reading=False)
        after = upgrade(target, revision)
    except ContextError as e:
        raise _fail(e) from e
    where = f"as role {after.role} on {hide_password(target.dsn).rsplit('@', 1)[-1]}"
    if not after.changed:
        typer.echo(f"schema {after.schema} already at {after.current}, nothing to run ({where})")
    else:
        typer.echo(
            f"upgraded schema {after.schema} from {after.previous or '(none)'} to "
            f"{after.current} {where}"
        )
    if target.app_role is None:
        typer.echo("no serving role to grant (set CTX_POSTGRES_APP_ROLE or CTX_POSTGRES_URL)")
    else:
        try:
            held = serving_privileges(target)
        except ContextError as e:
            raise _fail(e) from e
        typer.echo(f"serving role {target.app_role} holds (read back from the catalog):")
        for what, privileges in held.items():
            typer.echo(f"  {what}: {', '.join(privileges) or '-'}")
    typer.echo(after.describe())


@app.command()
def downgrade(
    revision: Annotated[
        str, typer.Argument(help="Revision to go back to (`ctx db history`); base = none.")
    ],
    dsn: Dsn = None,
    schema: Schema = None,
    yes: Annotated[
        bool, typer.Option("--yes", help="Confirm: a downgrade drops what newer revisions added.")
    ] = False,
) -> None:
    """Migrate the schema down to REVISION (base drops the tables and their data)."""
    from context_core.errors import ContextError
    from context_core.postgres import downgrade

    if not yes:
        typer.secho(
            f"a downgrade to {revision} drops what the newer revisions created (to base: the "
            "tables and every row). Add --yes to confirm.",
            fg=typer.colors.RED,
            err=True,
        )
        raise typer.Exit(2)
    try:
        after = downgrade(_target(dsn, schema, None, for_reading=False), revision)
    except ContextError as e:
        raise _fail(e) from e
    typer.echo(after.describe())


@app.command()
def current(dsn: Dsn = None, schema: Schema = None) -> None:
    """Print the schema's revision and the code's head."""
    from context_core.errors import ContextError
    from context_core.postgres import status

    try:
        st = status(_target(dsn, schema, None, for_reading=True))
    except ContextError as e:
        raise _fail(e) from e
    typer.echo(st.describe())


@app.command()
def check(dsn: Dsn = None, schema: Schema = None) -> None:
    """Exit 0 when the schema is at the code's head, else 1 naming `ctx db upgrade`."""
    from context_core.errors import ContextError
    from context_core.postgres import status

    try:
        st = status(_target(dsn, schema, None, for_reading=True))
    except ContextError as e:
        raise _fail(e) from e
    if not st.up_to_date:
        typer.secho(st.describe(), fg=typer.colors.RED, err=True)
        raise typer.Exit(1)
    typer.echo(st.describe())


@app.command()
def history() -> None:
    """List the revisions this code ships, oldest first (no database needed)."""
    from context_core.postgres import revision_log

    for revision, summary in revision_log():
        typer.echo(f"{revision}  {summary}")
