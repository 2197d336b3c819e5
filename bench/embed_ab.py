"""Two embedding servers side by side, A B B A: which code or setting spends less CPU per image.

    .venv/bin/python bench/embed_ab.py [--a-bin DIR] [--a-env K=V,...] [--b-env K=V,...]
        [--per-request 1,8] [--slice 4] [--rounds 6]

Both servers (``p2p serve embedding-api``, as ``embed_bench.py`` starts it, on one embedded
PostgreSQL) are up at once; the lean load generator (16 connections) posts to A and B in
alternating slices (A B | B A | ...), so a change in the machine's other load hits both alike.
A runs the ``p2p`` of ``--a-bin`` (a virtual environment's ``bin`` folder: another worktree's
code) or this one's, with ``--a-env``; B runs this worktree's code with ``--b-env``.

Per slice: images/s, the server's CPU ms per image, the other processes' cores, and the server's
CPU per image by thread (event loop, preparation pool, model workers), from psutil's per-thread
times; the thread names come from ``py-spy dump`` when py-spy is installed (otherwise one total);
the mean images per model call of the window (`mean_batch`, from the server's `/metrics`).
On a shared machine the images/s of 4-s slices move with the other jobs' load; CPU ms per image,
and its split by thread, is what separates two versions of the code.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import embed_bench as eb
import psutil

THREAD_NUMBER = re.compile(r"[_\d]+$")
PY_SPY_THREAD = re.compile(r'Thread (\S+) \(\w+\): "([^"]+)"')


def env_pairs(text: str) -> dict[str, str]:
    return dict(pair.split("=", 1) for pair in text.split(",") if pair)


def thread_names(pid: int) -> dict[int, str]:
    """Native thread id -> Python thread name (``p2p-embed_0`` ...), from py-spy; {} without it."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        return {}
    out = subprocess.run([spy, "dump", "-p", str(pid)], capture_output=True, text=True, check=False).stdout
    return {int(m.group(1), 0): m.group(2) for m in PY_SPY_THREAD.finditer(out)}


class ThreadCpu:
    """CPU seconds of a server's threads, grouped by name without the worker number."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.names = thread_names(pid)

    def sample(self) -> dict[str, float]:
        out: dict[str, float] = {}
        threads = self.proc.threads()
        if self.names and any(t.id not in self.names for t in threads):
            self.names = thread_names(self.proc.pid)  # pools start their threads on first use
        for t in threads:
            group = THREAD_NUMBER.sub("", self.names.get(t.id, "other")) if self.names else "all"
            out[group] = out.get(group, 0.0) + t.user_time + t.system_time
        return out


def image_batches(server: eb.ServerProcess) -> tuple[float, float]:
    """(model calls, images) of the server's image micro-batcher so far, from ``/metrics``."""
    import httpx

    calls = images = 0.0
    text = httpx.get(server.base_url + "/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith('p2p_embedding_batch_size_count{kind="images"}'):
            calls = float(line.split()[-1])
        elif line.startswith('p2p_embedding_batch_size_sum{kind="images"}'):
            images = float(line.split()[-1])
    return calls, images


def one_slice(
    server: eb.ServerProcess, cpu: ThreadCpu, meter: eb.CpuMeter, args: Any, blobs: list[bytes], per: int
) -> dict[str, Any]:
    # The load generator measures after its own warm-up; the threads are sampled around the
    # measured window only, so the warm-up runs apart (0.7 s) and the measured run has none.
    eb.service_throughput(server, blobs, args.clients, 0.7, 0.0, meter, per_request=per)
    before, batches_before = cpu.sample(), image_batches(server)
    res = eb.service_throughput(server, blobs, args.clients, args.slice, 0.0, meter, per_request=per)
    after, batches_after = cpu.sample(), image_batches(server)
    calls = batches_after[0] - batches_before[0]
    n = max(res["images"], 1)
    c = res["cpu"]
    server_ms = 1000 * c["server_cores"] * c["wall_s"] / n
    # The thread samples also span the connection set-up and the drain of the requests still in
    # flight at the end, which the images counted do not: their shares split the server's CPU per
    # image of the measured window.
    spent = {k: v - before.get(k, 0.0) for k, v in after.items()}
    total = sum(spent.values()) or 1.0
    by_thread = {k: round(server_ms * v / total, 2) for k, v in spent.items()}
    return {
        "images": res["images"],
        "seconds": res["seconds"],
        "images_per_s": res["images_per_s"],
        "server_cpu_ms_per_image": round(server_ms, 3),
        "other_cores": c["other_cores"],
        "errors": res["errors"],
        "cpu_ms_per_image_by_thread": {k: v for k, v in by_thread.items() if v >= 0.01},
        # Images per model call in the window (the model's CPU per image falls with batch size).
        "mean_batch": round((batches_after[1] - batches_before[1]) / calls, 2) if calls else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--a-bin", type=Path, default=None, help="bin folder whose p2p serves A")
    parser.add_argument("--a-env", type=env_pairs, default={})
    parser.add_argument("--b-env", type=env_pairs, default={})
    parser.add_argument("--per-request", type=lambda v: [int(x) for x in v.split(",")], default=[1, 8])
    parser.add_argument("--slice", type=float, default=4.0, help="seconds of load per slice")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--clients", type=int, default=16)
    args = parser.parse_args()

    from p2p.shared.runtime import build_runtime
    from p2p.shared.settings import QueueSettings, Settings

    totals: dict[tuple[int, str], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        data = tmp / "data"
        base = {
            **os.environ,
            "P2P_DATA_DIR": str(data),
            "P2P_LOG_LEVEL": "WARNING",
            "P2P_QUEUE__EMBEDDED_QUEUES": "[]",
        }
        runtime = build_runtime(
            Settings(data_dir=data, log_level="WARNING", queue=QueueSettings(embedded_queues=[]))
        )
        servers = {
            side: eb.ServerProcess({**base, **env}, tmp / f"server-{side}.log")
            for side, env in (("A", args.a_env), ("B", args.b_env))
        }
        own_bin = eb.BIN
        try:
            for side, server in servers.items():
                eb.BIN = args.a_bin if side == "A" and args.a_bin is not None else own_bin
                server.start()
            eb.BIN = own_bin
            blobs = eb.crops(48)
            cpus = {side: ThreadCpu(s.proc.pid) for side, s in servers.items() if s.proc is not None}
            for per in args.per_request:
                for server in servers.values():  # warm-up
                    eb.service_throughput(
                        server,
                        blobs,
                        args.clients,
                        1.5,
                        0.5,
                        eb.CpuMeter(data / "pg", server),
                        per_request=per,
                    )
                for r in range(args.rounds):
                    for side in "AB" if r % 2 == 0 else "BA":
                        server = servers[side]
                        row = one_slice(
                            server, cpus[side], eb.CpuMeter(data / "pg", server), args, blobs, per
                        )
                        totals.setdefault((per, side), []).append(row)
                        print(f"{per} img/request {side}: {row}", flush=True)
        finally:
            eb.BIN = own_bin
            for server in servers.values():
                server.stop()
            runtime.close()
    for per in args.per_request:
        summary = {}
        for side in "AB":
            rows = totals[(per, side)]
            images = sum(r["images"] for r in rows)
            cpu = sum(r["server_cpu_ms_per_image"] * r["images"] for r in rows) / max(images, 1)
            summary[side] = (round(images / sum(r["seconds"] for r in rows), 1), round(cpu, 2))
        print(
            f"{per} img/request: A {summary['A'][0]} img/s, {summary['A'][1]} CPU ms/img; "
            f"B {summary['B'][0]} img/s, {summary['B'][1]} CPU ms/img; "
            f"B/A images/s {summary['B'][0] / summary['A'][0]:.3f}, "
            f"CPU {summary['B'][1] / summary['A'][1]:.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
