"""durable-job leases: owner, lease expiry and heartbeat on every job kind; attempts on batches and
model versions (re-index jobs)

Revision ID: r21_job_leases
Revises: 0005_miner_version
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "r21_job_leases"
down_revision = "0005_miner_version"
branch_labels = None
depends_on = None

LEASED = ("mining_job", "batch", "model_version", "training_run")


def upgrade() -> None:
    for table in LEASED:
        if table != "mining_job":  # it has had one since 0001
            op.add_column(table, sa.Column("enqueued_at", sa.DateTime(timezone=True)))
        op.add_column(table, sa.Column("lease_owner", sa.String(128)))
        op.add_column(table, sa.Column("lease_expires_at", sa.DateTime(timezone=True)))
        if table != "training_run":  # it has had a heartbeat since 0004
            op.add_column(table, sa.Column("heartbeat_at", sa.DateTime(timezone=True)))
    for table in ("batch", "model_version"):
        op.add_column(table, sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"))
    # The recovery sweep looks for running jobs whose lease ran out.
    op.create_index("ix_mining_job_status_lease", "mining_job", ["status", "lease_expires_at"])
    op.create_index("ix_batch_status", "batch", ["status"])


def downgrade() -> None:
    op.drop_index("ix_batch_status", table_name="batch")
    op.drop_index("ix_mining_job_status_lease", table_name="mining_job")
    for table in ("batch", "model_version"):
        op.drop_column(table, "attempts")
    for table in LEASED:
        if table != "training_run":
            op.drop_column(table, "heartbeat_at")
        op.drop_column(table, "lease_expires_at")
        op.drop_column(table, "lease_owner")
        if table != "mining_job":
            op.drop_column(table, "enqueued_at")
