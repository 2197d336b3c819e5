"""Give a running benchmark, and the servers it started, the machine's CPU before other jobs.

Linux schedules processes in groups, one per session (autogroup), and ``nice`` only weighs threads
within a group. Benchmarks here start servers in sessions of their own (uvicorn, PostgreSQL, whose
every backend calls ``setsid``), so lowering the nice value of the benchmark's shell does not reach
them. This script sets the autogroup nice value of a process and its descendants, and of every
process whose command line contains ``--match`` (e.g. the benchmark's temp folder, which the
PostgreSQL postmaster names) and their descendants, every ``--every`` seconds until the benchmark
exits, so new backends are caught too. Root is needed for negative values.

    .venv/bin/python bench/boost.py --pid 1234 --match p2p-search-bench --nice -15
"""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path

import psutil


def autogroup_nice(pid: int | str = "self") -> int:
    """The nice value of a process's scheduling group (0 where there is no autogroup)."""
    try:
        fields = Path(f"/proc/{pid}/autogroup").read_text().split()
        return int(fields[fields.index("nice") + 1])
    except (OSError, ValueError, IndexError):
        return 0


def set_autogroup_nice(pid: int, nice: int) -> bool:
    """Give a process's scheduling group this nice value; False when it already had it or cannot
    be set (gone, no autogroup, not root)."""
    if autogroup_nice(pid) == nice:
        return False
    try:
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))
    except OSError:
        return False
    return True


def group_of(proc: psutil.Process) -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        return [proc, *proc.children(recursive=True)]
    return []


def boost_once(pid: int, match: str | None, nice: int) -> int:
    targets: dict[int, psutil.Process] = {}
    with contextlib.suppress(psutil.NoSuchProcess):
        for p in group_of(psutil.Process(pid)):
            targets[p.pid] = p
    if match:
        for proc in psutil.process_iter(["cmdline"]):
            if match in " ".join(proc.info.get("cmdline") or []):
                for p in group_of(proc):
                    targets[p.pid] = p
    return sum(set_autogroup_nice(pid, nice) for pid in targets)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pid", type=int, required=True, help="the benchmark's process id")
    parser.add_argument("--match", default=None, help="also boost processes whose command line has this")
    parser.add_argument("--nice", type=int, default=-15)
    parser.add_argument("--every", type=float, default=2.0)
    args = parser.parse_args()
    while psutil.pid_exists(args.pid):
        changed = boost_once(args.pid, args.match, args.nice)
        if changed:
            stamp = time.strftime("%H:%M:%S")
            print(f"[{stamp}] set nice {args.nice} on {changed} process groups", flush=True)
        time.sleep(args.every)


if __name__ == "__main__":
    main()
