"""mining jobs keyed by the miner version that produced their rows

Revision ID: 0005_miner_version
Revises: 0004
Create Date: 2026-11-27

``backend_version`` (a settings constant, "1", never changed) gives way to ``miner_version``: the
version of the miner that mined the job (NULL while a job waits for whichever miner takes it).
Jobs mined before carry it in ``params.miner_version`` or in their panels' provenance. A re-mine by
a newer miner points the replaced job at its successor (``superseded_by_id``).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_miner_version"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("mining_job", sa.Column("miner_version", sa.String(128), nullable=True))
    op.add_column(
        "mining_job",
        sa.Column(
            "superseded_by_id",
            sa.Uuid(),
            sa.ForeignKey("mining_job.id", ondelete="SET NULL", name="fk_mining_job_superseded_by_id_mining_job"),
            nullable=True,
        ),
    )
    op.execute(
        "UPDATE mining_job SET miner_version = params->>'miner_version' "
        "WHERE status = 'succeeded' AND params ? 'miner_version'"
    )
    op.execute(
        "UPDATE mining_job AS j SET miner_version = p.version FROM "
        "(SELECT DISTINCT ON (mining_job_id) mining_job_id, provenance->>'version' AS version FROM panel "
        "WHERE provenance ? 'version' ORDER BY mining_job_id) AS p "
        "WHERE j.id = p.mining_job_id AND j.miner_version IS NULL AND j.status = 'succeeded'"
    )
    for table in ("panel", "region"):  # provenance names it as the job does
        op.execute(
            f"UPDATE {table} SET provenance = (provenance - 'version') "
            "|| jsonb_build_object('miner_version', provenance->'version') WHERE provenance ? 'version'"
        )
    op.drop_constraint("uq_mining_job_figure_backend", "mining_job", type_="unique")
    op.drop_column("mining_job", "backend_version")
    op.create_unique_constraint(
        "uq_mining_job_figure_backend_version",
        "mining_job",
        ["figure_id", "backend", "miner_version"],
        postgresql_nulls_not_distinct=True,
    )


def downgrade() -> None:
    # The old key allowed one job per figure and backend: the replaced ones go (their rows already did).
    op.execute("DELETE FROM mining_job WHERE superseded_by_id IS NOT NULL")
    op.execute(
        "DELETE FROM mining_job AS j USING mining_job AS k WHERE j.figure_id = k.figure_id "
        "AND j.backend = k.backend AND j.created_at < k.created_at"
    )
    op.drop_constraint("uq_mining_job_figure_backend_version", "mining_job", type_="unique")
    op.add_column(
        "mining_job", sa.Column("backend_version", sa.String(64), nullable=False, server_default="1")
    )
    op.alter_column("mining_job", "backend_version", server_default=None)
    op.create_unique_constraint(
        "uq_mining_job_figure_backend", "mining_job", ["figure_id", "backend", "backend_version"]
    )
    for table in ("panel", "region"):
        op.execute(
            f"UPDATE {table} SET provenance = (provenance - 'miner_version') "
            "|| jsonb_build_object('version', provenance->'miner_version') WHERE provenance ? 'miner_version'"
        )
    op.drop_column("mining_job", "superseded_by_id")
    op.drop_column("mining_job", "miner_version")
