"""model versions and embedding spaces

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

STATUSES = ("registered", "indexing", "ready", "failed")


def upgrade() -> None:
    op.create_table(
        "model_version",
        sa.Column("id", sa.Uuid(), primary_key=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("architecture", sa.String(128), nullable=False),
        sa.Column("config", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("source", sa.String(1024), nullable=False),
        sa.Column("dim", sa.Integer(), nullable=False),
        sa.Column(
            "status",
            sa.Enum(*STATUSES, name="model_status", native_enum=False, create_constraint=True, length=32),
            nullable=False,
        ),
        sa.Column("error", sa.Text()),
        sa.Column("progress", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("metrics", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("training_run_id", sa.Uuid()),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.UniqueConstraint("name", "version", name="uq_model_version_name_version"),
        sa.CheckConstraint("dim > 0", name="ck_model_version_dim_positive"),
    )
    op.create_table(
        "embedding_space",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("active_version_id", sa.Uuid(), sa.ForeignKey("model_version.id", ondelete="SET NULL")),
        sa.Column("pending_version_id", sa.Uuid(), sa.ForeignKey("model_version.id", ondelete="SET NULL")),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("embedding_space")
    op.drop_table("model_version")
