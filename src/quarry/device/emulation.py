"""Making a device process behave like the drive its profile names (DESIGN §5).

One machine runs many emulated devices and the host, so the emulation must not burn the CPU it
pretends to have. The mechanism (docs/emulation.md):

- Cores are *slots*. Work on the device runs inside a slot; a device has ``profile.cores`` of
  them, so concurrent requests queue as they would on the drive's few cores.
- Compute factor: a unit of device work is executed for real, its time ``c`` measured, and the
  slot is then held for a further ``(compute_factor - 1) * c`` seconds. A device 15x slower
  than the host therefore takes 15x the time for the same work.
- Background load (``quarry device load --cpu L``) is emulated too, as processor sharing: while
  it runs, device work gets ``1 - L`` of the drive's cores, so ``c`` stretches to
  ``compute_factor * c / (1 - L)``. Burning real CPU instead would load the one machine that
  hosts every device and the host, and measure that machine's contention, not the drive's.
- Bandwidths are token buckets: bytes read from the store pass the internal bucket, bytes sent
  to the host the external one. ``None`` means unlimited.
- The ``host`` profile has none of this: no slots, no sleeps, no buckets.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

from quarry.device.profile import Profile

T = TypeVar("T")
BUSY_WINDOW_S = 2.0  # how far back "CPU busy" looks
LOAD_SECONDS_MAX = 3600.0
BUCKET_BURST_S = 0.02  # idle credit a bucket may bank: enough to absorb jitter in the
# sender, small against a transfer (2.4% of a 256 MiB calibration at 312 MB/s)


class TokenBucket:
    """Bytes per second, shared by every request on the device."""

    def __init__(self, bytes_per_s: float):
        assert bytes_per_s > 0
        self.bytes_per_s = bytes_per_s
        self._lock = threading.Lock()
        self._next_free = time.monotonic()

    def consume(self, size_bytes: int) -> float:
        """Wait until ``size_bytes`` may pass; returns the seconds waited."""
        if size_bytes <= 0:
            return 0.0
        with self._lock:
            now = time.monotonic()
            start = max(now - BUCKET_BURST_S, self._next_free)
            self._next_free = start + size_bytes / self.bytes_per_s
            wait_s = self._next_free - now
        if wait_s > 0:
            time.sleep(wait_s)
        return max(wait_s, 0.0)


@dataclass
class Busy:
    """Slot occupancy over a sliding window: the device's own 'CPU busy' and run queue."""

    started: float
    ended: float


class Emulator:
    def __init__(self, profile: Profile):
        self.profile = profile
        self.enabled = profile.emulated or profile.cores is not None
        self.cores = profile.cores or 0
        self._slots = threading.BoundedSemaphore(self.cores) if self.cores else None
        self.internal = (
            TokenBucket(profile.internal_bytes_per_s) if profile.internal_bytes_per_s else None
        )
        self.external = (
            TokenBucket(profile.external_bytes_per_s) if profile.external_bytes_per_s else None
        )
        self._lock = threading.Lock()
        self._busy: deque[Busy] = deque(maxlen=100_000)
        # every byte through each link since the process started (its metrics)
        self.read_bytes_total = 0
        self.shipped_bytes_total = 0
        self._waiting = 0
        self.load_fraction = 0.0
        self.load_until = 0.0

    # ---- compute --------------------------------------------------------------------------

    @contextmanager
    def slot(self) -> Iterator[None]:
        if self._slots is None:
            yield
            return
        with self._lock:
            self._waiting += 1
        self._slots.acquire()
        with self._lock:
            self._waiting -= 1
        started = time.monotonic()
        try:
            yield
        finally:
            self._slots.release()
            ended = time.monotonic()
            with self._lock:
                self._busy.append(Busy(started, ended))
                # only the window counts: a drive busy with many small chunks would otherwise
                # sum up to the deque's bound at every load reading (10 ms a reading at 100,000)
                while self._busy[0].ended < ended - BUSY_WINDOW_S:
                    self._busy.popleft()

    def run(self, work: Callable[[], T]) -> T:
        """Run device work in a slot, then hold the slot as long as the emulated drive would."""
        return self.run_timed(work)[0]

    def run_timed(self, work: Callable[[], T]) -> tuple[T, float]:
        """``run``, also returning the drive's seconds for the work: its CPU seconds on this
        thread (device stages run on it, single-partition) plus the stretch. Other processes
        competing for the machine's cores do not count as the drive's own slowness."""
        with self.slot():
            started = time.thread_time()
            result = work()
            work_s = time.thread_time() - started
            extra_s = self.stretch(work_s)
        return result, work_s + extra_s

    def stretch(self, work_s: float) -> float:
        """Called inside a slot after real work of ``work_s``: hold the slot for the rest."""
        share = 1.0 - self.background_load()
        extra_s = (self.profile.compute_factor / share - 1.0) * work_s
        if extra_s > 0:
            time.sleep(extra_s)
        return max(extra_s, 0.0)

    def read(self, size_bytes: int) -> None:
        with self._lock:
            self.read_bytes_total += max(size_bytes, 0)
        if self.internal is not None:
            self.internal.consume(size_bytes)

    def ship(self, size_bytes: int) -> None:
        with self._lock:
            self.shipped_bytes_total += max(size_bytes, 0)
        if self.external is not None:
            self.external.consume(size_bytes)

    # ---- load --------------------------------------------------------------------------------

    def background_load(self) -> float:
        return self.load_fraction if time.monotonic() < self.load_until else 0.0

    def load(self) -> dict[str, float]:
        """CPU busy (slot time used over the window, or the background load) and run queue."""
        now = time.monotonic()
        horizon = now - BUSY_WINDOW_S
        with self._lock:
            busy_s = sum(
                min(b.ended, now) - max(b.started, horizon) for b in self._busy if b.ended > horizon
            )
            waiting = self._waiting
        capacity_s = BUSY_WINDOW_S * max(self.cores, 1)
        background = self.background_load()
        return {
            "cpu_busy": max(background, min(1.0, busy_s / capacity_s)),
            "run_queue": float(waiting),
            "background_load": background,
        }

    def start_load(self, fraction: float, seconds: float) -> dict[str, float]:
        """Emulated background load on this drive for ``seconds`` (bounded; ends by itself)."""
        if not 0.0 <= fraction < 1.0:
            raise ValueError(f"cpu load must be in [0, 1), got {fraction}")
        if not 0 < seconds <= LOAD_SECONDS_MAX:
            raise ValueError(f"load seconds must be in (0, {LOAD_SECONDS_MAX}], got {seconds}")
        self.load_fraction = fraction
        self.load_until = time.monotonic() + seconds
        return {"cpu": fraction, "seconds": seconds}

    def stop_load(self) -> None:
        self.load_fraction = 0.0
        self.load_until = 0.0
