"""Ids as the tables print them: a full UUID, or a prefix of one (the 8 characters `p2p status` and
other tables show) that names exactly one row."""

from __future__ import annotations

import re
import uuid
from typing import Any

from sqlalchemy import String, cast, select
from sqlalchemy.orm import Session

_PREFIX = re.compile(r"[0-9a-fA-F-]{4,36}")


class IdError(ValueError):
    pass


def resolve_id(session: Session, model: Any, text: str, *, what: str) -> uuid.UUID:
    """The id of the one ``model`` row whose id is ``text`` or starts with it."""
    text = text.strip()
    try:
        return uuid.UUID(text)
    except ValueError:
        pass
    if not _PREFIX.fullmatch(text):
        raise IdError(f"not a {what} id or id prefix: {text!r}")
    found = list(
        session.scalars(select(model.id).where(cast(model.id, String).like(text.lower() + "%")).limit(3))
    )
    if not found:
        raise IdError(f"no {what} with an id starting {text}")
    if len(found) > 1:
        raise IdError(f"several {what}s have ids starting {text}: give more characters")
    return uuid.UUID(str(found[0]))
