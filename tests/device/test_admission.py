"""A device takes a bounded amount of work at once and says when to come back beyond it."""

from __future__ import annotations

import threading

import pytest

from quarry.coordinator.membership.backoff import BusyCounter, retrying
from quarry.device.admission import RETRY_AFTER_MS_UNKNOWN, Admission
from quarry.errors import DeviceBusy


def test_beyond_its_slots_a_device_is_busy_and_names_a_wait():
    admission = Admission("dev0", exchanges_max=2, queued_bytes_max=1 << 20)
    first, second = admission.enter(), admission.enter()
    with pytest.raises(DeviceBusy, match=r"dev0 is busy \(2 of 2 .*retry after \d+ ms") as busy:
        admission.enter()
    assert busy.value.retry_after_ms == RETRY_AFTER_MS_UNKNOWN
    admission.leave(first)
    admission.leave(second)
    with admission.exchange():
        assert admission.status()["running"] == 1
    assert admission.status() == {
        "running": 0,
        "running_small": 0,
        "exchanges_max": 2,
        "queued_bytes": 0,
        "admitted": 3,
        "refused": 1,
    }


def test_small_work_has_a_lane_of_its_own():
    admission = Admission("dev0", exchanges_max=1, queued_bytes_max=1 << 20)
    large = admission.enter()
    with pytest.raises(DeviceBusy):
        admission.enter()
    with admission.exchange(small=True):  # a point lookup does not queue behind the scan
        assert admission.status()["running_small"] == 1
        with pytest.raises(DeviceBusy, match="1 of 1 small exchanges"):
            admission.enter(small=True)
    admission.leave(large)


def test_output_waiting_for_the_link_counts_against_the_bound():
    admission = Admission("dev0", exchanges_max=8, queued_bytes_max=1000)
    admission.queue(1500)
    with pytest.raises(DeviceBusy, match="MiB of output queued"):
        admission.enter()
    admission.unqueue(1500)
    admission.leave(admission.enter())


def test_the_wait_follows_how_long_exchanges_take():
    admission = Admission("dev0", exchanges_max=2, queued_bytes_max=1 << 20)
    for _ in range(5):
        started = admission.enter()
        admission.leave(started - 0.4)  # as if each had run 0.4 s
    assert admission.retry_after_ms() == pytest.approx(200, rel=0.05)  # 0.4 s over 2 slots


def test_a_slot_freed_within_the_short_wait_admits_instead_of_refusing():
    admission = Admission("dev0", exchanges_max=1, queued_bytes_max=1 << 20)
    started = admission.enter()
    threading.Timer(0.01, admission.leave, (started,)).start()
    admission.leave(admission.enter())  # waited for the slot rather than refusing


def test_the_caller_backs_off_as_asked_and_gives_up_at_its_bound():
    refusals, pauses = [3], []

    def call() -> str:
        if refusals[0]:
            refusals[0] -= 1
            raise DeviceBusy("dev0 is busy: retry after 100 ms")
        return "ran"

    counter = BusyCounter()
    assert retrying(call, counter, wait_s_max=10, sleep=pauses.append) == "ran"
    assert counter.retries == 3 and len(pauses) == 3
    assert 0.05 <= pauses[0] <= 0.15 and pauses[2] > pauses[0] * 0.5  # jittered, growing

    def always_busy() -> str:
        raise DeviceBusy("dev0 is busy: retry after 500 ms")

    held = BusyCounter()
    with pytest.raises(DeviceBusy, match=r"still busy after .* \$QUARRY_BUSY_WAIT_S"):
        retrying(always_busy, held, wait_s_max=2, sleep=lambda s: None)
    assert 0 < held.retries < 20 and held.waited_s <= 2


def test_busy_crosses_the_wire_with_its_wait():
    from quarry.protocol import frame

    error = DeviceBusy("device d is busy (4 of 4 exchanges running): retry after 37 ms", 37)
    rebuilt = frame.decode_error(frame.encode_error(error))
    assert isinstance(rebuilt, DeviceBusy) and rebuilt.retry_after_ms == 37
