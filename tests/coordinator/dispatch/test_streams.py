"""``streams.merge``: a cancel set from another thread stops a reader that waits, and its
producers, without anyone closing the reader."""

from __future__ import annotations

import threading
import time

import pytest

from quarry.coordinator.dispatch.streams import PUT_WAIT_S, merge
from quarry.errors import QueryCancelled


def test_a_cancel_stops_a_waiting_reader_and_its_producers():
    cancelled = threading.Event()
    produced = []

    def slow():
        for number in range(1_000):
            produced.append(number)
            yield number
            time.sleep(0.05)

    reader = merge([slow, slow], workers=2, queue_items_max=2, cancelled=cancelled)
    assert next(reader) in (0, 1, 2)
    threading.Timer(0.2, cancelled.set).start()
    started = time.monotonic()
    with pytest.raises(QueryCancelled):
        for _ in reader:
            pass
    assert time.monotonic() - started < 0.2 + 4 * PUT_WAIT_S + 0.1
    count = len(produced)
    time.sleep(0.3)
    assert len(produced) <= count + 2, "the producers went on after the cancel"


def test_without_a_cancel_every_item_arrives():
    items = merge([lambda: range(5), lambda: range(5, 9)], workers=2, cancelled=threading.Event())
    assert sorted(items) == list(range(9))
