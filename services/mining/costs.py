"""Mining cost per figure and per stage, summed over finished mining jobs: LVLM requests and
tokens, and every backend's time per stage (``stage_seconds``, from the jobs' stage timings)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from p2p.shared.db.models import JobStatus, MiningJob

COUNTERS = ("requests", "prompt_tokens", "completion_tokens", "retries", "repairs", "fallbacks", "failures")


def aggregate_costs(session: Session, *, backend: str | None = None) -> list[dict[str, Any]]:
    """One row per (backend, miner version): figures, totals, per-figure means, per-stage totals
    and per-stage seconds (superseded jobs included: what was spent stays spent)."""
    query = select(MiningJob.backend, MiningJob.miner_version, MiningJob.cost, MiningJob.stage_timings).where(
        MiningJob.status == JobStatus.SUCCEEDED
    )
    if backend is not None:
        query = query.where(MiningJob.backend == backend)
    groups: dict[tuple[str, str | None], dict[str, Any]] = {}
    for name, version, cost, timings in session.execute(query):
        fresh: dict[str, Any] = {
            "backend": name,
            "version": version,
            "figures": 0,
            "seconds": 0.0,
            "latency_s": 0.0,
            "fallback_figures": 0,
            **dict.fromkeys(COUNTERS, 0),
            "stages": defaultdict(lambda: dict.fromkeys(COUNTERS, 0)),
            "stage_seconds": defaultdict(float),
        }
        row = groups.setdefault((name, version), fresh)
        record: dict[str, Any] = dict(cost or {})
        row["figures"] += 1
        row["seconds"] += float(record.get("seconds") or 0.0)
        row["latency_s"] += float(record.get("latency_s") or 0.0)
        row["fallback_figures"] += int(bool(record.get("fallbacks")))
        for key in COUNTERS:
            row[key] += int(record.get(key) or 0)
        for stage, values in (record.get("stages") or {}).items():
            for key in COUNTERS:
                row["stages"][stage][key] += int(values.get(key) or 0)
        for stage, seconds in (timings or {}).items():
            row["stage_seconds"][stage] += float(seconds or 0.0)
    out = []
    for row in groups.values():
        figures = max(row["figures"], 1)
        row["stages"] = dict(row["stages"])
        row["stage_seconds"] = {stage: round(value, 4) for stage, value in row["stage_seconds"].items()}
        row["per_figure"] = {
            key: round(row[key] / figures, 3) for key in ("requests", "prompt_tokens", "completion_tokens")
        }
        row["per_figure"]["seconds"] = round(row["seconds"] / figures, 3)
        out.append(row)
    return sorted(out, key=lambda r: (r["backend"], r["version"] or ""))
