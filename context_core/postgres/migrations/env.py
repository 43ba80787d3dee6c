"""Alembic's environment for the platform's schema: run by :func:`context_core.postgres.upgrade`
(``ctx db upgrade``), which passes the target (owner DSN, schema, serving role) in the config.

Online only: the revisions read the database (what an older release left) before they act.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool, text

from context_core.postgres.schema import (
    CONNECT_TIMEOUT_S,
    LOCK_TIMEOUT_S,
    TABLES_SQL,
    grant_sql,
    record_start,
    sqlalchemy_url,
    target_of,
)


def run() -> None:
    if context.is_offline_mode():
        raise SystemExit("the platform's migrations run online only: `ctx db upgrade`")
    target = target_of(context.config)
    schema = target.schema
    engine = create_engine(
        sqlalchemy_url(target.dsn),
        poolclass=pool.NullPool,
        connect_args={"connect_timeout": CONNECT_TIMEOUT_S},
    )
    with engine.connect() as conn:
        # one migrator per schema at a time: a second deployment waits, then finds it done
        conn.execute(text("SELECT pg_advisory_lock(hashtext(:k))"), {"k": f"ctx-migrate-{schema}"})
        try:
            conn.execute(text(f"SET lock_timeout = '{LOCK_TIMEOUT_S}s'"))
            # the version table lives in the schema: it must exist before Alembic looks
            exists = conn.execute(
                text("SELECT 1 FROM pg_namespace WHERE nspname = :s"), {"s": schema}
            ).first()
            if exists is None:
                conn.execute(text(f"CREATE SCHEMA {schema}"))
            conn.commit()
            context.configure(
                connection=conn,
                version_table_schema=schema,
                transaction_per_migration=False,
            )
            record_start(context.config, context.get_context().get_current_revision())
            with context.begin_transaction():
                context.run_migrations()
                if target.app_role is not None:  # (again): what serving needs, no CREATE
                    sql = TABLES_SQL.replace("%(s)s", ":s")
                    tables = [r[0] for r in conn.execute(text(sql), {"s": schema})]
                    conn.exec_driver_sql(grant_sql(schema, target.app_role, tables))
            conn.commit()
        finally:
            conn.rollback()
            conn.execute(
                text("SELECT pg_advisory_unlock(hashtext(:k))"), {"k": f"ctx-migrate-{schema}"}
            )
            conn.commit()
    engine.dispose()


run()
