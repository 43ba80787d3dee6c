"""Run the migrations (Alembic) and check a schema's revision.

**Roles.** The migrations run as the schema's *owner* (``CTX_POSTGRES_OWNER_URL`` or an
explicit DSN): it creates the schema when missing, owns the tables and their row-level
security policies. The *serving* role (``CTX_POSTGRES_APP_ROLE``, by default the user of
``CTX_POSTGRES_URL``) gets USAGE on the schema, SELECT/INSERT/UPDATE/DELETE on the tables,
USAGE on their sequences and SELECT on ``alembic_version`` (to check the revision), never
CREATE. The owner must not be the serving role (it would keep CREATE).

**Where the revision lives.** ``<schema>.alembic_version``: each schema has its own history,
so two deployments (or two tests) on one database never see each other's revision.

**Concurrency.** An upgrade holds a session-level advisory lock named after the schema, so
two deployments starting at once run the migrations one after the other (the second finds
nothing to do). Each upgrade runs in one transaction (PostgreSQL's DDL is transactional):
a failed migration leaves the schema as it was. Statements wait at most
:data:`LOCK_TIMEOUT_S` for a table lock (a long transaction of the service holding one makes
the upgrade fail, naming the timeout, instead of queueing every request behind it).
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from context_core import defaults
from context_core.errors import BackendUnavailableError, ConfigError, SchemaBehindError

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from context_core.config import Settings

__all__ = [
    "LOCK_TIMEOUT_S",
    "MigrationTarget",
    "SchemaBehindError",
    "SchemaStatus",
    "check_revision",
    "downgrade",
    "grant_sql",
    "head_revision",
    "hide_password",
    "require_head",
    "revision_log",
    "revisions",
    "serving_privileges",
    "status",
    "upgrade",
]

#: how long a migration statement waits for a lock before the upgrade fails (seconds)
LOCK_TIMEOUT_S = 10
#: how long connecting may take (seconds)
CONNECT_TIMEOUT_S = 5
SCRIPT_LOCATION = "context_core.postgres:migrations"
UPGRADE_COMMAND = "ctx db upgrade"
_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_TARGET_KEY = "ctx_target"
_FROM_KEY = "ctx_from"  # env.py records the revision it found, under the advisory lock
# Alembic's `context` proxy is one module global: one migration per process at a time (other
# processes wait on the database's advisory lock instead)
_RUNNING = threading.Lock()


def _name(value: str, what: str) -> str:
    if not _NAME.fullmatch(value):
        raise ConfigError(
            f"{what}={value!r}: use 1-63 characters a-z 0-9 _ (starting with a letter or _)"
        )
    return value


def hide_password(dsn: str) -> str:
    """``dsn`` with its password replaced by ``***`` (for messages and logs)."""
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", dsn)


def sqlalchemy_url(dsn: str) -> str:
    """``dsn`` (``postgres://``/``postgresql://``) as SQLAlchemy's psycopg2 URL; a DSN of
    another form is a :class:`ConfigError` naming the expected shape."""
    if not re.match(r"^postgres(ql)?(\+psycopg2)?://", dsn):
        raise ConfigError(
            f"PostgreSQL DSN {hide_password(dsn)!r}: give a URL "
            "postgresql://role[:password]@host:port/database"
        )
    return re.sub(r"^postgres(ql)?(\+psycopg2)?://", "postgresql+psycopg2://", dsn)


def role_of(dsn: str) -> str | None:
    """The role a URL DSN connects as (None when it names none: libpq's default)."""
    from sqlalchemy.engine import make_url

    return make_url(sqlalchemy_url(dsn)).username or None


@dataclass(frozen=True, slots=True)
class MigrationTarget:
    """Where and as whom the migrations run.

    ``dsn``: the owner role's URL; ``schema``: the platform's schema
    (``CTX_POSTGRES_SCHEMA``); ``app_role``: the serving role to grant (None: no grants,
    e.g. a schema only an operator reads)."""

    dsn: str
    schema: str = defaults.POSTGRES_SCHEMA
    app_role: str | None = None

    def __post_init__(self) -> None:
        sqlalchemy_url(self.dsn)
        _name(self.schema, "CTX_POSTGRES_SCHEMA")
        if self.app_role is not None:
            _name(self.app_role, "CTX_POSTGRES_APP_ROLE")

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        dsn: str | None = None,
        schema: str | None = None,
        app_role: str | None = None,
        for_reading: bool = False,
    ) -> MigrationTarget:
        """From :class:`~context_core.config.Settings`, each argument overriding its setting.

        The DSN is ``dsn``, else ``CTX_POSTGRES_OWNER_URL``; ``for_reading`` (``current``,
        ``check``) also accepts ``CTX_POSTGRES_URL``. The serving role is ``app_role``, else
        ``CTX_POSTGRES_APP_ROLE``, else the user of ``CTX_POSTGRES_URL``."""
        owner = settings.postgres_owner_url
        chosen = dsn or (owner.get_secret_value() if owner is not None else None)
        if chosen is None and for_reading:
            chosen = settings.postgres_url
        if not chosen:
            raise ConfigError(
                "no DSN: set CTX_POSTGRES_OWNER_URL (postgresql://owner@host:port/db, "
                "the role that owns the schema) or pass --dsn"
            )
        role = app_role or settings.postgres_app_role
        if role is None and settings.postgres_url:
            role = role_of(settings.postgres_url)
        return cls(chosen, schema or settings.postgres_schema, role)


@dataclass(frozen=True, slots=True)
class SchemaStatus:
    """A schema's revision against the code's head."""

    schema: str
    current: str | None  # None: never migrated
    head: str
    role: str  # the role that looked
    #: after :func:`upgrade`/:func:`downgrade`: the revision found when the migration began
    #: (under the lock), else ``current``
    previous: str | None = None

    @property
    def changed(self) -> bool:
        """True when the migration this status reports moved the revision."""
        return self.previous != self.current

    @property
    def up_to_date(self) -> bool:
        return self.current == self.head

    def describe(self) -> str:
        """One line for the CLI (``ctx db current``)."""
        state = "up to date" if self.up_to_date else f"behind: run `{UPGRADE_COMMAND}`"
        if self.current is not None and self.current not in set(revisions()):
            state = "ahead of this code (a newer release migrated it): deploy that release"
        return (
            f"schema {self.schema}: revision {self.current or '(none)'}, head {self.head} ({state})"
        )


# --- the script directory ----------------------------------------------------------------------


def _config(target: MigrationTarget | None = None) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", SCRIPT_LOCATION)
    if target is not None:
        cfg.attributes[_TARGET_KEY] = target
    return cfg


@functools.lru_cache(maxsize=1)
def _scripts() -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_config())


def head_revision() -> str:
    """The newest revision this code ships (one head: the history is linear)."""
    head = _scripts().get_current_head()
    assert head is not None, "the migrations directory holds no revision"
    return head


def revisions() -> list[str]:
    """Every revision, oldest first."""
    return [s.revision for s in reversed(list(_scripts().walk_revisions()))]


def revision_log() -> list[tuple[str, str]]:
    """Every revision with the first line of its docstring, oldest first."""
    out = []
    for script in reversed(list(_scripts().walk_revisions())):
        lines = (script.doc or "").strip().splitlines()
        out.append((script.revision, lines[0] if lines else ""))
    return out


def target_of(config: Config | None) -> MigrationTarget:
    """The target ``env.py`` and the revisions run for (set by :func:`upgrade`)."""
    target = None if config is None else config.attributes.get(_TARGET_KEY)
    if not isinstance(target, MigrationTarget):
        raise ConfigError(
            "the platform's migrations run through `ctx db upgrade` (or "
            "context_core.postgres.upgrade), not the bare alembic command"
        )
    return target


# --- running them -----------------------------------------------------------------------------


@contextmanager
def _guard(target: MigrationTarget, what: str) -> Iterator[None]:
    import sqlalchemy.exc

    try:
        yield
    except sqlalchemy.exc.OperationalError as e:
        raise BackendUnavailableError(
            f"PostgreSQL at {hide_password(target.dsn)} failed during {what}: "
            f"{str(e.orig).strip().splitlines()[0] if e.orig else e}; check the server and the DSN"
        ) from e
    except sqlalchemy.exc.ProgrammingError as e:  # privileges, a missing role
        first = str(e.orig).strip().splitlines()[0] if e.orig else str(e)
        raise ConfigError(
            f"{what} of schema {target.schema} as {role_of(target.dsn) or 'the default role'} "
            f"failed: {first}. The migrations need the schema's owner role "
            "(CTX_POSTGRES_OWNER_URL): CREATE on the database when the schema is missing, and "
            "the serving role (CTX_POSTGRES_APP_ROLE) must exist; adopting tables an older "
            "release created needs a superuser or a member of their owner role"
        ) from e


def grant_sql(schema: str, role: str, tables: Sequence[str]) -> str:
    """What the serving role gets: USAGE on the schema (never CREATE), DML on ``tables``,
    USAGE on the schema's sequences, SELECT on ``alembic_version``. Idempotent."""
    _name(schema, "CTX_POSTGRES_SCHEMA")
    _name(role, "CTX_POSTGRES_APP_ROLE")
    lines = [
        f"REVOKE CREATE ON SCHEMA {schema} FROM {role};",
        f"GRANT USAGE ON SCHEMA {schema} TO {role};",
        f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA {schema} TO {role};",
        f"GRANT SELECT ON {schema}.alembic_version TO {role};",
    ]
    if tables:
        names = ", ".join(f"{schema}.{_name(t, 'table')}" for t in tables)
        lines.append(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {names} TO {role};")
    return "\n".join(lines)


TABLES_SQL = (
    "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = %(s)s AND c.relkind IN ('r', 'p') AND c.relname <> 'alembic_version' "
    "ORDER BY 1"
)


def _tables(cur: Any, schema: str) -> list[str]:
    cur.execute(TABLES_SQL, {"s": schema})
    return [str(r[0]) for r in cur.fetchall()]


def serving_privileges(target: MigrationTarget) -> dict[str, list[str]]:
    """What the serving role may do: ``{"schema": [...], "<table>": [...]}`` (privilege
    names as PostgreSQL checks them), read from the catalog."""
    role = target.app_role
    if role is None:
        return {}
    out: dict[str, list[str]] = {}
    with _connect(target) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT p FROM unnest(ARRAY['USAGE', 'CREATE']) p "
            "WHERE has_schema_privilege(%s, %s, p)",
            (role, target.schema),
        )
        out["schema"] = [str(r[0]) for r in cur.fetchall()]
        for table in [*_tables(cur, target.schema), "alembic_version"]:
            cur.execute(
                "SELECT p FROM unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', "
                "'TRUNCATE', 'REFERENCES', 'TRIGGER']) p WHERE has_table_privilege(%s, %s, p)",
                (role, f"{target.schema}.{table}"),
            )
            out[table] = [str(r[0]) for r in cur.fetchall()]
    return out


def upgrade(target: MigrationTarget, revision: str = "head") -> SchemaStatus:
    """Migrate ``target.schema`` up to ``revision`` as the owner role and (re)grant the serving
    role on every table of the schema, in the same transaction and under the same advisory
    lock (``env.py``: a renamed serving role is granted by the next upgrade); the schema's new
    status."""
    from alembic import command

    owner = role_of(target.dsn)
    if owner is not None and owner == target.app_role:
        raise ConfigError(
            f"the owner DSN connects as {owner!r}, the serving role (CTX_POSTGRES_APP_ROLE / "
            "the user of CTX_POSTGRES_URL): it would keep CREATE on the schema. Run the "
            "migrations as a separate owner role (CTX_POSTGRES_OWNER_URL)"
        )
    cfg = _config(target)
    with _RUNNING, _guard(target, "upgrade"):
        command.upgrade(cfg, revision)
    return _after(target, cfg)


def downgrade(target: MigrationTarget, revision: str) -> SchemaStatus:
    """Migrate ``target.schema`` down to ``revision`` (``base``: drop the platform's tables,
    **and their data**)."""
    from alembic import command

    cfg = _config(target)
    with _RUNNING, _guard(target, "downgrade"):
        command.downgrade(cfg, revision)
    return _after(target, cfg)


def _after(target: MigrationTarget, cfg: Config) -> SchemaStatus:
    now = status(target)
    return replace(now, previous=cfg.attributes.get(_FROM_KEY, now.current))


def record_start(config: Config | None, revision: str | None) -> None:
    """``env.py``: the revision found once the advisory lock is held (what this run started
    from, whatever other deployments did before)."""
    if config is not None:
        config.attributes[_FROM_KEY] = revision


@contextmanager
def _connect(target: MigrationTarget) -> Iterator[Any]:
    """A psycopg2 connection over the target's DSN, one transaction, closed after."""
    import psycopg2

    try:
        conn = psycopg2.connect(target.dsn, connect_timeout=CONNECT_TIMEOUT_S)
    except psycopg2.Error as e:
        raise BackendUnavailableError(
            f"PostgreSQL at {hide_password(target.dsn)} did not accept a connection: "
            f"{str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}"
        ) from e
    try:
        with conn:
            yield conn
    finally:
        conn.close()


def status(target: MigrationTarget) -> SchemaStatus:
    """The schema's revision, read over the target's DSN."""
    with _connect(target) as conn, conn.cursor() as cur:
        current = read_revision(cur, target.schema)
        cur.execute("SELECT current_user")
        role = str(cur.fetchone()[0])
    return SchemaStatus(target.schema, current, head_revision(), role, current)


def read_revision(cur: Any, schema: str) -> str | None:
    """The revision recorded in ``schema`` (a psycopg2 cursor), None when never migrated."""
    _name(schema, "CTX_POSTGRES_SCHEMA")
    cur.execute("SELECT to_regclass(%s)", (f"{schema}.alembic_version",))
    if cur.fetchone()[0] is None:
        return None
    cur.execute(f"SELECT version_num FROM {schema}.alembic_version")
    rows = cur.fetchall()
    return str(rows[0][0]) if rows else None


def require_head(dsn: str, schema: str) -> str:
    """Connect over ``dsn`` (the serving role) and :func:`check_revision`: what ``ctx serve``
    runs before it starts any worker."""
    with _connect(MigrationTarget(dsn, schema)) as conn, conn.cursor() as cur:
        return check_revision(cur, schema)


def check_revision(cur: Any, schema: str) -> str:
    """Refuse (:class:`SchemaBehindError`, naming ``ctx db upgrade``) unless ``schema`` is at
    the head revision; the revision otherwise. What a store calls when it opens."""
    import psycopg2

    try:
        current = read_revision(cur, schema)
    except psycopg2.errors.InsufficientPrivilege as e:
        raise SchemaBehindError(
            f"the serving role may not read {schema}.alembic_version: run `{UPGRADE_COMMAND}` "
            "as the owner role with CTX_POSTGRES_APP_ROLE naming this role (it grants the "
            "privileges serving needs)"
        ) from e
    head = head_revision()
    if current == head:
        return current
    if current is None:
        raise SchemaBehindError(
            f"PostgreSQL schema {schema} has no migrations applied (the code needs revision "
            f"{head}): run `{UPGRADE_COMMAND}` as the schema's owner role "
            "(CTX_POSTGRES_OWNER_URL) before starting the service"
        )
    if current not in set(revisions()):
        raise SchemaBehindError(
            f"PostgreSQL schema {schema} is at revision {current}, unknown to this code (head "
            f"{head}): a newer release migrated it; deploy that release"
        )
    raise SchemaBehindError(
        f"PostgreSQL schema {schema} is at revision {current}, behind the code's head {head}: "
        f"run `{UPGRADE_COMMAND}` as the schema's owner role (CTX_POSTGRES_OWNER_URL) before "
        "starting the service"
    )
