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
own figure (an emulated drive's profile keeps none: its calibrations are of the drive reading),
else an eighth of the machine's memory. Every device on a machine sizes its own, so the cache
also gives way to the machine: while less than an eighth of the machine's memory is to spare
(``MemAvailable``), it does not grow, and a column enters only in place of older ones.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import NamedTuple

import pyarrow as pa

from quarry import machine, settings

SPARE_SHARE = 8  # the cache grows only while this fraction of the machine's memory is to spare


def setting_bytes() -> int | None:
    """``QUARRY_DEVICE_CACHE_MIB`` in bytes; None unset (``Profile.cache_bytes`` sizes the
    cache to the machine)."""
    mib = settings.DEVICE_CACHE_MIB.get()
    return None if mib is None else mib << 20


class ColumnKey(NamedTuple):
    """A tuple, hashed and compared in C: every slice of every request looks its columns up
    (a frozen dataclass's hash and equality, in Python, cost a TPC-DS query's device 2%)."""

    dataset: str  # domain/name
    partition: int
    number: int  # the slice
    column: int  # its position in the partition's schema
    checksum: int  # of its stored stream


class _Held(NamedTuple):
    array: pa.Array
    run: pa.Array  # the run's whole column this is a view of (``put_run``)
    start: int  # where in it


class ColumnCache:
    def __init__(
        self,
        capacity_bytes: int,
        spare_bytes: Callable[[], int | None] = machine.available_bytes,
        spare_bytes_min: int = machine.memory_bytes() // SPARE_SHARE,
    ):
        assert capacity_bytes >= 0
        self.capacity_bytes = capacity_bytes
        self._spare_bytes = spare_bytes
        self._spare_bytes_min = spare_bytes_min
        self._entries: OrderedDict[ColumnKey, _Held] = OrderedDict()
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
            held = [self._entries.get(key) for key in keys]
            if any(entry is None for entry in held):
                self.misses += 1
                return None
            for key in keys:
                self._entries.move_to_end(key)
            self.hits += 1
            return [entry.array for entry in held]  # type: ignore[union-attr]

    def get_runs(self, slices: list[list[ColumnKey]]) -> list[list[pa.Array]] | None:
        """The columns of a chunk's slices (each its keys, the same columns in the same order)
        in as few pieces as the cache holds them, without a copy: each piece the columns of a
        stretch of slices kept end to end in one run's buffer (``put_run``), one array each.
        None if some column of some slice is not here."""
        if not slices:
            return None
        with self._lock:
            held = [[self._entries.get(key) for key in keys] for keys in slices]
            if any(entry is None for entries in held for entry in entries):
                return None
            pieces: list[list[pa.Array]] = []
            first = 0
            for end in range(1, len(held) + 1):
                if end < len(held) and _follows(held[end - 1], held[end]):
                    continue
                pieces.append(_piece(held[first:end]))  # type: ignore[arg-type]
                first = end
            for keys in slices:
                for key in keys:
                    self._entries.move_to_end(key)
            self.hits += len(slices)
            return pieces

    def put(self, keys: list[ColumnKey], arrays: list[pa.Array]) -> None:
        """Keep copies of these columns, if they fit; the least recently used go to make room."""
        self.put_run([(keys, arrays)])

    def put_run(self, slices: list[tuple[list[ColumnKey], list[pa.Array]]]) -> None:
        """Keep copies of the columns of a run of slices (each its keys and its arrays, the
        same columns in the same order), each column of the run copied into one buffer and
        each slice's entry a view of it: read again, ``get_runs`` gives the run's columns as
        one array each without a copy (a chunk's key cuts and its engine run then go once
        over each column instead of once over each slice's piece of it: TPC-DS SF 1 Q52's
        store sales, 55 slices a partition, cut by dates and items 3.3 -> 1.7 ms). A run
        takes at most an eighth of the cache, as a slice would; its views are read and kept
        together, so its buffer is let go once they all are."""
        for run in _runs(slices, self.capacity_bytes // 8):  # no run takes it all
            self._put_run(run)

    def _put_run(self, slices: list[tuple[list[ColumnKey], list[pa.Array]]]) -> None:
        views: list[list[_Held]] = [[] for _ in slices]
        for column in zip(*(arrays for _, arrays in slices), strict=True):
            whole = pa.concat_arrays(list(column))  # owned, off the store's map
            at = 0
            for n, array in enumerate(column):
                views[n].append(_Held(whole.slice(at, len(array)), whole, at))
                at += len(array)
        short = self._short_of_memory()
        with self._lock:
            bytes_max = min(self.capacity_bytes, self._bytes) if short else self.capacity_bytes
            for (keys, _), held in zip(slices, views, strict=True):
                for key, entry in zip(keys, held, strict=True):
                    old = self._entries.pop(key, None)
                    if old is not None:
                        self._bytes -= old.array.nbytes
                    self._entries[key] = entry
                    self._bytes += entry.array.nbytes
            while self._bytes > bytes_max and self._entries:
                _, dropped = self._entries.popitem(last=False)
                self._bytes -= dropped.array.nbytes

    def _short_of_memory(self) -> bool:
        spare = self._spare_bytes()
        return spare is not None and spare < self._spare_bytes_min

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0


def _follows(before: list[_Held], after: list[_Held]) -> bool:
    """Whether each column of a slice lies right after the slice before's in the same run."""
    return all(
        b.run is a.run and b.start + len(b.array) == a.start
        for b, a in zip(before, after, strict=True)
    )


def _piece(slices: list[list[_Held]]) -> list[pa.Array]:
    """Slices whose columns follow one another in one run: each column, one view of it."""
    first, last = slices[0], slices[-1]
    return [
        start.run.slice(start.start, end.start + len(end.array) - start.start)
        for start, end in zip(first, last, strict=True)
    ]


def _runs(
    slices: list[tuple[list[ColumnKey], list[pa.Array]]], bytes_max: int
) -> Iterator[list[tuple[list[ColumnKey], list[pa.Array]]]]:
    """The slices in order, in runs of at most ``bytes_max`` each; a slice larger alone is
    left out."""
    run: list[tuple[list[ColumnKey], list[pa.Array]]] = []
    held = 0
    for entry in slices:
        size = sum(array.nbytes for array in entry[1])
        if size > bytes_max:
            continue
        if run and held + size > bytes_max:
            yield run
            run, held = [], 0
        run.append(entry)
        held += size
    if run:
        yield run
