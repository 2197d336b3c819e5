from __future__ import annotations

import uuid
from datetime import UTC, datetime

from sqlalchemy import DateTime, MetaData, func
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Deterministic constraint names keep Alembic migrations reproducible.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_id() -> uuid.UUID:
    return uuid.uuid4()


class TimestampMixin:
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), default=utcnow, nullable=False
    )


# Vector tables are created per model version at run time (p2p.embedding_api.vectors), not by
# migrations: schema comparison and autogenerate must leave them alone.
VECTOR_TABLE_PREFIX = "embedding_"
STATIC_TABLES_WITH_PREFIX = frozenset({"embedding_space"})


def is_migrated_name(name: str | None, type_: str, parent_names: object = None) -> bool:
    """Alembic ``include_name`` hook: False for the per-version vector tables."""
    if type_ == "table" and name and name.startswith(VECTOR_TABLE_PREFIX):
        return name in STATIC_TABLES_WITH_PREFIX
    return True
