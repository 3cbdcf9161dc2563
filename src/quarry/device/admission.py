"""Admission: how much work a device takes on at once, and "busy, retry after N ms" beyond it.

A device runs at most ``exchanges_max`` streams of new work (work exchanges and scans) and holds
at most ``queued_bytes_max`` bytes of output computed but not yet written to its streams. A
request that finds a slot within ``WAIT_S`` runs; otherwise it is refused at once with
``DeviceBusy``, before any of its output, naming when to come back: the time one slot takes to
free at the device's recent pace. The coordinator backs off and retries (``coordinator.backoff``),
so an overloaded device slows its callers down instead of running out of memory, and an answer
never changes (Exadata: a busy cell never changes an answer).

Small work, at most ``SMALL_BYTES_MAX`` of stored slices left to read once zone maps and caches
have had their say, has a lane of its own with as many slots: a user's point lookup does not
queue behind scans of whole partitions, nor a query's read of a small table (TPC-H's nation, 25
rows, waited 30 to 70 ms for a slot behind lineitem's streams of the same query). (Exadata's I/O
resource manager and Ceph's mClock give classes of work reservations and weights; two lanes are
the least of that.)

Fetches of ranges a device pushed back, and control actions (hello, inventory, commit) are not
admitted here: they belong to work already admitted, or are small; refusing them would stall
queries under way or make a busy device look dead.
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
import time
from collections.abc import Iterable, Iterator

from quarry import settings
from quarry.errors import DeviceBusy

WAIT_S = 0.05  # a short queue at the door before refusing
EXCHANGES_PER_CORE = 2
EXCHANGES_MIN = 4
RETRY_AFTER_MS_MIN = 5
RETRY_AFTER_MS_MAX = 2_000
RETRY_AFTER_MS_UNKNOWN = 20
RECENT_EXCHANGES = 32
SMALL_BYTES_MAX = 8 << 20


def exchanges_for(cores: int | None) -> int:
    """The default bound: two streams per core (one computing while one ships), at least 4."""
    configured = settings.DEVICE_EXCHANGES_MAX.get()
    if configured is not None:
        return configured
    return max(EXCHANGES_MIN, EXCHANGES_PER_CORE * (cores or os.cpu_count() or 1))


def queued_bytes_default() -> int:
    """$QUARRY_DEVICE_QUEUED_MIB_MAX in bytes (256 MiB unset); a fraction of a byte is one."""
    return max(1, int(settings.DEVICE_QUEUED_MIB_MAX.get() * (1 << 20)))


class Lane:
    """Slots of one class of work."""

    def __init__(self, slots: int):
        self.slots = slots
        self.semaphore = threading.BoundedSemaphore(slots)
        self.running = 0


class Admission:
    def __init__(self, device: str, exchanges_max: int, queued_bytes_max: int):
        assert exchanges_max >= 1 and queued_bytes_max > 0
        self.device = device
        self.exchanges_max = exchanges_max
        self.queued_bytes_max = queued_bytes_max
        self.lanes = {False: Lane(exchanges_max), True: Lane(exchanges_max)}  # small -> lane
        self._lock = threading.Lock()
        self._recent: collections.deque[float] = collections.deque(maxlen=RECENT_EXCHANGES)
        self.queued_bytes = 0
        self.admitted = 0
        self.refused = 0

    @property
    def running(self) -> int:
        return sum(lane.running for lane in self.lanes.values())

    @contextlib.contextmanager
    def exchange(self, small: bool = False) -> Iterator[None]:
        """Hold a slot while a stream of new work runs; DeviceBusy when none frees in time."""
        started = self.enter(small)
        try:
            yield
        finally:
            self.leave(started, small)

    def enter(self, small: bool = False) -> float:
        lane = self.lanes[small]
        if self.queued_bytes > self.queued_bytes_max or not lane.semaphore.acquire(timeout=WAIT_S):
            with self._lock:
                self.refused += 1
            raise self._busy(lane)
        with self._lock:
            lane.running += 1
            self.admitted += 1
        return time.perf_counter()

    def leave(self, started: float | None = None, small: bool = False) -> None:
        lane = self.lanes[small]
        with self._lock:
            lane.running -= 1
            if started is not None and not small:
                self._recent.append(time.perf_counter() - started)
        lane.semaphore.release()

    def stream(self, batches: Iterable, started: float, small: bool = False) -> Iterator:
        """A scan's batches, holding the slot taken at ``started`` (in the ``small`` lane or
        not) until the stream ends (or its reader goes away and the generator is closed)."""
        try:
            yield from batches
        finally:
            self.leave(started, small)

    def queue(self, size: int) -> None:
        with self._lock:
            self.queued_bytes += size

    def unqueue(self, size: int) -> None:
        with self._lock:
            self.queued_bytes -= size

    def retry_after_ms(self) -> int:
        """When a slot should be free: a recent exchange's time over the slots it shares."""
        with self._lock:
            recent = list(self._recent)
        if not recent:
            return RETRY_AFTER_MS_UNKNOWN
        typical_s = sorted(recent)[len(recent) // 2]
        estimate = 1000 * typical_s / self.exchanges_max
        return int(min(RETRY_AFTER_MS_MAX, max(RETRY_AFTER_MS_MIN, estimate)))

    def _busy(self, lane: Lane) -> DeviceBusy:
        wait = self.retry_after_ms() if lane is self.lanes[False] else RETRY_AFTER_MS_MIN
        kind = "small " if lane is self.lanes[True] else ""
        return DeviceBusy(
            f"device {self.device} is busy ({lane.running} of {lane.slots} {kind}exchanges "
            f"running, {self.queued_bytes / (1 << 20):.0f} MiB of output queued): "
            f"retry after {wait} ms",
            retry_after_ms=wait,
        )

    def status(self) -> dict[str, int]:
        with self._lock:
            return {
                "running": self.lanes[False].running,
                "running_small": self.lanes[True].running,
                "exchanges_max": self.exchanges_max,
                "queued_bytes": self.queued_bytes,
                "admitted": self.admitted,
                "refused": self.refused,
            }
