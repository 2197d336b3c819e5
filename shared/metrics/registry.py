"""The project's metric objects, in one place so dashboards and tests can rely on their names.

In a Celery worker ``PROMETHEUS_MULTIPROC_DIR`` is set before this module is imported, so every
process of the pool writes its values to files that the worker's metrics server sums; elsewhere
they live in the process. Gauges that several processes set say how to combine them.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics, values

# prometheus_client picks file-backed values when it is imported, from PROMETHEUS_MULTIPROC_DIR; a
# worker may import it before it sets that folder, so the choice is made again here, before any
# metric exists.
values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]
# The *_created samples double every scrape's size and no dashboard reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]

# Seconds from a millisecond to ten minutes: requests, tasks and mining stages alike.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0)
# Jobs wait and run from milliseconds to hours (training runs).
JOB_BUCKETS = (0.01, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 24 * 3600.0)
BODY_BUCKETS = (1e3, 1e4, 1e5, 1e6, 5e6, 2e7, 1e8, 1e9)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)

HTTP_REQUESTS = Counter(
    "p2p_http_requests",
    "HTTP requests answered, by route template.",
    ["service", "method", "route", "status"],
)
HTTP_DURATION = Histogram(
    "p2p_http_request_duration_seconds",
    "Time to answer an HTTP request, by route template.",
    ["service", "method", "route", "status"],
    buckets=LATENCY_BUCKETS,
)
HTTP_IN_FLIGHT = Gauge(
    "p2p_http_requests_in_flight", "HTTP requests being answered.", ["service"], multiprocess_mode="livesum"
)
HTTP_BODY_BYTES = Histogram(
    "p2p_http_request_body_bytes", "Bytes of request bodies received (uploads).", ["service", "route"],
    buckets=BODY_BUCKETS,
)  # fmt: skip

EMBED_BATCH_SIZE = Histogram(
    "p2p_embedding_batch_size", "Items per model call of the embedding micro-batcher.", ["kind"],
    buckets=BATCH_BUCKETS,
)  # fmt: skip
EMBED_MODEL_SECONDS = Histogram(
    "p2p_embedding_model_seconds", "Model time per micro-batch.", ["kind"], buckets=LATENCY_BUCKETS
)

TASKS = Counter("p2p_tasks", "Celery tasks run, by queue, task and outcome.", ["queue", "task", "outcome"])
TASK_DURATION = Histogram(
    "p2p_task_duration_seconds",
    "Celery task run time.",
    ["queue", "task", "outcome"],
    buckets=LATENCY_BUCKETS,
)
TASK_RETRIES = Counter("p2p_task_retries", "Celery task retries (transient errors).", ["queue", "task"])

JOB_EVENTS = Counter("p2p_job_events", "Durable-job events, by job kind and event.", ["kind", "event"])
JOB_QUEUED_SECONDS = Histogram(
    "p2p_job_queued_seconds", "Time a job waited before it started.", ["kind"], buckets=JOB_BUCKETS
)
JOB_RUNNING_SECONDS = Histogram(
    "p2p_job_running_seconds", "Time a job ran, by outcome.", ["kind", "outcome"], buckets=JOB_BUCKETS
)

MINING_STAGE_SECONDS = Histogram(
    "p2p_mining_stage_seconds",
    "Time per mining stage per figure.",
    ["backend", "stage"],
    buckets=LATENCY_BUCKETS,
)

LVLM_REQUESTS = Counter("p2p_lvlm_requests", "Requests to the LVLM server, by mining stage.", ["stage"])
LVLM_TOKENS = Counter("p2p_lvlm_tokens", "LVLM tokens, by mining stage and type.", ["stage", "type"])
LVLM_LATENCY_SECONDS = Counter(
    "p2p_lvlm_latency_seconds", "Summed LVLM request latency (divide by requests for the mean).", ["stage"]
)
LVLM_RETRIES = Counter("p2p_lvlm_retries", "LVLM request retries.", ["stage"])
LVLM_FALLBACKS = Counter("p2p_lvlm_fallbacks", "Stages answered by the CPU backend instead.", ["stage"])
LVLM_FAILURES = Counter("p2p_lvlm_failures", "LVLM answers that could not be used.", ["stage"])

REINDEX_ITEMS = Counter("p2p_reindex_items", "Items (figures, panels, regions) embedded by re-index jobs.")
REINDEX_ITEMS_PER_SECOND = Gauge(
    "p2p_reindex_items_per_second", "Items per second of the latest finished re-index.",
    multiprocess_mode="mostrecent",
)  # fmt: skip

TRAINING_STEP_SECONDS = Histogram(
    "p2p_training_step_seconds", "Mean step time over a progress window of a training run.",
    buckets=LATENCY_BUCKETS,
)  # fmt: skip
TRAINING_SAMPLES_PER_SECOND = Gauge(
    "p2p_training_samples_per_second", "Samples per second of the latest progress window.",
    multiprocess_mode="mostrecent",
)  # fmt: skip
TRAINING_LOSS = Gauge(
    "p2p_training_loss", "Mean loss of the latest progress window, by level.", ["level"],
    multiprocess_mode="mostrecent",
)  # fmt: skip
TRAINING_STEP = Gauge("p2p_training_step", "Latest step reported.", multiprocess_mode="mostrecent")
