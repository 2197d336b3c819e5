"""Text search through the app: the text query cache on against off, interleaved.

One embedded PostgreSQL in a temp folder; a few mined synthetic figures re-indexed with the default
model, then ``--panels`` panel vectors (``embed_bench.load_scale``: clustered around MiniLM
embeddings of phrases, so text queries land near data). Two servers of the same code
(``p2p serve embedding-api``): **cache** (the default settings) and **no cache**
(``P2P_EMBEDDING__TEXT_CACHE_ENTRIES=0``, the text tower runs for every query as before). Every
query goes to both, the order flipped on every other query (ABBA), ``POST /v1/search`` panel level,
k=10, one at a time. Workloads:

- **distinct**: every query text new (the cache cannot help: this measures what it costs);
- **repeated**: draws from a pool of ``--pool`` texts with Zipf-like weights, as users repeat
  popular searches (warmed with one pass over the pool first, as a running service would be).

Each workload quiet and **loaded**: two more client threads post distinct-text searches to both
servers alike throughout. Also in this process: the default model's text tower on one query with 1
and with 2 intra-op threads, interleaved (the service's text thread uses 1).

    .venv/bin/python bench/text_search_bench.py [--panels 20000] [--queries 200] [--pool 50]
        [--out bench/results/text-search.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
import embed_bench as eb  # corpus, scale rows and the server process of the embed bench
import filtered_search_bench as fsb  # the machine description

SERVERS = ("cache", "no_cache")


def distinct_texts(seed: int, n: int) -> list[str]:
    rng = np.random.default_rng(seed)
    seen: dict[str, None] = {}
    while len(seen) < n:
        for text in eb.phrases(rng, n, eb.QUERY_TEMPLATES):
            seen.setdefault(f"{text} {rng.integers(10_000)}", None)
    return list(seen)[:n]


def zipf_draws(pool: list[str], n: int, seed: int) -> list[str]:
    weights = 1.0 / np.arange(1, len(pool) + 1)
    picks = np.random.default_rng(seed).choice(len(pool), size=n, p=weights / weights.sum())
    return [pool[i] for i in picks]


def interleaved(clients: dict[str, httpx.Client], texts: list[str]) -> dict[str, Any]:
    lat: dict[str, list[float]] = {name: [] for name in SERVERS}
    errors = 0
    for i, text in enumerate(texts):
        for name in SERVERS if i % 2 == 0 else tuple(reversed(SERVERS)):
            t, ok, _ = eb.search_once(clients[name], text)
            lat[name].append(t)
            errors += not ok
    out: dict[str, Any] = {name: eb.latency_summary(lat[name]) for name in SERVERS}
    out["errors"] = errors
    out["cache_over_no_cache_p50"] = round(
        statistics.median(lat["cache"]) / statistics.median(lat["no_cache"]), 3
    )
    return out


class Background:
    """Client threads posting distinct-text searches to every server until stopped."""

    def __init__(self, urls: list[str], texts: list[str], threads: int = 2) -> None:
        self.urls, self.texts, self.stop_flag = urls, texts, threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True) for i in range(threads)]
        self.sent = 0

    def run(self, index: int) -> None:
        clients = [httpx.Client(base_url=u, timeout=60) for u in self.urls]
        i = index
        while not self.stop_flag.is_set():
            eb.search_once(clients[i % len(clients)], self.texts[i % len(self.texts)])
            self.sent += 1
            i += len(self.threads)
        for c in clients:
            c.close()

    def __enter__(self) -> Background:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_flag.set()
        for t in self.threads:
            t.join(60)


def text_tower_threads(model: Any, texts: list[str]) -> dict[str, Any]:
    """One-query text encoding on 1 and 2 intra-op threads, alternating (ABBA) query by query."""
    times: dict[int, list[float]] = {1: [], 2: []}
    for i, text in enumerate(texts):
        for n in (1, 2) if i % 2 == 0 else (2, 1):
            torch.set_num_threads(n)
            t0 = time.perf_counter()
            model.encode_texts([text])
            times[n].append((time.perf_counter() - t0) * 1000)
    torch.set_num_threads(1)
    return {f"threads_{n}": eb.latency_summary([t / 1000 for t in v]) for n, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--panels", type=int, default=20_000)
    parser.add_argument("--figures", type=int, default=4)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--pool", type=int, default=50)
    parser.add_argument("--out", type=Path, default=Path("bench/results/text-search.json"))
    args = parser.parse_args()

    from p2p.models.modeling import default_spec, load_model
    from p2p.shared.runtime import build_runtime
    from p2p.shared.settings import QueueSettings, Settings

    report: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "machine": fsb.machine(),
        "params": {k: str(v) for k, v in vars(args).items()},
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    with eb.scratch() as tmp:
        data_dir = tmp / "data"
        env = {
            **os.environ,
            "P2P_DATA_DIR": str(data_dir),
            "P2P_LOG_LEVEL": "WARNING",
            "P2P_QUEUE__EMBEDDED_QUEUES": "[]",
        }
        settings = Settings(data_dir=data_dir, log_level="WARNING", queue=QueueSettings(embedded_queues=[]))
        runtime = build_runtime(settings)
        servers: dict[str, eb.ServerProcess] = {}
        try:
            report["corpus"] = eb.build_corpus(runtime, tmp / "synth", args.figures)
            v1, reindex = eb.register_and_reindex(runtime, default_spec(), "bench-1")
            reindex()
            model = load_model(default_spec(), store=runtime.store, threads=1)
            report["scale"] = eb.load_scale(runtime, model, v1, args.panels, 2000)
            eb.log(f"scale: {report['scale']}")
            report["text_tower_one_query_ms"] = text_tower_threads(model, distinct_texts(11, 60))
            eb.log(f"text tower: {report['text_tower_one_query_ms']}")
            servers["cache"] = eb.ServerProcess(env, tmp / "cache.log")
            servers["no_cache"] = eb.ServerProcess(
                {**env, "P2P_EMBEDDING__TEXT_CACHE_ENTRIES": "0"}, tmp / "nc.log"
            )
            for server in servers.values():
                server.start()
            report["runs"] = run_workloads(servers, args)
        finally:
            for server in servers.values():
                server.stop()
            runtime.close()
    report["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    eb.log(f"wrote {args.out}")


def run_workloads(servers: dict[str, eb.ServerProcess], args: argparse.Namespace) -> dict[str, Any]:
    clients = {name: httpx.Client(base_url=s.base_url, timeout=60) for name, s in servers.items()}
    pool = distinct_texts(21, args.pool)
    runs: dict[str, Any] = {}
    try:
        interleaved(clients, distinct_texts(31, 20))  # warm-up (texts never measured)
        interleaved(clients, pool)  # the service has seen its popular queries before
        background = distinct_texts(41, 2000)
        for loaded in (False, True):
            for workload, texts in (
                ("distinct", distinct_texts(51 + loaded, args.queries)),
                ("repeated", zipf_draws(pool, args.queries, 61 + loaded)),
            ):
                name = f"{workload}_{'loaded' if loaded else 'quiet'}"
                if loaded:
                    with Background([s.base_url for s in servers.values()], background):
                        runs[name] = interleaved(clients, texts)
                else:
                    runs[name] = interleaved(clients, texts)
                runs[name]["load_avg_1m"] = round(os.getloadavg()[0], 2)
                eb.log(f"{name}: {json.dumps(runs[name])}")
    finally:
        for c in clients.values():
            c.close()
    return runs


if __name__ == "__main__":
    main()
