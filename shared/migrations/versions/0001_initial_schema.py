"""initial schema

Revision ID: 0001
Revises: 
Create Date: 2026-11-22 01:27:39.849142
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    # pgvector is part of the platform: embeddings of every model version live in this database.
    op.execute("CREATE EXTENSION IF NOT EXISTS vector")
    op.create_table('api_key',
    sa.Column('id', sa.Uuid(), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('prefix', sa.String(length=16), nullable=False),
    sa.Column('secret_hash', sa.String(length=128), nullable=False),
    sa.Column('scopes', postgresql.ARRAY(sa.String(length=16)), nullable=False),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('last_used_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_key')),
    sa.UniqueConstraint('prefix', name=op.f('uq_api_key_prefix'))
    )
    op.create_table('article',
    sa.Column('id', sa.Uuid(), nullable=False),
    sa.Column('pmcid', sa.String(length=32), nullable=True),
    sa.Column('pmid', sa.String(length=32), nullable=True),
    sa.Column('doi', sa.String(length=256), nullable=True),
    sa.Column('title', sa.Text(), nullable=True),
    sa.Column('abstract', sa.Text(), nullable=True),
    sa.Column('journal', sa.String(length=512), nullable=True),
    sa.Column('year', sa.Integer(), nullable=True),
    sa.Column('license', sa.String(length=256), nullable=True),
    sa.Column('license_group', sa.Enum('commercial', 'noncommercial', 'other', name='license_group', native_enum=False, create_constraint=True, length=32), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_article')),
    sa.UniqueConstraint('doi', name=op.f('uq_article_doi')),
    sa.UniqueConstraint('pmcid', name=op.f('uq_article_pmcid')),
    sa.UniqueConstraint('pmid', name=op.f('uq_article_pmid'))
    )
    op.create_table('batch',
    sa.Column('id', sa.Uuid(), nullable=False),
    sa.Column('kind', sa.Enum('manifest', 'webdataset', 'pmc', name='batch_kind', native_enum=False, create_constraint=True, length=32), nullable=False),
    sa.Column('source', sa.Text(), nullable=False),
    sa.Column('status', sa.Enum('queued', 'running', 'succeeded', 'completed_with_errors', 'failed', name='batch_status', native_enum=False, create_constraint=True, length=32), nullable=False),
    sa.Column('total', sa.Integer(), nullable=True),
    sa.Column('ingested', sa.Integer(), nullable=False),
    sa.Column('duplicates', sa.Integer(), nullable=False),
    sa.Column('failed', sa.Integer(), nullable=False),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_batch'))
    )
    op.create_table('figure',
    sa.Column('id', sa.Uuid(), nullable=False),
    sa.Column('image_sha256', sa.String(length=64), nullable=False),
    sa.Column('caption_sha256', sa.String(length=64), nullable=False),
    sa.Column('object_key', sa.String(length=512), nullable=False),
    sa.Column('byte_size', sa.BigInteger(), nullable=False),
    sa.Column('width', sa.Integer(), nullable=False),
    sa.Column('height', sa.Integer(), nullable=False),
    sa.Column('format', sa.String(length=16), nullable=False),
    sa.Column('caption', sa.Text(), nullable=False),
    sa.Column('figure_label', sa.String(length=128), nullable=True),
    sa.Column('inline_references', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('article_id', sa.Uuid(), nullable=True),
    sa.Column('source', sa.String(length=32), nullable=False),
    sa.Column('source_ref', sa.Text(), nullable=True),
    sa.Column('status', sa.Enum('queued', 'mining', 'mined', 'failed', name='figure_status', native_enum=False, create_constraint=True, length=32), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint('width > 0 AND height > 0', name=op.f('ck_figure_positive_size')),
    sa.ForeignKeyConstraint(['article_id'], ['article.id'], name=op.f('fk_figure_article_id_article'), ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_figure')),
    sa.UniqueConstraint('image_sha256', 'caption_sha256', name='uq_figure_image_caption')
    )
    op.create_index(op.f('ix_figure_article_id'), 'figure', ['article_id'], unique=False)
    op.create_index(op.f('ix_figure_image_sha256'), 'figure', ['image_sha256'], unique=False)
    op.create_index(op.f('ix_figure_status'), 'figure', ['status'], unique=False)
    op.create_table('batch_item',
    sa.Column('id', sa.Uuid(), nullable=False),
    sa.Column('batch_id', sa.Uuid(), nullable=False),
    sa.Column('item_key', sa.Text(), nullable=False),
    sa.Column('status', sa.Enum('ingested', 'duplicate', 'failed', name='batch_item_status', native_enum=False, create_constraint=True, length=32), nullable=False),
    sa.Column('figure_id', sa.Uuid(), nullable=True),
    sa.Column('error_type', sa.String(length=64), nullable=True),
    sa.Column('error_message', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['batch_id'], ['batch.id'], name=op.f('fk_batch_item_batch_id_batch'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['figure_id'], ['figure.id'], name=op.f('fk_batch_item_figure_id_figure'), ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_batch_item')),
    sa.UniqueConstraint('batch_id', 'item_key', name='uq_batch_item_key')
    )
    op.create_index('ix_batch_item_batch_status', 'batch_item', ['batch_id', 'status'], unique=False)
    op.create_table('mining_job',
    sa.Column('id', sa.Uuid(), nullable=False),
    sa.Column('figure_id', sa.Uuid(), nullable=False),
    sa.Column('backend', sa.String(length=32), nullable=False),
    sa.Column('backend_version', sa.String(length=64), nullable=False),
    sa.Column('prompt_version', sa.String(length=64), nullable=True),
    sa.Column('params', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('status', sa.Enum('queued', 'running', 'succeeded', 'failed', name='job_status', native_enum=False, create_constraint=True, length=32), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('stage_timings', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('cost', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('enqueued_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint('attempts >= 0', name=op.f('ck_mining_job_attempts_nonnegative')),
    sa.ForeignKeyConstraint(['figure_id'], ['figure.id'], name=op.f('fk_mining_job_figure_id_figure'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_mining_job')),
    sa.UniqueConstraint('figure_id', 'backend', 'backend_version', name='uq_mining_job_figure_backend')
    )
    op.create_index(op.f('ix_mining_job_status'), 'mining_job', ['status'], unique=False)
    op.create_table('panel',
    sa.Column('id', sa.Uuid(), nullable=False),
    sa.Column('figure_id', sa.Uuid(), nullable=False),
    sa.Column('mining_job_id', sa.Uuid(), nullable=False),
    sa.Column('ordinal', sa.Integer(), nullable=False),
    sa.Column('label', sa.String(length=16), nullable=True),
    sa.Column('box', postgresql.ARRAY(sa.Float()), nullable=False),
    sa.Column('crop_key', sa.String(length=512), nullable=True),
    sa.Column('subcaption', sa.Text(), nullable=True),
    sa.Column('description', sa.Text(), nullable=True),
    sa.Column('figure_type', sa.String(length=64), nullable=True),
    sa.Column('modality', sa.String(length=64), nullable=True),
    sa.Column('confidence', sa.Float(), nullable=True),
    sa.Column('provenance', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint('cardinality(box) = 4', name=op.f('ck_panel_box_has_four_numbers')),
    sa.ForeignKeyConstraint(['figure_id'], ['figure.id'], name=op.f('fk_panel_figure_id_figure'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['mining_job_id'], ['mining_job.id'], name=op.f('fk_panel_mining_job_id_mining_job'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_panel'))
    )
    op.create_index(op.f('ix_panel_figure_id'), 'panel', ['figure_id'], unique=False)
    op.create_index(op.f('ix_panel_mining_job_id'), 'panel', ['mining_job_id'], unique=False)
    op.create_table('region',
    sa.Column('id', sa.Uuid(), nullable=False),
    sa.Column('panel_id', sa.Uuid(), nullable=False),
    sa.Column('ordinal', sa.Integer(), nullable=False),
    sa.Column('box_in_panel', postgresql.ARRAY(sa.Float()), nullable=False),
    sa.Column('box_in_figure', postgresql.ARRAY(sa.Float()), nullable=False),
    sa.Column('kind', sa.Enum('marker', 'caption', 'inferred', name='region_kind', native_enum=False, create_constraint=True, length=32), nullable=False),
    sa.Column('marker_type', sa.String(length=32), nullable=True),
    sa.Column('crop_key', sa.String(length=512), nullable=True),
    sa.Column('caption_text', sa.Text(), nullable=True),
    sa.Column('description', sa.Text(), nullable=True),
    sa.Column('confidence', sa.Float(), nullable=True),
    sa.Column('provenance', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint('cardinality(box_in_figure) = 4', name=op.f('ck_region_figure_box_has_four_numbers')),
    sa.CheckConstraint('cardinality(box_in_panel) = 4', name=op.f('ck_region_panel_box_has_four_numbers')),
    sa.ForeignKeyConstraint(['panel_id'], ['panel.id'], name=op.f('fk_region_panel_id_panel'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_region'))
    )
    op.create_index(op.f('ix_region_panel_id'), 'region', ['panel_id'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_region_panel_id'), table_name='region')
    op.drop_table('region')
    op.drop_index(op.f('ix_panel_mining_job_id'), table_name='panel')
    op.drop_index(op.f('ix_panel_figure_id'), table_name='panel')
    op.drop_table('panel')
    op.drop_index(op.f('ix_mining_job_status'), table_name='mining_job')
    op.drop_table('mining_job')
    op.drop_index('ix_batch_item_batch_status', table_name='batch_item')
    op.drop_table('batch_item')
    op.drop_index(op.f('ix_figure_status'), table_name='figure')
    op.drop_index(op.f('ix_figure_image_sha256'), table_name='figure')
    op.drop_index(op.f('ix_figure_article_id'), table_name='figure')
    op.drop_table('figure')
    op.drop_table('batch')
    op.drop_table('article')
    op.drop_table('api_key')
