"""The durable-job observer: every job event of ``p2p.shared.jobs`` becomes counters and histograms.

Installed on each runtime (``Runtime.job_observers``), so the API processes (embedded profile),
the workers and the CLI all count the jobs they run, without metric calls in the domain code.
"""

from __future__ import annotations

from typing import Any

from p2p.shared.jobs import JobEvent

LVLM_COUNTERS = (
    "requests",
    "prompt_tokens",
    "completion_tokens",
    "latency_s",
    "retries",
    "fallbacks",
    "failures",
)


def _number(value: Any) -> float:
    try:
        return float(value or 0.0)
    except (TypeError, ValueError):
        return 0.0


class JobMetrics:
    """A :class:`~p2p.shared.jobs.JobObserver` (the metric objects load on the first event, so a
    worker has set its multiprocess folder by then)."""

    def __call__(self, event: JobEvent) -> None:
        from p2p.shared.metrics import registry as m

        m.JOB_EVENTS.labels(event.kind, event.event).inc()
        if event.queued_s is not None:
            m.JOB_QUEUED_SECONDS.labels(event.kind).observe(event.queued_s)
        if event.running_s is not None and event.event in ("succeeded", "failed"):
            m.JOB_RUNNING_SECONDS.labels(event.kind, event.event).observe(event.running_s)
        details = event.details or {}
        if event.kind == "mining" and event.event == "succeeded":
            mining(details)
        elif event.kind == "reindex" and event.event == "succeeded":
            reindex(details, event.running_s)
        elif event.kind == "training" and event.event == "progress":
            training(details)


def mining(details: dict[str, Any]) -> None:
    from p2p.shared.metrics import registry as m

    backend = str(details.get("backend") or "cpu")
    for stage, seconds in (details.get("stage_seconds") or {}).items():
        m.MINING_STAGE_SECONDS.labels(backend, stage).observe(_number(seconds))
    cost = details.get("cost") or {}
    for stage, values in (cost.get("stages") or {}).items():
        lvlm_stage(stage, values)


def lvlm_stage(stage: str, values: dict[str, Any]) -> None:
    from p2p.shared.metrics import registry as m

    counts = {key: _number(values.get(key)) for key in LVLM_COUNTERS}
    m.LVLM_REQUESTS.labels(stage).inc(counts["requests"])
    m.LVLM_TOKENS.labels(stage, "prompt").inc(counts["prompt_tokens"])
    m.LVLM_TOKENS.labels(stage, "completion").inc(counts["completion_tokens"])
    m.LVLM_LATENCY_SECONDS.labels(stage).inc(counts["latency_s"])
    m.LVLM_RETRIES.labels(stage).inc(counts["retries"])
    m.LVLM_FALLBACKS.labels(stage).inc(counts["fallbacks"])
    m.LVLM_FAILURES.labels(stage).inc(counts["failures"])


def reindex(details: dict[str, Any], running_s: float | None) -> None:
    from p2p.shared.metrics import registry as m

    items = _number(details.get("items"))
    seconds = _number(details.get("seconds")) or _number(running_s)
    m.REINDEX_ITEMS.inc(items)
    if seconds > 0:
        m.REINDEX_ITEMS_PER_SECOND.set(items / seconds)


def training(details: dict[str, Any]) -> None:
    from p2p.shared.metrics import registry as m

    steps_per_s = _number(details.get("steps_per_s"))
    if steps_per_s > 0:
        m.TRAINING_STEP_SECONDS.observe(1.0 / steps_per_s)
    m.TRAINING_SAMPLES_PER_SECOND.set(_number(details.get("samples_per_s")))
    m.TRAINING_STEP.set(_number(details.get("step")))
    for level, loss in (details.get("losses") or {}).items():
        m.TRAINING_LOSS.labels(str(level)).set(_number(loss))
    if details.get("loss") is not None:
        m.TRAINING_LOSS.labels("total").set(_number(details.get("loss")))
