"""What every command group shares: settings with a readable error, and the process runtime."""

from __future__ import annotations

import typer
from rich.console import Console

from p2p.apps.tasks import register_tasks
from p2p.shared.runtime import Runtime, build_runtime, set_process_runtime
from p2p.shared.settings import Settings, get_settings

console = Console(stderr=True)


def settings_or_exit() -> Settings:
    try:
        return get_settings()
    except Exception as exc:  # pydantic's message names the variable at fault
        console.print(f"[red]configuration error:[/red] {exc}")
        raise typer.Exit(2) from exc


def open_runtime(settings: Settings) -> Runtime:
    """The runtime of this command; with in-process tasks (embedded profile) it runs every service's."""
    register_tasks()
    runtime = build_runtime(settings)
    set_process_runtime(runtime)
    return runtime
