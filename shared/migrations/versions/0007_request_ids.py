"""request ids: the API request (X-Request-ID) that created each figure, mining job, batch, model
version and training run, so an upload can be followed from ingest to mining to embedding

Revision ID: 0007_request_ids
Revises: r21_job_leases
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_request_ids"
down_revision = "r21_job_leases"
branch_labels = None
depends_on = None

TABLES = ("figure", "mining_job", "batch", "model_version", "training_run")


def upgrade() -> None:
    for table in TABLES:
        op.add_column(table, sa.Column("request_id", sa.String(64)))


def downgrade() -> None:
    for table in TABLES:
        op.drop_column(table, "request_id")
