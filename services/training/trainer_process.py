"""The trainer as a child process: ``python -m p2p.training`` with its JSON-lines protocol.

A crash, an out-of-memory kill or a NaN inside the trainer ends the child, never the worker. The
child asks for SIGTERM when the thread that started it dies (``DIE_WITH_PARENT_ENV``, see
:func:`die_with_parent`), so a killed worker leaves no orphan training on; SIGTERM makes the trainer
write a checkpoint and stop.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from p2p.shared.settings import Settings
from p2p.shared.storage import LocalObjectStore, ObjectStore

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
STDERR_TAIL_LINES = 60


DIE_WITH_PARENT_ENV = "P2P_TRAINER_PARENT_PID"


def die_with_parent() -> None:
    """Called by the trainer at start: SIGTERM this process when its parent goes away (Linux).

    Done in the child rather than in a ``preexec_fn``, which is unsafe in a threaded parent. A parent
    that died before the call is caught by comparing the parent pid with the one it passed down.
    """
    expected = os.environ.get(DIE_WITH_PARENT_ENV)
    if not expected or not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if str(os.getppid()) != expected:
        os.kill(os.getpid(), signal.SIGTERM)


def store_arguments(store: ObjectStore, settings: Settings) -> tuple[list[str], dict[str, str]]:
    """Command-line arguments and environment that give the child the same object store."""
    if isinstance(store, LocalObjectStore):
        return ["--store", str(store.root)], {}
    s3 = settings.s3
    env = {
        "P2P_S3__ENDPOINT": s3.endpoint or "",
        "P2P_S3__ACCESS_KEY": s3.access_key,
        "P2P_S3__SECRET_KEY": s3.secret_key.get_secret_value(),
        "P2P_S3__BUCKET": s3.bucket,
        "P2P_S3__SECURE": "true" if s3.secure else "false",
    }
    if s3.region:
        env["P2P_S3__REGION"] = s3.region
    return [], env


@dataclass
class TrainerExit:
    returncode: int
    result: dict[str, Any] | None  # the trainer's final "result" event, when it got that far
    error: str | None  # the trainer's last "error: ..." line or the tail of its stderr
    stderr_tail: list[str] = field(default_factory=list)

    @property
    def signal(self) -> int | None:
        return -self.returncode if self.returncode < 0 else None


class TrainerProcess:
    """Start the trainer; iterate over its events; stop it; collect how it ended."""

    def __init__(
        self,
        *,
        store: ObjectStore,
        settings: Settings,
        config_path: Path,
        data_prefix: str,
        out_prefix: str,
        checkpoint_every: int,
        keep_checkpoints: int,
        progress_every: int,
        shuffle_buffer: int,
        threads: int | None = None,
    ) -> None:
        store_args, store_env = store_arguments(store, settings)
        self.command = [
            sys.executable,
            "-m",
            "p2p.training",
            "--config",
            str(config_path),
            "--data",
            data_prefix,
            "--out",
            out_prefix,
            "--checkpoint-every",
            str(checkpoint_every),
            "--keep-checkpoints",
            str(keep_checkpoints),
            "--progress-every",
            str(progress_every),
            "--shuffle-buffer",
            str(shuffle_buffer),
            *store_args,
        ]
        env = {**os.environ, **store_env, "PYTHONUNBUFFERED": "1", DIE_WITH_PARENT_ENV: str(os.getpid())}
        if threads is not None:
            env["OMP_NUM_THREADS"] = str(threads)
        self._env = env
        self._events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._stderr: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        self._result: dict[str, Any] | None = None
        self._proc: subprocess.Popen[str] | None = None
        self._readers: list[threading.Thread] = []

    def start(self) -> None:
        self._proc = subprocess.Popen(
            self.command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env=self._env,
        )
        assert self._proc.stdout is not None and self._proc.stderr is not None
        self._readers = [
            threading.Thread(target=self._read_stdout, args=(self._proc.stdout,), daemon=True),
            threading.Thread(target=self._read_stderr, args=(self._proc.stderr,), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _read_stdout(self, stream: Any) -> None:
        for line in stream:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if event.get("event") == "result":
                self._result = event
            self._events.put(event)
        self._events.put(None)

    def _read_stderr(self, stream: Any) -> None:
        for line in stream:
            self._stderr.append(line.rstrip("\n"))

    def events(self, poll_s: float) -> Iterator[dict[str, Any] | None]:
        """The trainer's events as they come; ``None`` every ``poll_s`` seconds without one (so the
        caller can look for a cancel request). Ends when the trainer closes its output."""
        while True:
            try:
                event = self._events.get(timeout=poll_s)
            except queue.Empty:
                yield None
                continue
            if event is None:
                return
            yield event

    def terminate(self) -> None:
        """Ask the trainer to stop after its current step (it checkpoints first)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)

    def wait(self, timeout_s: float | None = None) -> TrainerExit:
        assert self._proc is not None
        try:
            returncode = self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("trainer %d did not stop in %.0f s; killing it", self._proc.pid, timeout_s or 0)
            self._proc.kill()
            returncode = self._proc.wait()
        for reader in self._readers:
            reader.join(timeout=10)
        tail = list(self._stderr)
        errors = [line[len("error: ") :] for line in tail if line.startswith("error: ")]
        error = errors[-1] if errors else None
        if error is None and returncode != 0 and tail:
            error = " | ".join(tail[-5:])
        return TrainerExit(returncode=returncode, result=self._result, error=error, stderr_tail=tail)

    def kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
