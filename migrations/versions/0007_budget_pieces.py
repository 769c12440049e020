"""The pieces of an accuracy budget's search, for the worker pool to run side by side.

Revision ID: 0007
Revises: 0006
Create Date: 2027-01-20
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def _utc() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "budget_pieces",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("candidate", sa.String(128), nullable=False),
        sa.Column("piece", sa.Integer(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("resume_from", sa.Text(), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("worker_id", sa.String(255), nullable=True),
        sa.Column("lease_expires_at", _utc(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("created_at", _utc(), nullable=False),
        sa.Column("updated_at", _utc(), nullable=False),
        sa.CheckConstraint("status IN ('queued', 'running', 'done', 'cancelled')",
                           name=op.f("ck_budget_pieces_piece_status_known")),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_budget_pieces_job_id_jobs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_budget_pieces")),
        sa.UniqueConstraint("job_id", "attempt", "candidate", "piece",
                            name=op.f("uq_budget_pieces_job_id_attempt_candidate_piece")),
    )
    op.create_index("ix_budget_pieces_job_attempt", "budget_pieces", ["job_id", "attempt"])


def downgrade() -> None:
    op.drop_index("ix_budget_pieces_job_attempt", table_name="budget_pieces")
    op.drop_table("budget_pieces")
