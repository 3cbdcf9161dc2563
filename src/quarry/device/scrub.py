"""A device scrubbing its own slices (``Scrub``; docs/integrity.md): each slice of a range read
off the store, checked against its checksums, decoded and checked as any read is, and its zone
map computed again from the rows and compared with the one the metadata slice keeps.

It runs on the device, at a bounded rate, so nothing but the findings crosses the network
(ZFS and Ceph scrub where the disks are, too). What it can mend from its own data it mends:
a zone map that disagrees with rows that check is rewritten from them, a catalog entry that
fails its check is rebuilt from the metadata slice. A damaged slice or metadata slice needs a
good copy from another device: it is reported, and remembered until then (``IntegrityLog``).
"""

from __future__ import annotations

import time
from typing import Any

from quarry.device.emulation import Emulator
from quarry.device.integrity import IntegrityLog
from quarry.errors import CorruptSlice
from quarry.protocol.integrity import CopyPart, CorruptCopy, FoundBy, Scrub, ScrubReply
from quarry.store import mend
from quarry.store import partition as partitions
from quarry.store.kv import KeyValueStore
from quarry.store.partition import PartitionMeta
from quarry.store.zonemap import zone_map, zone_map_to_json


def scrub(
    store: KeyValueStore, emulator: Emulator, request: Scrub, log: IntegrityLog
) -> ScrubReply:
    """Scrub slices ``request.first`` to ``request.end`` of a partition on this device."""
    started = time.perf_counter()
    d, n, p = request.domain, request.dataset, request.partition
    try:
        meta = partitions.read_meta(store, d, n, p)
    except CorruptSlice as error:
        found = _remembered(log, [error])
        return ScrubReply(0, 0, corrupt=found, seconds=time.perf_counter() - started)
    catalog_fixed = not mend.catalog_agrees(store, meta)
    if catalog_fixed:
        mend.rewrite_catalog(store, d, n, p)
    end = len(meta.slices) if request.end is None else min(request.end, len(meta.slices))
    checked = _Checked()
    pace = _Pace(request.bytes_per_s)
    for number in range(request.first, end):
        size = partitions.read_bytes(meta, number)
        pace.take(size)
        emulator.read(size)
        checked.slice(store, meta, number, size)
    fixed = mend.set_zone_maps(store, d, n, p, checked.zone_maps) if checked.zone_maps else 0
    found = _remembered(log, checked.damaged)
    log.mended(d, n, p, frozenset({CopyPart.METADATA, CopyPart.CATALOG}))
    good = set(range(request.first, end)) - {c.slice for c in found}
    log.mended(d, n, p, frozenset({CopyPart.SLICE}), good)  # those that checked are good
    return ScrubReply(
        slices=max(0, end - request.first),
        slices_total=len(meta.slices),
        rows=checked.rows,
        bytes_read=checked.bytes_read,
        unverified=checked.unverified,
        corrupt=found,
        zone_maps_fixed=fixed,
        catalog_fixed=catalog_fixed,
        seconds=time.perf_counter() - started,
    )


class _Checked:
    """What a scrub found, slice by slice."""

    def __init__(self) -> None:
        self.rows = 0
        self.bytes_read = 0
        self.unverified = 0
        self.damaged: list[CorruptSlice] = []
        self.zone_maps: dict[int, tuple[int, dict[str, dict[str, Any]]]] = {}

    def slice(self, store: KeyValueStore, meta: PartitionMeta, number: int, size: int) -> None:
        info = meta.slices[number]
        self.bytes_read += size
        try:
            batch = partitions.read_slice(store, meta, number)
        except CorruptSlice as error:
            self.damaged.append(error)
            return
        self.rows += batch.num_rows
        self.unverified += info.checksums is None
        fresh = zone_map(batch)
        if not agrees(info.zone_map, fresh):
            self.zone_maps[number] = (info.version, fresh)


def agrees(kept: dict[str, dict[str, Any]], fresh: dict[str, dict[str, Any]]) -> bool:
    """Whether everything a kept zone map says of a slice is what its rows say (one written by
    an older quarry may say less: what it leaves out it does not claim)."""
    kept_json, fresh_json = zone_map_to_json(kept), zone_map_to_json(fresh)
    for column, entry in kept_json.items():
        now = fresh_json.get(column)
        if now is None or any(key not in now or now[key] != value for key, value in entry.items()):
            return False
    return True


def _remembered(log: IntegrityLog, errors: list[CorruptSlice]) -> tuple[CorruptCopy, ...]:
    copies = (log.remember(error, FoundBy.SCRUB) for error in errors)
    return tuple(copy for copy in copies if copy is not None)


class _Pace:
    """At most ``bytes_per_s`` (None: no bound): a token bucket without burst."""

    def __init__(self, bytes_per_s: float | None):
        self.bytes_per_s = bytes_per_s
        self.next_free = time.monotonic()

    def take(self, size_bytes: int) -> None:
        if self.bytes_per_s is None:
            return
        now = time.monotonic()
        start = max(now, self.next_free)
        self.next_free = start + size_bytes / self.bytes_per_s
        if start > now:
            time.sleep(start - now)
