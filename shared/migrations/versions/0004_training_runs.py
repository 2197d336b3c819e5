"""training runs

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

STATUSES = ("queued", "exporting", "training", "evaluating", "completed", "failed", "cancelled")


def _json(name: str) -> sa.Column[object]:
    return sa.Column(name, postgresql.JSONB(astext_type=sa.Text()), nullable=False)


def upgrade() -> None:
    op.create_table(
        "training_run",
        sa.Column("id", sa.Uuid(), primary_key=True),
        sa.Column("name", sa.String(128)),
        sa.Column(
            "status",
            sa.Enum(
                *STATUSES, name="training_run_status", native_enum=False, create_constraint=True, length=32
            ),
            nullable=False,
        ),
        _json("config"),
        _json("data"),
        _json("options"),
        sa.Column("snapshot_prefix", sa.String(1024)),
        _json("snapshot"),
        sa.Column("out_prefix", sa.String(1024), nullable=False),
        _json("progress"),
        _json("metrics"),
        sa.Column("checkpoint", sa.String(1024)),
        sa.Column("final_model", sa.String(1024)),
        sa.Column(
            "model_version_id",
            sa.Uuid(),
            sa.ForeignKey(
                "model_version.id", ondelete="SET NULL", name="fk_training_run_model_version_id_model_version"
            ),
        ),
        sa.Column("error", sa.Text()),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True)),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True)),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
    )
    op.create_index("ix_training_run_status_created", "training_run", ["status", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_training_run_status_created", table_name="training_run")
    op.drop_table("training_run")
