"""Leases on running jobs, the time a job was last enqueued, and uploads that are not complete yet.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def _utc() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("lease_expires_at", _utc(), nullable=True))
        batch.add_column(sa.Column("enqueued_at", _utc(), nullable=True))
    with op.batch_alter_table("uploads") as batch:
        batch.add_column(sa.Column("completed_at", _utc(), nullable=True))
    # Uploads recorded before this revision were recorded only once stored, so they are complete.
    op.execute("UPDATE uploads SET completed_at = created_at")
    # Jobs already queued count as sent at creation: the sweeper re-sends them if the broker lost them.
    op.execute("UPDATE jobs SET enqueued_at = created_at WHERE status = 'queued'")
    # Jobs running under workers that predate leases send no heartbeats: their lease is taken as
    # ended at their last update, so the sweeper re-queues them (stop workers before upgrading).
    op.execute("UPDATE jobs SET lease_expires_at = updated_at WHERE status = 'running'")


def downgrade() -> None:
    with op.batch_alter_table("uploads") as batch:
        batch.drop_column("completed_at")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("enqueued_at")
        batch.drop_column("lease_expires_at")
