"""Bearer API keys with scopes. Only a hash of each secret is stored.

A key reads ``p2p_<prefix>_<secret>``: the prefix finds the row, the secret is checked against its
sha256. The secret carries 256 random bits, so a fast hash is enough (no password stretching).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import secrets
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from p2p.shared.db.base import utcnow
from p2p.shared.db.models import ApiKey
from p2p.shared.errors import Forbidden, InvalidInput, Unauthorized


class Scope(enum.StrEnum):
    INGEST = "ingest"
    READ = "read"
    ADMIN = "admin"


KEY_PREFIX = "p2p"
LAST_USED_RESOLUTION_S = 60


@dataclass(frozen=True)
class Principal:
    key_id: str | None
    name: str
    scopes: frozenset[str]

    def allows(self, scope: Scope) -> bool:
        return Scope.ADMIN in self.scopes or scope in self.scopes


ANONYMOUS = Principal(key_id=None, name="anonymous (auth disabled)", scopes=frozenset(s.value for s in Scope))


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def parse_scopes(values: list[str]) -> list[str]:
    valid = {s.value for s in Scope}
    unknown = sorted(set(values) - valid)
    if unknown or not values:
        raise InvalidInput(f"scopes must be among {sorted(valid)}; got {values}", error_type="invalid_scope")
    return sorted(set(values))


def create_api_key(session: Session, *, name: str, scopes: list[str]) -> tuple[ApiKey, str]:
    prefix = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    key = ApiKey(name=name, prefix=prefix, secret_hash=_hash(secret), scopes=parse_scopes(scopes))
    session.add(key)
    session.commit()
    return key, f"{KEY_PREFIX}_{prefix}_{secret}"


def authenticate(session: Session, authorization: str | None) -> Principal:
    if not authorization:
        raise Unauthorized(
            "this endpoint needs an API key: send 'Authorization: Bearer p2p_...'",
            error_type="missing_api_key",
        )
    scheme, _, token = authorization.partition(" ")
    parts = token.strip().split("_", 2)
    if scheme.lower() != "bearer" or len(parts) != 3 or parts[0] != KEY_PREFIX:
        raise Unauthorized("malformed API key", error_type="invalid_api_key")
    _, prefix, secret = parts
    key = session.scalars(select(ApiKey).where(ApiKey.prefix == prefix)).first()
    if key is None or not hmac.compare_digest(key.secret_hash, _hash(secret)):
        raise Unauthorized("unknown API key", error_type="invalid_api_key")
    if key.revoked_at is not None:
        raise Unauthorized("this API key was revoked", error_type="revoked_api_key")
    now = utcnow()
    # Every request of a busy client would otherwise commit to the same row.
    if key.last_used_at is None or (now - key.last_used_at).total_seconds() > LAST_USED_RESOLUTION_S:
        key.last_used_at = now
        session.commit()
    return Principal(key_id=str(key.id), name=key.name, scopes=frozenset(key.scopes))


def require(principal: Principal, scope: Scope) -> Principal:
    if not principal.allows(scope):
        raise Forbidden(
            f"API key '{principal.name}' lacks the '{scope}' scope", error_type="insufficient_scope"
        )
    return principal


def revoke_api_key(session: Session, prefix: str) -> bool:
    key = session.scalars(select(ApiKey).where(ApiKey.prefix == prefix)).first()
    if key is None or key.revoked_at is not None:
        return False
    key.revoked_at = utcnow()
    session.commit()
    return True
