"""Uploads found by their sha256 and indexed when they arrive; a running job's estimated time left.

Revision ID: 0005
Revises: 0004
Create Date: 2027-01-10
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("uploads") as batch:
        batch.add_column(sa.Column("contents", sa.JSON(), nullable=True))
        batch.create_index("ix_uploads_owner_sha256", ["owner_id", "sha256"])
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("eta_s", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("eta_s")
    with op.batch_alter_table("uploads") as batch:
        batch.drop_index("ix_uploads_owner_sha256")
        batch.drop_column("contents")
