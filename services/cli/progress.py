"""Progress that shows in a terminal (a rich bar) and in a log or CI output (periodic lines).

A rich bar on a console that is not a terminal is drawn once, finished; `LineProgress` prints a
line per task every `interval_s` seconds and when the task ends instead, with the same calls
(add_task, update, advance, console.print) the commands use.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

LINE_INTERVAL_S = 15.0


@dataclass
class _Line:
    description: str
    total: float | None
    completed: float = 0.0
    fields: dict[str, Any] = field(default_factory=dict)
    started: float = 0.0
    printed: float = 0.0
    last: tuple[float, str] = (-1.0, "")


class LineProgress:
    def __init__(
        self,
        console: Console,
        *,
        interval_s: float = LINE_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.console = console
        self.interval_s = interval_s
        self.clock = clock
        self._tasks: dict[int, _Line] = {}

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for task_id in self._tasks:
            self._print(task_id)

    def add_task(self, description: str, total: float | None = None, **fields: Any) -> TaskID:
        task_id = TaskID(len(self._tasks))
        now = self.clock()
        self._tasks[task_id] = _Line(description, total, fields=fields, started=now, printed=now)
        return task_id

    def update(
        self,
        task_id: TaskID,
        *,
        description: str | None = None,
        total: float | None = None,
        completed: float | None = None,
        advance: float | None = None,
        **fields: Any,
    ) -> None:
        line = self._tasks[task_id]
        if description is not None:
            line.description = description
        if total is not None:
            line.total = total
        if completed is not None:
            line.completed = completed
        if advance is not None:
            line.completed += advance
        line.fields.update(fields)
        # A line per interval while it moves; a stalled task (a slow training step) every 4.
        since = self.clock() - line.printed
        moved = (line.completed, line.description) != line.last
        if since >= self.interval_s * (1 if moved else 4):
            self._print(task_id)

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        self.update(task_id, advance=advance)

    def _print(self, task_id: int) -> None:
        line = self._tasks[task_id]
        now = self.clock()
        line.printed, line.last = now, (line.completed, line.description)
        done = f"{line.completed:.0f}" + (f"/{line.total:.0f}" if line.total else "")
        if line.total:
            done += f" ({100 * line.completed / line.total:.0f}%)"
        info = " ".join(str(v) for v in line.fields.values() if v)
        text = f"{line.description}: {done}" + (f", {info}" if info else "") + f", {now - line.started:.0f} s"
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)


def progress(console: Console, *columns: ProgressColumn | str) -> Progress | LineProgress:
    """A rich bar on a terminal, else periodic lines."""
    if not console.is_terminal:
        return LineProgress(console)
    cols = columns or (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    return Progress(*cols, console=console, transient=False)
