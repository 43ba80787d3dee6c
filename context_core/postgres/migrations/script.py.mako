"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}
"""

from __future__ import annotations

from alembic import op

from context_core.postgres.schema import target_of

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = None
depends_on = None


def upgrade() -> None:
    target = target_of(op.get_context().config)
    ${upgrades if upgrades else "raise NotImplementedError"}


def downgrade() -> None:
    target = target_of(op.get_context().config)
    ${downgrades if downgrades else "raise NotImplementedError"}
