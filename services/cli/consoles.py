"""Consoles for the CLI. Rich draws for 80 columns when output is not a terminal (a pipe, a file,
a CI log), which squashes tables to "trai…"; there they get a wide fixed width instead."""

from __future__ import annotations

import os

from rich.console import Console

PIPED_WIDTH = 160


def make_console(*, stderr: bool = False) -> Console:
    console = Console(stderr=stderr)
    if console.is_terminal or "COLUMNS" in os.environ:
        return console
    return Console(stderr=stderr, width=PIPED_WIDTH)
