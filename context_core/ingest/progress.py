"""Stage progress and timing shared by the refresh's plan and apply halves.

Rich bars for the CLI, nothing for Airflow and tests (rich is imported only when enabled).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["StageProgress", "timed"]


class StageProgress:
    """One bar per stage when ``enabled``; every method is a no-op otherwise."""

    def __init__(self, enabled: bool) -> None:
        self._bar: Any = None
        if enabled:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._bar = Progress(
                TextColumn("[bold]{task.description:<9}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                transient=False,
            )

    def __enter__(self) -> StageProgress:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def stage(self, name: str, total: int | None) -> Any:
        return None if self._bar is None else self._bar.add_task(name, total=total)

    def advance(self, task: Any, n: int = 1) -> None:
        if task is not None:
            self._bar.advance(task, n)

    def finish(self, task: Any) -> None:
        if task is not None:
            t = self._bar.tasks[task]
            self._bar.update(task, total=t.completed or 0, completed=t.completed or 0)


@contextmanager
def timed(seconds: dict[str, float], stage: str) -> Iterator[None]:
    """Add the wall time of the ``with`` body to ``seconds[stage]`` (stages can repeat)."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        seconds[stage] = seconds.get(stage, 0.0) + time.perf_counter() - t0
