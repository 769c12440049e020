"""A job's name and the display names of its inputs; the MLflow registration it asked for and its outcome.

Revision ID: 0006
Revises: 0005
Create Date: 2027-01-12
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("name", sa.String(length=200), nullable=True))
        batch.add_column(sa.Column("model_name", sa.String(length=255), nullable=True))
        batch.add_column(sa.Column("dataset_name", sa.String(length=255), nullable=True))
        batch.add_column(sa.Column("register", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("registration", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("registration")
        batch.drop_column("register")
        batch.drop_column("dataset_name")
        batch.drop_column("model_name")
        batch.drop_column("name")
