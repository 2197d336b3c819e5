"""Where the production ingest server's CPU goes: a cProfile of every server thread under load.

Starts PostgreSQL, Redis and SeaweedFS (``tests/servers``, as ``ingest_bench.py`` does), then
``p2p serve ingest`` on the production profile in a subprocess that profiles each of its threads
(the event loop and the thread pool apart), posts ``--figures`` figures from 16 clients, stops the
server and prints, per thread group, the CPU per figure and the functions that spend it.

    .venv/bin/python bench/ingest_profile.py --figures 300 --top 40
"""

from __future__ import annotations

import argparse
import cProfile
import io
import marshal
import pstats
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ingest_bench as ib

STAGES = (
    ("p2p.shared.deps", "_admit"),
    ("p2p.ingest.service", "ingest_one"),
    ("p2p.ingest.service", "digest_upload"),
    ("p2p.ingest.service", "inspect_image"),
    ("p2p.ingest.service", "_dispatch"),
    ("p2p.ingest.service", "_insert_figure"),
    ("p2p.ingest.service", "_find_figure"),
    ("p2p.shared.storage", "S3ObjectStore.put"),
)


def time_stages(out: Path) -> Callable[[], None]:
    """Wraps ``STAGES`` with counters of the calling thread's CPU; the returned call writes them."""
    import importlib
    import json

    spent: dict[str, list[float]] = {}
    lock = threading.Lock()

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*a: Any, **kw: Any) -> Any:
            start = time.thread_time()
            try:
                return fn(*a, **kw)
            finally:
                with lock:
                    entry = spent.setdefault(name, [0.0, 0])
                    entry[0] += time.thread_time() - start
                    entry[1] += 1

        return timed

    for module_name, attr in STAGES:
        holder: Any = importlib.import_module(module_name)
        *owner, name = attr.split(".")
        for part in owner:
            holder = getattr(holder, part)
        setattr(holder, name, wrap(attr, getattr(holder, name)))

    def dump() -> None:
        out.write_text(json.dumps(spent))

    return dump


def serve_stages(port: int, out: Path) -> None:
    """``p2p serve ingest`` with ``STAGES`` timed; the counters are written on SIGTERM."""
    import uvicorn

    from p2p.apps.ingest import ingest_app
    from p2p.shared import logs
    from p2p.shared.settings import get_settings

    def leave(*_: Any) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, leave)
    dump = time_stages(out)
    settings = get_settings()
    logs.configure_logging(settings, service="ingest-api")
    try:
        uvicorn.run(ingest_app(settings), host="127.0.0.1", port=port, log_level="warning", log_config=None)
    finally:
        dump()


def serve_profiled(port: int, out: Path) -> None:
    """``p2p serve ingest`` with a profiler on every thread; the stats are written on SIGTERM."""
    import uvicorn

    from p2p.apps.ingest import ingest_app
    from p2p.shared import logs
    from p2p.shared.settings import get_settings

    profiles: dict[str, cProfile.Profile] = {}
    lock = threading.Lock()

    def start_thread_profile(*_: Any) -> None:
        profile = cProfile.Profile(time.thread_time)
        with lock:
            profiles[f"{threading.current_thread().name}-{threading.get_ident()}"] = profile
        profile.enable()

    def leave(*_: Any) -> None:
        # uvicorn raises the SIGTERM it handled again once it is down: exit through ``finally``.
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, leave)
    settings = get_settings()
    logs.configure_logging(settings, service="ingest-api")
    threading.setprofile(start_thread_profile)
    main = cProfile.Profile(time.thread_time)
    profiles["event-loop"] = main
    main.enable()
    try:
        uvicorn.run(ingest_app(settings), host="127.0.0.1", port=port, log_level="warning", log_config=None)
    finally:
        main.disable()
        threading.setprofile(None)  # type: ignore[arg-type]
        dumped: dict[str, Any] = {}
        with lock:
            for name, profile in profiles.items():
                profile.create_stats()
                dumped[name] = profile.stats  # type: ignore[attr-defined]
        out.write_bytes(marshal.dumps(dumped))


def thread_cpu(pid: int) -> dict[str, float]:
    """User and system CPU seconds of the process's main thread (the event loop) and of the rest,
    exited threads included (the process's total minus the live threads')."""
    import os

    tick = os.sysconf("SC_CLK_TCK")

    def times(path: str) -> tuple[float, float]:
        fields = Path(path).read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) / tick, int(fields[12]) / tick

    loop_user, loop_sys = times(f"/proc/{pid}/task/{pid}/stat")
    total_user, total_sys = times(f"/proc/{pid}/stat")
    return {
        "loop_user": loop_user,
        "loop_sys": loop_sys,
        "others_user": total_user - loop_user,
        "others_sys": total_sys - loop_sys,
    }


def group_of(name: str) -> str:
    if name == "event-loop":
        return "event loop"
    if name.startswith(("AnyIO", "ThreadPoolExecutor", "asyncio")):
        return "thread pool"
    return "other threads"


def report(path: Path, figures: int, top: int) -> None:
    dumped: dict[str, Any] = marshal.loads(path.read_bytes())
    groups: dict[str, list[Any]] = {}
    for name, stats in dumped.items():
        groups.setdefault(group_of(name), []).append(stats)
    for group, stats_list in sorted(groups.items()):
        merged: pstats.Stats | None = None
        for stats in stats_list:
            holder = _Holder(stats)
            merged = pstats.Stats(holder) if merged is None else merged.add(holder)  # type: ignore[arg-type]
        assert merged is not None
        total = merged.total_tt  # type: ignore[attr-defined]
        print(f"\n=== {group}: {len(stats_list)} threads, {1000 * total / figures:.2f} CPU ms/figure")
        for sort in ("tottime", "cumulative"):
            text = io.StringIO()
            merged.stream = text  # type: ignore[attr-defined]
            merged.sort_stats(sort).print_stats(top)
            print("\n".join(text.getvalue().splitlines()[6:]))


class _Holder:
    """What ``pstats.Stats`` accepts in place of a profiler: an object with ``create_stats``."""

    def __init__(self, stats: dict[Any, Any]) -> None:
        self.stats = stats

    def create_stats(self) -> None:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--figures", type=int, default=300)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--client", choices=("httpx", "raw"), default="raw")
    parser.add_argument("--serve-profiled", nargs=2, metavar=("PORT", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--serve-stages", nargs=2, metavar=("PORT", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--stages", action="store_true", help="no profiler: CPU per stage (STAGES)")
    parser.add_argument("--report", type=Path, help="print a stats file written before")
    parser.add_argument(
        "--threads-only",
        action="store_true",
        help="no profiler: the CPU of the event loop and the other threads",
    )
    args = parser.parse_args()
    if args.serve_stages:
        serve_stages(int(args.serve_stages[0]), Path(args.serve_stages[1]))
        return 0
    if args.serve_profiled:
        serve_profiled(int(args.serve_profiled[0]), Path(args.serve_profiled[1]))
        return 0
    if args.report:
        report(args.report, args.figures, args.top)
        return 0
    return measure(args)


def measure(args: argparse.Namespace) -> int:
    """Backends, the server (profiled, timed or plain), the load, then the report."""
    workdir = ib.scratch_dir("p2p-ingest-profile-")
    backends = ib.start_backends(workdir)
    out = workdir / "profile.marshal"
    try:
        server, token = ib._production_ingest(workdir, backends)
        if not args.threads_only:
            mode = "--serve-stages" if args.stages else "--serve-profiled"
            server.cmd = [sys.executable, str(Path(__file__).resolve()), mode, str(server.port), str(out)]
        groups = ib._start_production_ingest(server, backends)
        assert server.proc is not None
        before = thread_cpu(server.proc.pid)
        factory = ib.FigureFactory()
        result = ib.run_load(
            "servers",
            server.base_url + "/v1/figures",
            factory,
            figures=args.figures,
            clients=args.clients,
            warmup=16,
            expect=202,
            headers={"Authorization": f"Bearer {token}"},
            groups=groups,
            client_kind=args.client,
        )
        summary = result.summary()
        print(
            {k: summary[k] for k in ("figures_per_s", "server_cpu_ms_per_figure", "errors") if k in summary}
        )
        after = thread_cpu(server.proc.pid)
        per_figure = args.figures + 16
        for kind in ("loop_user", "loop_sys", "others_user", "others_sys"):
            spent = 1000 * (after[kind] - before[kind]) / per_figure
            print(f"{kind}: {spent:.2f} CPU ms/figure (warm-up included)")
        if args.threads_only:
            server.stop()
            return 0
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(120)
        if not out.exists():
            print(server.log_tail())
            return 1
        if args.stages:
            import json

            for name, (cpu_s, calls) in json.loads(out.read_text()).items():
                print(f"{name}: {1000 * cpu_s / per_figure:.2f} CPU ms/figure ({calls} calls)")
            return 0
        keep = Path("/tmp") / f"ingest-profile-{int(time.time())}.marshal"
        shutil.copy(out, keep)
        print(f"stats: {keep} (warm-up included: {args.figures + 16} figures)")
        report(keep, args.figures + 16, args.top)
    finally:
        backends.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
