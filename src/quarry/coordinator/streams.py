"""Merging streams that producers fill in parallel: device streams, partition by partition.

Each producer runs in a thread pool and its items are yielded as they arrive; the first error
a producer raises is raised in the reader (it names the device); closing the reader early stops
the producers at their next item. A ``cancelled`` event set from another thread does the same
for a reader that is waiting (it cannot be closed while it runs): the reader raises
``QueryCancelled`` within ``PUT_WAIT_S``.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from quarry.errors import QueryCancelled

T = TypeVar("T")
PUT_WAIT_S = 0.1  # how often a producer blocked on a full queue checks for a closed reader


def merge(
    producers: list[Callable[[], Iterable[T]]],
    workers: int,
    queue_items_max: int = 0,
    name: str = "quarry-stream",
    cancelled: threading.Event | None = None,
) -> Iterator[T]:
    """Items of every producer, interleaved. ``queue_items_max`` bounds what waits for the
    reader (0: unbounded, for readers that take one stream whole before the next)."""
    assert workers >= 1
    results: queue.Queue = queue.Queue(maxsize=queue_items_max)
    stop = threading.Event()
    done = object()

    def stopped() -> bool:
        return stop.is_set() or (cancelled is not None and cancelled.is_set())

    def put(item: object) -> None:
        while not stopped():
            try:
                results.put(item, timeout=PUT_WAIT_S)
                return
            except queue.Full:
                continue

    def produce(producer: Callable[[], Iterable[T]]) -> None:
        try:
            for item in producer():
                if stopped():
                    return
                put(item)
        except BaseException as error:  # handed to the reader, which raises it
            put(error)
        finally:
            put(done)

    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
    for producer in producers:
        pool.submit(produce, producer)
    pool.shutdown(wait=False)

    def read() -> Iterator[T]:
        remaining = len(producers)
        try:
            while remaining:
                item = _next(results, cancelled)
                if item is done:
                    remaining -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield item
        finally:
            stop.set()

    return read()


def _next(results: queue.Queue, cancelled: threading.Event | None) -> object:
    """The next item, or ``QueryCancelled`` once ``cancelled`` is set (checked while waiting)."""
    while True:
        if cancelled is not None and cancelled.is_set():
            raise QueryCancelled("the query was cancelled")
        try:
            return results.get(timeout=None if cancelled is None else PUT_WAIT_S)
        except queue.Empty:
            continue
