"""Threads kept between tasks: a task never waits for a thread, a lane never runs more than
its width at once, idle threads are bounded and a task's error reaches its future."""

from __future__ import annotations

import threading
import time

import pytest

from quarry import threads


def test_a_submitted_task_gives_its_result_or_its_error():
    assert threads.submit(lambda a, b: a + b, 2, 3).result(5) == 5
    with pytest.raises(ZeroDivisionError):
        threads.submit(lambda: 1 / 0).result(5)


def test_finished_threads_are_taken_again():
    idents = set()
    for _ in range(5):
        idents.add(threads.submit(lambda: threading.current_thread().ident).result(5))
        time.sleep(0.05)  # the thread parks again
    assert len(idents) == 1  # one after the other: the same kept thread each time


def test_tasks_that_wait_on_each_other_each_get_a_thread():
    """Producers blocked on a consumer that is itself a task: never queued behind each other."""
    ready = threading.Barrier(8, timeout=5)
    futures = [threads.submit(ready.wait) for _ in range(8)]
    assert all(isinstance(f.result(5), int) for f in futures)


def test_lanes_run_every_task_at_most_width_at_once():
    running, most, started, done = 0, 0, [], []
    lock = threading.Lock()
    finished = threading.Event()

    def task(number: int) -> None:
        nonlocal running, most
        with lock:
            started.append(number)
            running += 1
            most = max(most, running)
        time.sleep(0.01)
        with lock:
            running -= 1
            done.append(number)
            if len(done) == 12:
                finished.set()

    threads.lanes([(lambda n=n: task(n)) for n in range(12)], width=3)
    assert finished.wait(5)
    assert most <= 3 and sorted(done) == list(range(12))
    assert sorted(started) == list(range(12))


def test_idle_threads_are_bounded():
    gate = threading.Event()
    futures = [threads.submit(gate.wait, 5) for _ in range(threads.IDLE_THREADS_MAX + 8)]
    gate.set()
    for future in futures:
        future.result(5)
    time.sleep(0.1)
    idle = [t for t in threading.enumerate() if t.name == "quarry-idle"]
    assert len(idle) <= threads.IDLE_THREADS_MAX


def test_bounded_runs_at_most_width_at_once_in_order_and_cancels_what_waits():
    """As a ThreadPoolExecutor of that width: results and errors reach their futures, and a
    shutdown that cancels leaves the waiting tasks unrun."""
    running, most, order = 0, 0, []
    lock = threading.Lock()
    gate = threading.Event()

    def task(number: int) -> int:
        nonlocal running, most
        with lock:
            order.append(number)
            running += 1
            most = max(most, running)
        gate.wait(5)
        with lock:
            running -= 1
        if number == 3:
            raise ValueError("three")
        return number * 10

    pool = threads.Bounded(2, "quarry-test")
    futures = [pool.submit(task, n) for n in range(6)]
    time.sleep(0.05)
    assert order == [0, 1]  # the others wait their turn
    gate.set()
    assert [f.result(5) for f in futures if f is not futures[3]] == [0, 10, 20, 40, 50]
    with pytest.raises(ValueError, match="three"):
        futures[3].result(5)
    assert most == 2 and order == list(range(6))

    gate.clear()
    began = threading.Event()
    pool = threads.Bounded(1, "quarry-test")
    first = pool.submit(lambda: began.set() or gate.wait(5))
    second = pool.submit(lambda: "never")
    assert began.wait(5)
    pool.shutdown(cancel_futures=True)
    gate.set()
    assert first.result(5) is True and second.cancelled()
    with pytest.raises(RuntimeError):
        pool.submit(lambda: None)
