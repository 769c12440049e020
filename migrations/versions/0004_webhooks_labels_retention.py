"""Webhooks (endpoints, the event outbox, deliveries and their attempts), job labels, per-job
notify URLs, and the mark of artifacts removed by retention.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def _utc() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("webhook_secret", sa.String(100), nullable=True))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("labels", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("notify_url", sa.Text(), nullable=True))
        batch.add_column(sa.Column("artifacts_expired", sa.Boolean(), nullable=True))
    op.execute("UPDATE jobs SET labels = '{}', artifacts_expired = false")
    with op.batch_alter_table("jobs") as batch:
        batch.alter_column("labels", existing_type=sa.JSON(), nullable=False)
        batch.alter_column("artifacts_expired", existing_type=sa.Boolean(), nullable=False)
    op.create_table(
        "job_labels",
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("key", sa.String(63), nullable=False),
        sa.Column("value", sa.String(255), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_job_labels_job_id_jobs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "key", name=op.f("pk_job_labels")),
    )
    op.create_index("ix_job_labels_key_value", "job_labels", ["key", "value"])
    op.create_table(
        "webhooks",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("owner_id", sa.String(32), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("secret", sa.String(100), nullable=False),
        sa.Column("events", sa.JSON(), nullable=False),
        sa.Column("created_at", _utc(), nullable=False),
        sa.ForeignKeyConstraint(["owner_id"], ["api_keys.id"], name=op.f("fk_webhooks_owner_id_api_keys")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhooks")),
    )
    op.create_index(op.f("ix_webhooks_owner_id"), "webhooks", ["owner_id"])
    op.create_table(
        "job_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("webhook_id", sa.String(40), nullable=False),
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("created_at", _utc(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_job_events_job_id_jobs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_events")),
        sa.UniqueConstraint("webhook_id", name=op.f("uq_job_events_webhook_id")),
    )
    op.create_index(op.f("ix_job_events_job_id"), "job_events", ["job_id"])
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("event_id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("endpoint_id", sa.String(32), nullable=True),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", _utc(), nullable=False),
        sa.Column("created_at", _utc(), nullable=False),
        sa.Column("delivered_at", _utc(), nullable=True),
        sa.CheckConstraint("status IN ('pending', 'delivered', 'failed')",
                           name=op.f("ck_webhook_deliveries_status_known")),
        sa.ForeignKeyConstraint(["event_id"], ["job_events.id"], name=op.f("fk_webhook_deliveries_event_id_job_events"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_deliveries")),
    )
    op.create_index(op.f("ix_webhook_deliveries_event_id"), "webhook_deliveries", ["event_id"])
    op.create_index(op.f("ix_webhook_deliveries_job_id"), "webhook_deliveries", ["job_id"])
    op.create_index("ix_webhook_deliveries_due", "webhook_deliveries", ["status", "next_attempt_at"])
    op.create_table(
        "webhook_attempts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("delivery_id", sa.Integer(), nullable=False),
        sa.Column("attempted_at", _utc(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("duration_ms", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["delivery_id"], ["webhook_deliveries.id"],
                                name=op.f("fk_webhook_attempts_delivery_id_webhook_deliveries"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_attempts")),
    )
    op.create_index(op.f("ix_webhook_attempts_delivery_id"), "webhook_attempts", ["delivery_id"])


def downgrade() -> None:
    op.drop_table("webhook_attempts")
    op.drop_table("webhook_deliveries")
    op.drop_table("job_events")
    op.drop_table("webhooks")
    op.drop_table("job_labels")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("artifacts_expired")
        batch.drop_column("notify_url")
        batch.drop_column("labels")
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("webhook_secret")
