"""Threads kept between tasks: a query's streams start on threads an earlier query left idle.

Starting a thread costs 0.1-1 ms of a busy interpreter (the starter waits until the new thread
runs), and every query used to start one per device stream, one per fragment spool and one per
probe of the cluster: a few milliseconds of a small query. Here a finished thread waits
``IDLE_WAIT_S`` for the next task before it ends, and at most ``IDLE_THREADS_MAX`` wait at once.

The pool never makes a task wait for a thread: a task with no idle thread gets a new one, so
tasks that block on each other (producers on a bounded queue whose reader is another task) run
exactly as they would on threads of their own. How many run at once stays the caller's bound
(``lanes``: a fixed number of runners share a list of tasks, as a ``ThreadPoolExecutor`` of that
size would).

The threads are not daemons: one killed at exit inside native code (DataFusion, Arrow) aborts
the process. Idle ones are woken and end when the interpreter shuts down, before it joins them.
"""

from __future__ import annotations

import os
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")
IDLE_THREADS_MAX = 32  # threads waiting for a task; more finished ones end at once
IDLE_WAIT_S = 30.0  # how long a finished thread waits for the next task before it ends

_lock = threading.Lock()
_idle: list[_Worker] = []
_closing = False


class _Worker:
    """A thread that runs one task, then waits for another (or ends)."""

    def __init__(self) -> None:
        self.task: Callable[[], None] | None = None
        self.name = ""
        self.wake = threading.Event()

    def loop(self) -> None:
        thread = threading.current_thread()
        while True:
            task, self.task = self.task, None
            assert task is not None
            thread.name = self.name
            _run(task)
            del task
            thread.name = "quarry-idle"
            if not self._park():
                return

    def _park(self) -> bool:
        """Wait for the next task; False: end the thread."""
        with _lock:
            if _closing or len(_idle) >= IDLE_THREADS_MAX:
                return False
            self.wake.clear()
            _idle.append(self)
        if self.wake.wait(IDLE_WAIT_S):
            return self.task is not None
        with _lock:
            if self in _idle:  # no task came: leave the idle list and end
                _idle.remove(self)
                return False
        self.wake.wait()  # a task was handed over just as the wait ran out
        return self.task is not None


def _run(task: Callable[[], None]) -> None:
    """A task's error that it did not report itself is shown as a thread's own would be."""
    try:
        task()
    except BaseException:
        args = (*sys.exc_info(), threading.current_thread())
        threading.excepthook(threading.ExceptHookArgs(args))  # type: ignore[attr-defined]


def start(task: Callable[[], None], name: str = "quarry-thread") -> None:
    """Run ``task`` on an idle thread, or a new one when none is idle. Its errors are its
    own to report (``submit`` hands them to a future); one it lets out is printed."""
    with _lock:
        worker = _idle.pop() if _idle else None
    if worker is not None:
        worker.name = name
        worker.task = task
        worker.wake.set()
        return
    worker = _Worker()
    worker.name = name
    worker.task = task
    threading.Thread(target=worker.loop, name=name).start()


def submit(function: Callable[..., T], *args: Any, name: str = "quarry-thread") -> Future[T]:
    """``function(*args)`` on a kept thread; its result or error in the future."""
    future: Future[T] = Future()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(function(*args))
        except BaseException as error:
            future.set_exception(error)

    start(run, name)
    return future


def lanes(tasks: Iterable[Callable[[], None]], width: int, name: str = "quarry-thread") -> None:
    """Run ``tasks`` in order, at most ``width`` at once, each on a kept thread; returns at
    once (the tasks report their own ends)."""
    assert width >= 1
    waiting = deque(tasks)
    taken = threading.Lock()

    def runner() -> None:
        while True:
            with taken:
                if not waiting:
                    return
                task = waiting.popleft()
            _run(task)

    for _ in range(min(width, len(waiting))):
        start(runner, name)


class Bounded:
    """At most ``width`` tasks at once on kept threads, the others waiting in order: a
    ``ThreadPoolExecutor`` of that size that starts no threads of its own (a query's device
    streams each had one for the ranges their devices hand back: a thread started per range,
    a tenth of the host's CPU on TPC-H's small queries)."""

    def __init__(self, width: int, name: str = "quarry-thread") -> None:
        assert width >= 1
        self.width = width
        self.name = name
        self._waiting: deque[tuple[Future[Any], Callable[[], Any]]] = deque()
        self._lock = threading.Lock()
        self._running = 0
        self._closed = False

    def submit(self, function: Callable[..., T], *args: Any) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot submit to a shut down Bounded")
            self._waiting.append((future, lambda: function(*args)))
            if self._running >= self.width:
                return future
            self._running += 1
        start(self._runner, self.name)
        return future

    def _runner(self) -> None:
        while True:
            with self._lock:
                if not self._waiting:
                    self._running -= 1
                    return
                future, call = self._waiting.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(call())
            except BaseException as error:
                future.set_exception(error)

    def shutdown(self, cancel_futures: bool = False) -> None:
        """No more tasks; with ``cancel_futures``, those not started never will be. Returns at
        once: the running ones finish on their threads."""
        with self._lock:
            self._closed = True
            cancelled = list(self._waiting) if cancel_futures else []
            if cancel_futures:
                self._waiting.clear()
        for future, _ in cancelled:
            future.cancel()


def _close() -> None:
    """At shutdown: idle threads end now rather than after ``IDLE_WAIT_S``."""
    global _closing
    with _lock:
        _closing = True
        idle, _idle[:] = list(_idle), []
    for worker in idle:
        worker.wake.set()


def _after_fork() -> None:
    """A forked child has none of its parent's threads: forget the idle ones."""
    global _lock
    _lock = threading.Lock()
    _idle.clear()


# Called before the interpreter joins its non-daemon threads, as concurrent.futures does for
# its own workers (``atexit`` would run only after that join, too late).
threading._register_atexit(_close)  # type: ignore[attr-defined]
os.register_at_fork(after_in_child=_after_fork)
