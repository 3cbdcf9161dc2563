"""Progress bars that appear only for work that lasts (over a second) on a terminal."""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Self

from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)

DELAY_S = 1.0


class Bar:
    """``with Bar("ingest", total) as bar: bar.advance(n)``; silent when not on a terminal."""

    def __init__(
        self, description: str, total: float | None, unit: str = "rows", enabled: bool | None = None
    ):
        self.description = description
        self.total = total
        self.unit = unit
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._progress: Progress | None = None
        self._task = None
        self._done = 0.0
        self._started = time.monotonic()

    def __enter__(self) -> Self:
        return self

    def _show(self) -> None:
        if self.unit == "bytes":
            columns = [
                TextColumn("{task.description}"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TimeElapsedColumn(),
            ]
        else:
            columns = [
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TaskProgressColumn(),
                TimeElapsedColumn(),
            ]
        self._progress = Progress(*columns, transient=False)
        self._progress.start()
        self._task = self._progress.add_task(
            self.description, total=self.total, completed=self._done
        )

    def advance(self, amount: float) -> None:
        self._done += amount
        if self._progress is None:
            if self.enabled and time.monotonic() - self._started > DELAY_S:
                self._show()
            return
        self._progress.update(self._task, completed=self._done)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._progress is not None:
            if kind is None:
                self._progress.update(self._task, completed=self.total or self._done)
            self._progress.stop()
