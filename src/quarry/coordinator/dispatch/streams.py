"""Merging streams that producers fill in parallel: device streams, partition by partition.

Each producer runs on a kept thread (``quarry.threads``, at most ``workers`` at once) and its
items are yielded as they arrive; the first error a producer raises is raised in the reader (it
names the device); closing the reader early stops the producers at their next item. A
``cancelled`` event set from another thread does the same for a reader that is waiting (it
cannot be closed while it runs): the reader raises ``QueryCancelled`` within ``PUT_WAIT_S``.
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import TypeVar

from quarry import threads
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
        if stop.is_set():  # the reader went before this producer's turn came: it never starts
            put(done)
            return
        try:
            for item in producer():
                if stopped():
                    return
                put(item)
        except BaseException as error:  # handed to the reader, which raises it
            put(error)
        finally:
            put(done)

    # at most ``workers`` producers at once, on threads kept between queries (``threads``)
    threads.lanes([(lambda p=producer: produce(p)) for producer in producers], workers, name)

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

    return Merged(read(), stop)


class Merged(Iterator[T]):
    """The reader of a merge. Closed or dropped, read or not, it stops the producers at their
    next item (a generator never started runs no ``finally``: producers of a reader dropped
    unread would wait on the full queue for ever)."""

    def __init__(self, items: Generator[T, None, None], stop: threading.Event) -> None:
        self._items = items
        self._stop = stop
        weakref.finalize(self, stop.set)

    def __iter__(self) -> Merged[T]:
        return self

    def __next__(self) -> T:
        return next(self._items)

    def close(self) -> None:
        self._stop.set()
        self._items.close()

    def through(self, wrap: Callable[[Iterator[T]], Generator[T, None, None]]) -> Merged[T]:
        """This stream through ``wrap`` (a span that ends with it): closed or dropped, the
        result stops the producers as this one would."""
        return Merged(wrap(self), self._stop)


def _next(results: queue.Queue, cancelled: threading.Event | None) -> object:
    """The next item, or ``QueryCancelled`` once ``cancelled`` is set (checked while waiting)."""
    while True:
        if cancelled is not None and cancelled.is_set():
            raise QueryCancelled("the query was cancelled")
        try:
            return results.get(timeout=None if cancelled is None else PUT_WAIT_S)
        except queue.Empty:
            continue
