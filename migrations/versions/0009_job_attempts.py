"""Every attempt at a job (its worker, start, end, why it ended, the step it resumed from), and every
registration of its model.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def _utc() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "job_attempts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.String(255), nullable=False),
        sa.Column("started_at", _utc(), nullable=False),
        sa.Column("ended_at", _utc(), nullable=True),
        sa.Column("end_reason", sa.String(16), nullable=True),
        sa.Column("resumed_from", sa.String(255), nullable=True),
        sa.CheckConstraint("end_reason IN ('completed', 'failed', 'cancelled', 'handed_back', 'lost')",
                           name=op.f("ck_job_attempts_end_reason_known")),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_job_attempts_job_id_jobs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_attempts")),
        sa.UniqueConstraint("job_id", "number", name=op.f("uq_job_attempts_job_id_number")),
    )
    op.create_index(op.f("ix_job_attempts_job_id"), "job_attempts", ["job_id"])
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("registration_history", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("registration_history")
    op.drop_index(op.f("ix_job_attempts_job_id"), table_name="job_attempts")
    op.drop_table("job_attempts")
