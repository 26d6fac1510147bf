"""The one look of failsoft's progress bars (rich): what is running, a bar, done of total, time."""

from __future__ import annotations

from typing import Any


def progress_bar(stderr: bool = False) -> Any:
    """A rich ``Progress`` (not started) on stdout, or on stderr when stdout carries results."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    return Progress(*columns, console=Console(stderr=stderr))
