"""PostgreSQL: the platform's schema, created and changed by versioned Alembic migrations.

The migrations live in this package (``migrations/``) and run as the schema's **owner** role
(``ctx db upgrade``, ``CTX_POSTGRES_OWNER_URL``); the **serving** role (the user of
``CTX_POSTGRES_URL``, or ``CTX_POSTGRES_APP_ROLE``) is granted only what serving needs. A
store opening on a schema behind the code's head revision refuses, naming the command.
"""

from context_core.postgres.schema import (
    MigrationTarget,
    SchemaBehindError,
    SchemaStatus,
    check_revision,
    downgrade,
    head_revision,
    hide_password,
    require_head,
    revision_log,
    revisions,
    serving_privileges,
    status,
    upgrade,
)

__all__ = [
    "MigrationTarget",
    "SchemaBehindError",
    "SchemaStatus",
    "check_revision",
    "downgrade",
    "head_revision",
    "hide_password",
    "require_head",
    "revision_log",
    "revisions",
    "serving_privileges",
    "status",
    "upgrade",
]
