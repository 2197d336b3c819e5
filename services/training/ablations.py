"""The paper's ablations in miniature (Tables 4 and 5): which levels train, and how they are scheduled.

Every variant trains the same number of steps from the same preset on the same snapshot, once per
seed, and is scored on the same held-out figures as the untrained starting model. The summary gives
mean and standard deviation per variant for the metrics the paper's claims are about: bbox<->text
(region) R@10, panel R@10, figure R@10 and zero-shot accuracy.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from p2p.models.modeling import ModelSpec, load_model
from p2p.shared.storage import ObjectStore
from p2p.training import evaluate
from p2p.training.dataset import iter_samples
from p2p.training.presets import merge, resolve
from p2p.training.runner import run_training

VARIANTS: dict[str, dict[str, Any]] = {
    "panel-only": {"levels": "panel"},
    "region-only": {"levels": "region"},
    "all-alternating": {"levels": "all", "schedule": "alternating"},
    "all-mixed": {"levels": "all", "schedule": "mixed"},
}
SUMMARY_METRICS: tuple[str, ...] = (
    "region i2t R@10",
    "region t2i R@10",
    "panel i2t R@10",
    "panel t2i R@10",
    "figure i2t R@10",
    "figure t2i R@10",
    "zero-shot acc",
    "zero-shot bal acc",
)


def run_ablations(
    *,
    store: ObjectStore,
    snapshot: str,
    out_prefix: str,
    seeds: Sequence[int],
    variants: Sequence[str] = tuple(VARIANTS),
    preset: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    eval_split: str = "test",
    eval_max_items: int | None = None,
    checkpoint_every: int = 1000,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Train every (variant, seed), evaluate each and the untrained model; one row per run."""

    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise ValueError(f"unknown ablation variant(s) {unknown}; known: {', '.join(VARIANTS)}")
    if not seeds:
        raise ValueError("give at least one seed")
    data = evaluate.collect(
        iter_samples(store, snapshot, eval_split, shuffle_buffer=0, seed=0, epoch=0), max_items=eval_max_items
    )

    def score(spec: ModelSpec) -> dict[str, Any]:
        return evaluate.flatten(evaluate.evaluate_set(load_model(spec, store=store), data))

    base = resolve(preset, overrides)
    rows = [{"variant": "untrained", "seed": None, "status": "-", "steps": 0, "seconds": 0.0}]
    rows[0].update(score(base.model.to_spec()))
    if on_row is not None:
        on_row(rows[0])
    for variant in variants:
        for seed in seeds:
            config = resolve(preset, merge(dict(overrides or {}), {**VARIANTS[variant], "seed": seed}))
            started = time.monotonic()
            result = run_training(
                store=store,
                data_prefix=snapshot,
                out_prefix=f"{out_prefix.strip('/')}/{variant}/seed-{seed}",
                config=config,
                checkpoint_every=checkpoint_every,
                progress_every=max(config.max_steps or 1000, 1),
            )
            row: dict[str, Any] = {
                "variant": variant,
                "seed": seed,
                "status": result.status,
                "steps": result.step,
                "seconds": time.monotonic() - started,
            }
            if result.final_model is not None:
                start = config.model.to_spec()
                trained = ModelSpec(
                    name=start.name,
                    architecture=start.architecture,
                    config=start.config,
                    source=f"s3:{result.final_model}",
                )
                row.update(score(trained))
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows


def summarize(
    rows: Sequence[Mapping[str, Any]], metrics: Sequence[str] = SUMMARY_METRICS
) -> list[dict[str, Any]]:
    """Per variant (in first-seen order): runs, and mean and standard deviation of each metric."""
    order: list[str] = []
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        name = str(row["variant"])
        if name not in groups:
            order.append(name)
            groups[name] = []
        groups[name].append(row)
    summary = []
    for name in order:
        entry: dict[str, Any] = {"variant": name, "runs": len(groups[name])}
        for metric in metrics:
            values = [float(r[metric]) for r in groups[name] if metric in r]
            if not values:
                continue
            mean = sum(values) / len(values)
            std = (
                math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
                if len(values) > 1
                else 0.0
            )
            entry[metric] = {"mean": mean, "std": std}
        summary.append(entry)
    return summary


def markdown_table(summary: Sequence[Mapping[str, Any]], metrics: Sequence[str] = SUMMARY_METRICS) -> str:
    head = "| variant | runs | " + " | ".join(metrics) + " |"
    rule = "|---|---:|" + "---:|" * len(metrics)
    lines = [head, rule]
    for entry in summary:
        cells = []
        for metric in metrics:
            value = entry.get(metric)
            if value is None:
                cells.append("-")
            elif entry["runs"] > 1:
                cells.append(f"{value['mean']:.3f} ± {value['std']:.3f}")
            else:
                cells.append(f"{value['mean']:.3f}")
        lines.append(f"| {entry['variant']} | {entry['runs']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
