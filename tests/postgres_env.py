"""PostgreSQL for tests: real roles and schemas of their own, migrated like a deployment.

The server is 127.0.0.1:5432, db ``test`` (``CTX_TEST_POSTGRES_URL`` overrides); its
``postgres`` role is a superuser and administers. Every helper here creates roles with unique
names, ``NOSUPERUSER NOBYPASSRLS`` (superusers and BYPASSRLS roles ignore row-level
security), and drops them, with their schema, at the end.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from context_core.postgres import MigrationTarget, upgrade

PG_ADMIN_URL = os.environ.get("CTX_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


def url_as(role: str, admin_url: str = PG_ADMIN_URL) -> str:
    """The admin URL's server and database, connecting as ``role`` (trust auth on loopback)."""
    return f"postgresql://{role}@{admin_url.split('@', 1)[1]}"


def connect(url: str, *, autocommit: bool = True) -> Any:
    import psycopg2

    conn = psycopg2.connect(url)
    conn.autocommit = autocommit
    return conn


@dataclass(frozen=True)
class Pg:
    """A schema and its serving role (``role``, connecting over ``app_url``)."""

    admin_url: str
    app_url: str
    schema: str
    role: str

    def admin(self) -> Any:
        return connect(self.admin_url)

    def app(self) -> Any:
        return connect(self.app_url, autocommit=False)

    def target(self, owner_url: str | None = None) -> MigrationTarget:
        """The migrations of this schema, run as ``owner_url`` (default: the superuser)."""
        return MigrationTarget(owner_url or self.admin_url, self.schema, self.role)


def pg_unreachable() -> str | None:
    try:
        import psycopg2
    except ImportError as e:  # pragma: no cover - psycopg2-binary is a dependency
        return f"psycopg2 is not installed ({e})"
    try:
        psycopg2.connect(PG_ADMIN_URL, connect_timeout=2).close()
    except psycopg2.OperationalError as e:
        return f"{type(e).__name__}: {str(e).strip().splitlines()[0]}"
    return None


def require_pg() -> None:
    reason = pg_unreachable()
    if reason is not None:
        pytest.skip(f"PostgreSQL at {PG_ADMIN_URL} is unreachable: {reason}")


def _suffix() -> str:
    return uuid.uuid4().hex[:10]


def create_role(cur: Any, prefix: str) -> str:
    role = f"{prefix}_{_suffix()}"
    cur.execute(f"CREATE ROLE {role} LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEROLE NOCREATEDB")
    return role


def drop_roles(cur: Any, *roles: str) -> None:
    """End the roles' sessions, drop what they own or were granted in this database, drop
    them; asserts they are gone."""
    for role in roles:
        cur.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,)
        )
        cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,))
        if cur.fetchone() is not None:
            cur.execute(f"DROP OWNED BY {role}")
            cur.execute(f"DROP ROLE {role}")
    cur.execute("SELECT count(*) FROM pg_roles WHERE rolname = ANY(%s)", (list(roles),))
    assert cur.fetchone()[0] == 0


@contextmanager
def pg_env(*, migrate: bool = True, prefix: str = "ctx_cmp") -> Iterator[Pg]:
    """A new serving role and schema name; migrated to head by the superuser (the owner)
    unless ``migrate`` is False (the schema does not exist then)."""
    require_pg()
    suffix = _suffix()
    conn = connect(PG_ADMIN_URL)
    try:
        with conn.cursor() as cur:
            role = create_role(cur, "ctx_app")
        env = Pg(PG_ADMIN_URL, url_as(role), f"{prefix}_{suffix}", role)
        try:
            if migrate:
                upgrade(env.target())
            yield env
        finally:
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                    (role,),
                )
                cur.execute(f"DROP SCHEMA IF EXISTS {env.schema} CASCADE")
                drop_roles(cur, role)
    finally:
        conn.close()
