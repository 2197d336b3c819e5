"""Write an export snapshot (WebDataset shards + manifest, as ``export_corpus`` lays them out)
straight into a store, for training tests that need no Postgres."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Callable, Sequence
from typing import Any

from p2p.shared.storage import ObjectStore, put_bytes

Member = tuple[str, bytes]


def write_snapshot(
    store: ObjectStore,
    prefix: str,
    n: int,
    sample: Callable[[int], Sequence[Member]],
    *,
    split: str,
    per_shard: int,
    counts: dict[str, int],
    snapshot_name: str | None = None,
) -> list[dict[str, Any]]:
    """``n`` samples (``sample(i)`` gives each one's tar members) in shards of ``per_shard`` under
    ``prefix/{split}/``, and ``prefix/manifest.json`` with ``counts`` for that split."""
    shards: list[dict[str, Any]] = []
    for start in range(0, n, per_shard):
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for index in range(start, min(start + per_shard, n)):
                for name, data in sample(index):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        key = f"{prefix}/{split}/shard-{len(shards):06d}.tar"
        data = buffer.getvalue()
        sha = put_bytes(store, key, data, "application/x-tar")
        shards.append(
            {
                "key": key,
                "split": split,
                "samples": min(per_shard, n - start),
                "size": len(data),
                "sha256": sha,
            }
        )
    all_counts = {s: {"figures": 0, "plain": 0, "panels": 0, "regions": 0} for s in ("train", "val", "test")}
    all_counts[split] = {"plain": 0, **counts}
    manifest = {
        "snapshot_name": snapshot_name or prefix,
        "out_prefix": prefix,
        "counts": all_counts,
        "shards": shards,
    }
    put_bytes(store, f"{prefix}/manifest.json", json.dumps(manifest).encode(), "application/json")
    return shards
