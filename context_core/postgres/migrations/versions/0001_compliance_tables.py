"""Compliance profiles and their audit trail, under row-level security per organisation.

The baseline: what ``PostgresComplianceStore`` created itself before migrations existed, so it
is written to **adopt** such a schema too (every statement idempotent): tables kept with their
rows, schema and tables handed over to the owner role running the migration (the old code ran
as the serving role, which therefore owned them and could CREATE), row-level security enabled
and forced, the ``ctx_org_isolation`` policies created where missing, and the serving role
granted exactly what the store needs.

Revision ID: 0001
Revises:
Create Date: 2026-12-05
"""

from __future__ import annotations

from alembic import op

from context_core.postgres.schema import grant_sql, target_of

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TABLES = ("compliance_profiles", "compliance_audit")

_TABLES = """
CREATE TABLE IF NOT EXISTS {s}.compliance_profiles (
    org_id      text        NOT NULL,
    user_id     text        NOT NULL DEFAULT '',
    version     integer     NOT NULL CHECK (version > 0),
    profile     jsonb       NOT NULL,
    sha256      text        NOT NULL,
    updated_at  timestamptz NOT NULL,
    updated_by  text        NOT NULL,
    PRIMARY KEY (org_id, user_id)
);
CREATE TABLE IF NOT EXISTS {s}.compliance_audit (
    id        bigserial   PRIMARY KEY,
    org_id    text        NOT NULL,
    user_id   text        NOT NULL DEFAULT '',
    version   integer     NOT NULL,
    operator  text        NOT NULL,
    at        timestamptz NOT NULL,
    sha256    text        NOT NULL,
    changed   text[]      NOT NULL,
    UNIQUE (org_id, user_id, version)
);
"""

# an older release's schema and tables belong to the serving role: the owner takes them over
# (ALTER ... OWNER moves the tables' indexes and serial sequences along)
_ADOPT = """
DO $$
DECLARE t text;
BEGIN
    IF (SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = '{s}')
            <> current_user THEN
        EXECUTE format('ALTER SCHEMA {s} OWNER TO %I', current_user);
    END IF;
    FOREACH t IN ARRAY ARRAY['compliance_profiles', 'compliance_audit'] LOOP
        IF (SELECT pg_get_userbyid(relowner) FROM pg_class
            WHERE oid = format('{s}.%I', t)::regclass) <> current_user THEN
            EXECUTE format('ALTER TABLE {s}.%I OWNER TO %I', t, current_user);
        END IF;
    END LOOP;
END $$;
"""

# FORCE: the policy binds the tables' owner too (only superusers and BYPASSRLS roles escape)
_RLS = """
ALTER TABLE {s}.compliance_profiles ENABLE ROW LEVEL SECURITY;
ALTER TABLE {s}.compliance_profiles FORCE ROW LEVEL SECURITY;
ALTER TABLE {s}.compliance_audit ENABLE ROW LEVEL SECURITY;
ALTER TABLE {s}.compliance_audit FORCE ROW LEVEL SECURITY;
DO $$
DECLARE t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['compliance_profiles', 'compliance_audit'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_policies
                       WHERE schemaname = '{s}' AND tablename = t
                         AND policyname = 'ctx_org_isolation') THEN
            EXECUTE format(
                'CREATE POLICY ctx_org_isolation ON {s}.%I '
                'USING (org_id = current_setting(''ctx.org_id'', true)) '
                'WITH CHECK (org_id = current_setting(''ctx.org_id'', true))', t);
        END IF;
    END LOOP;
END $$;
REVOKE ALL ON SCHEMA {s} FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA {s} FROM PUBLIC;
"""


def upgrade() -> None:
    target = target_of(op.get_context().config)
    s = target.schema  # names checked by MigrationTarget: [a-z_][a-z0-9_]*
    op.execute(_TABLES.format(s=s))
    op.execute(_ADOPT.format(s=s))
    op.execute(_RLS.format(s=s))
    if target.app_role is not None:  # what serving needs, and no CREATE (an adopted
        op.execute(grant_sql(s, target.app_role, TABLES))  # schema's serving role owned it)


def downgrade() -> None:
    s = target_of(op.get_context().config).schema
    for table in reversed(TABLES):  # their policies, indexes and sequences go with them
        op.execute(f"DROP TABLE IF EXISTS {s}.{table}")
