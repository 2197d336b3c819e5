"""Progress when output is not a terminal: periodic lines, not a bar drawn once at the end."""

from __future__ import annotations

import io

from rich.console import Console
from rich.progress import Progress

from p2p.cli.progress import LineProgress, progress


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_lines_come_per_interval_while_moving_and_rarely_while_stalled() -> None:
    sink = io.StringIO()
    clock = Clock()
    with LineProgress(Console(file=sink, width=200), interval_s=10, clock=clock) as bar:
        task = bar.add_task("training", total=40, info="")
        for step in range(1, 5):  # moving: a line every 10 s
            clock.now += 10
            bar.update(task, completed=step * 5, info=f"loss {1 / step:.2f}")
        for _ in range(6):  # stalled at 20/40 for 30 s: nothing until 40 s without a change
            clock.now += 5
            bar.update(task, completed=20)
        clock.now += 10
        bar.update(task, completed=20)
    lines = sink.getvalue().splitlines()
    assert lines[:4] == [
        "training: 5/40 (12%), loss 1.00, 10 s",
        "training: 10/40 (25%), loss 0.50, 20 s",
        "training: 15/40 (38%), loss 0.33, 30 s",
        "training: 20/40 (50%), loss 0.25, 40 s",
    ]
    assert lines[4:] == ["training: 20/40 (50%), loss 0.25, 80 s", "training: 20/40 (50%), loss 0.25, 80 s"]


def test_a_terminal_gets_a_rich_bar_and_a_pipe_gets_lines() -> None:
    assert isinstance(progress(Console(file=io.StringIO())), LineProgress)
    assert isinstance(progress(Console(file=io.StringIO(), force_terminal=True)), Progress)
