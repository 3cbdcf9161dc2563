"""Wall and CPU seconds of one kind of work, added up where it runs (EXPLAIN ANALYZE's ``time``).

CPU is the seconds of the thread that did the work (``time.thread_time``): a device or the host
runs many things at once, and its process's CPU would count them all. Wall includes whatever
the work waited for (a slot, a link, the store).
"""

from __future__ import annotations

import resource
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass
class Tally:
    wall_s: float = 0.0
    cpu_s: float = 0.0

    def add(self, other: Tally) -> None:
        self.wall_s += other.wall_s
        self.cpu_s += other.cpu_s

    @contextmanager
    def timing(self, process: bool = False) -> Iterator[None]:
        """Count what runs inside: CPU of this thread, or with ``process`` of the whole process
        (work an engine does on threads of its own; whatever else the process did meanwhile
        counts too)."""
        clock = process_seconds if process else time.thread_time
        wall, cpu = time.perf_counter(), clock()
        try:
            yield
        finally:
            self.wall_s += time.perf_counter() - wall
            self.cpu_s += clock() - cpu

    def timed(self, items: Iterable[T], process: bool = False) -> Iterator[T]:
        """``items``, counting only the time spent making each (not the reader's between)."""
        iterator = iter(items)
        while True:
            with self.timing(process):
                try:
                    item = next(iterator)
                except StopIteration:
                    return
            yield item


def process_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
