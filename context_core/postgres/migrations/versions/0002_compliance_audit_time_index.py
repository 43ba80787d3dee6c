"""An index on the audit trail by organisation and time.

Retention and bounded history delete an organisation's entries older than a cut-off without
reading the whole table.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-05
"""

from __future__ import annotations

from alembic import op

from context_core.postgres.schema import target_of

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    s = target_of(op.get_context().config).schema
    op.execute(
        f"CREATE INDEX IF NOT EXISTS compliance_audit_org_at ON {s}.compliance_audit (org_id, at)"
    )


def downgrade() -> None:
    s = target_of(op.get_context().config).schema
    op.execute(f"DROP INDEX IF EXISTS {s}.compliance_audit_org_at")
