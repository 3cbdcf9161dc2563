"""Rows a device filtered during a unit of work, kept for the host to fetch with the rest of a
pushed-back range (so a range the device filtered is not read and filtered twice).

Bounded in bytes and in idle time; when full, nothing more is parked and the host's fetch
computes the filter again.
"""

from __future__ import annotations

import threading
import time

import pyarrow as pa

PARKED_BYTES_MAX = 256 << 20  # filtered rows a device keeps for the host to fetch
PARKED_IDLE_S_MAX = 120.0  # a query that never fetched them has failed or gone

Key = tuple[str, int, int]  # query id, partition, slice number


class Parked:
    def __init__(self, bytes_max: int = PARKED_BYTES_MAX, idle_s_max: float = PARKED_IDLE_S_MAX):
        self.bytes_max = bytes_max
        self.idle_s_max = idle_s_max
        self._lock = threading.Lock()
        self._entries: dict[Key, tuple[list[pa.RecordBatch], int, float]] = {}
        self._bytes = 0

    def put(self, key: Key, batches: list[pa.RecordBatch]) -> bool:
        size = sum(b.nbytes for b in batches)
        now = time.monotonic()
        with self._lock:
            for stale in [k for k, (_, _, t) in self._entries.items() if now - t > self.idle_s_max]:
                self._bytes -= self._entries.pop(stale)[1]
            if self._bytes + size > self.bytes_max:
                return False
            self._entries[key] = (batches, size, now)
            self._bytes += size
            return True

    def take(self, key: Key) -> list[pa.RecordBatch] | None:
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is None:
                return None
            self._bytes -= entry[1]
            return entry[0]
