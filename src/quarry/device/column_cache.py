"""Decoded columns kept in a device's memory, so a slice's column read again is neither taken
off the store, nor checked, nor decoded again (LiquidCache keeps DataFusion's input decoded in
a cache server's memory for the same reason; a drive's DRAM is that memory here).

Reading a slice's column costs a device more than running most sub-plans over it: TPC-DS SF 1
Q42's devices spent 31 of 72 ms of CPU looking up, checksumming and decoding 220 slices' three
columns, for 29 ms of engine work. An entry is keyed by what the column holds: its dataset,
partition, slice, column and the checksum of its stored stream, so an entry never answers for
other bytes (a slice written again, appended to or moved has another checksum or key); slices
stored without checksums are not kept. An entry enters checked (it was read as every slice
is), as a copy in the device's own memory (a column decoded in place over the store's map
holds the store's read snapshot open). A byte that rots on the store after its column entered
is not seen by queries that find the column here: their answer is the one the byte held when
it was checked, the right one; the scrub reads the store itself (``device/scrub.py``).

Bounded in bytes, least recently used out first: ``QUARRY_DEVICE_CACHE_MIB``, or the profile's
own figure (an emulated drive's profile keeps none: its calibrations are of the drive reading).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import NamedTuple

import pyarrow as pa


class ColumnKey(NamedTuple):
    """A tuple, hashed and compared in C: every slice of every request looks its columns up
    (a frozen dataclass's hash and equality, in Python, cost a TPC-DS query's device 2%)."""

    dataset: str  # domain/name
    partition: int
    number: int  # the slice
    column: int  # its position in the partition's schema
    checksum: int  # of its stored stream


class ColumnCache:
    def __init__(self, capacity_bytes: int):
        assert capacity_bytes >= 0
        self.capacity_bytes = capacity_bytes
        self._entries: OrderedDict[ColumnKey, pa.Array] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def bytes_held(self) -> int:
        return self._bytes

    def get(self, keys: list[ColumnKey]) -> list[pa.Array] | None:
        """Every one of these columns, or None if one is not here."""
        with self._lock:
            arrays = [self._entries.get(key) for key in keys]
            if any(array is None for array in arrays):
                self.misses += 1
                return None
            for key in keys:
                self._entries.move_to_end(key)
            self.hits += 1
            return arrays  # type: ignore[return-value]

    def put(self, keys: list[ColumnKey], arrays: list[pa.Array]) -> None:
        """Keep copies of these columns, if they fit; the least recently used go to make room."""
        size = sum(array.nbytes for array in arrays)
        if not self.capacity_bytes or size > self.capacity_bytes // 8:  # no slice takes it all
            return
        copies = [pa.concat_arrays([array]) for array in arrays]  # owned, off the store's map
        with self._lock:
            for key, copy in zip(keys, copies, strict=True):
                old = self._entries.pop(key, None)
                if old is not None:
                    self._bytes -= old.nbytes
                self._entries[key] = copy
                self._bytes += copy.nbytes
            while self._bytes > self.capacity_bytes and self._entries:
                _, dropped = self._entries.popitem(last=False)
                self._bytes -= dropped.nbytes

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0
