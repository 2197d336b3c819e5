"""Two versions of the production ingest server, A B B A, on one PostgreSQL, Redis and SeaweedFS.

A runs the ``p2p`` of ``--a-bin`` (another checkout's virtual environment: the code before), B
this checkout's. Both are ``p2p serve ingest`` on the production profile against the same
servers (``tests/servers``, as ``ingest_bench.py`` starts them), one API key. Each slice posts
``--figures`` figures from 16 clients (``ingest_bench.run_load``); the ratio is B's figures/s ÷
A's per round, with the CPU per figure of every process loaded (server, PostgreSQL, SeaweedFS,
client) and of the server alone. Each server has an API key of its own (the rate limit is per key).

    .venv/bin/python bench/ingest_ab.py --a-bin /tmp/base/.venv/bin --rounds 6 --figures 100
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ingest_bench as ib
from abba import interleave, machine_record, summary_line


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--a-bin", type=Path, required=True, help="bin folder whose p2p serves A")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--figures", type=int, default=100)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=16)
    parser.add_argument("--client", choices=("httpx", "raw"), default="httpx")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    args.bare_factor, args.client_kinds = 1, [args.client]

    workdir = ib.scratch_dir("p2p-ingest-ab-")
    backends = ib.start_backends(workdir / "backends")
    servers: list[ib.ServerProcess] = []
    factory = ib.FigureFactory()
    try:
        server_b, token = ib._production_ingest(workdir, backends)
        server_b.name = "B"
        server_a = ib.ServerProcess(
            "A",
            [str(args.a_bin / "p2p"), *server_b.cmd[1:-1], str(ib.free_port())],
            server_b.env,
            0,
            workdir / "A.log",
        )
        server_a.port = int(server_a.cmd[-1])
        sides = {}
        # A key per server: the write rate limit (1,200 per key a minute) counts per key in Redis.
        tokens = {"A": ib.new_ingest_key(backends), "B": token}
        for server in (server_a, server_b):
            servers.append(server)
            groups = ib._start_production_ingest(server, backends)
            auth = {"Authorization": f"Bearer {tokens[server.name]}"}
            sides[server.name] = ib._abba_side(
                "servers", server.base_url + "/v1/figures", factory, args, groups, expect=202, headers=auth
            )
        result = interleave(sides["B"], sides["A"], rounds=args.rounds)
        record: dict[str, Any] = {
            "machine": machine_record(),
            "args": vars(args) | {"a_bin": str(args.a_bin)},
        }
        record["b_vs_a"] = result.as_dict()
        for side, slices in (("A", result.reference), ("B", result.product)):
            server_cpu = [s.extra["server_cpu_ms_per_figure"] for s in slices]
            all_cpu = [1000 * s.cpu_s / s.items for s in slices]
            record[side] = {
                "figures_per_s": [round(s.rate, 2) for s in slices],
                "server_cpu_ms_per_figure_median": round(statistics.median(server_cpu), 2),
                "server_cpu_ms_per_figure": server_cpu,
                "all_cpu_ms_per_figure_median": round(statistics.median(all_cpu), 2),
                "errors": sum(s.extra["errors"] for s in slices),
            }
            print(
                f"{side}: figures/s {record[side]['figures_per_s']}, server CPU ms/figure median "
                f"{record[side]['server_cpu_ms_per_figure_median']} {server_cpu}, all processes "
                f"{record[side]['all_cpu_ms_per_figure_median']}, errors {record[side]['errors']}"
            )
        print(summary_line("B vs A (figures/s)", result))
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(record, indent=2, default=str) + "\n")
            print(f"wrote {args.out}")
    finally:
        for server in servers:
            server.stop()
        backends.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
