"""Run the simulated model server in its own process (benchmarks: its CPU work off the client's GIL).

    python -m tests.lvlm_sim FOLDER [FOLDER...] [--latency S] [--seed N]

Prints ``URL http://127.0.0.1:PORT`` once it answers, and serves until stdin closes or it is
terminated.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from tests.lvlm_sim.faults import SimFaults
from tests.lvlm_sim.server import SimServer


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.lvlm_sim")
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    server = SimServer(args.folders, faults=SimFaults(seed=args.seed, latency_s=args.latency))
    server.warm()
    with server:
        print(f"URL {server.url}", flush=True)
        watcher = threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True)
        watcher.start()
        stop.wait()


if __name__ == "__main__":
    main()
