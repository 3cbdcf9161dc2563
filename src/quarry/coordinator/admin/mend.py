"""Damaged copies mended from good ones (DESIGN §2a, "Integrity"; docs/integrity.md).

Each device remembers the damaged copies it met (a query's read, a scrub) until they are
mended. ``mend`` takes them from every device that answers and mends each from a good copy on
another replica: a slice is read from a holder (which checks it as it reads) and written over
the damaged one with the same rows and version (``RepairSlice``), so one bad slice costs one
slice's copy, not a partition's. A damaged metadata slice is replaced by a holder's good one
(``RepairMeta``, its stored value, checksum and all): replicas hold the same slices, so the
device keeps its own values and scrubs them against it at once, and any that do not check are
mended in turn. A catalog entry is rebuilt by its own device from its metadata slice (a scrub
of no slices does it). With no good copy
anywhere (replicas 1, or every copy damaged) a copy is left as it is and reported: what it
still holds stays readable, slice by slice, and nothing damaged is ever an answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from quarry.coordinator.membership.device_client import DeviceClient, finish_put
from quarry.errors import CorruptSlice, DeviceUnavailable, QuarryError
from quarry.protocol.control import Version
from quarry.protocol.integrity import (
    CopyPart,
    CorruptCopy,
    Integrity,
    IntegrityReply,
    RepairMeta,
    RepairSlice,
    Scrub,
    ScrubReply,
)
from quarry.records import Record
from quarry.store import checksum, codec, naming

if TYPE_CHECKING:
    from quarry.coordinator.membership.membership import Membership


@dataclass(frozen=True)
class Mended(Record):
    """A damaged copy made good: how, and from which device's copy ("" for its own)."""

    copy: CorruptCopy
    how: str
    source: str = ""


@dataclass(frozen=True)
class Unmended(Record):
    """A damaged copy left as it is, and why (no good copy anywhere, its device down...)."""

    copy: CorruptCopy
    error: str


def damaged_copies(cluster: Membership) -> list[CorruptCopy]:
    """Every damaged copy the devices that answer remember, in the order they were found."""
    held = cluster.each(integrity_of)
    replies = [reply for reply in held.values() if isinstance(reply, IntegrityReply)]
    copies = [copy for reply in replies for copy in reply.corrupt]
    return sorted(copies, key=lambda c: c.found_at)


def integrity_of(client: DeviceClient) -> IntegrityReply | None:
    """What a device remembers of its damaged copies (None: it keeps no such account, a
    storage server, whose drives do)."""
    try:
        return client.ask(Integrity(), IntegrityReply)
    except DeviceUnavailable:
        raise
    except QuarryError:
        return None


def mend(
    cluster: Membership, copies: list[CorruptCopy], take: Callable[[int], None]
) -> tuple[list[Mended], list[Unmended]]:
    """Mend each copy from a good one; ``take(bytes)`` paces the slices copied. A metadata
    slice mended may show slices of that copy that do not check against it: mended too."""
    mended, unmended = [], []
    waiting = list(copies)
    seen = {copy.key for copy in waiting}
    while waiting:
        copy = waiting.pop(0)
        try:
            done, more = _mend_one(cluster, copy, take)
            mended.append(done)
        except QuarryError as error:
            unmended.append(Unmended(copy, str(error)))
            continue
        fresh = [c for c in more if c.key not in seen]
        seen.update(c.key for c in fresh)
        waiting.extend(fresh)
    return mended, unmended


def _mend_one(
    cluster: Membership, copy: CorruptCopy, take: Callable[[int], None]
) -> tuple[Mended, tuple[CorruptCopy, ...]]:
    """One copy mended; and the damaged copies that mending it brought to light."""
    if copy.device in cluster.down or copy.device not in cluster.devices:
        raise DeviceUnavailable(f"device {copy.device} does not answer")
    device = cluster.devices[copy.device]
    if copy.part is CopyPart.CATALOG:
        device.ask(Scrub(copy.domain, copy.dataset, copy.partition, 0, 0), ScrubReply)
        return Mended(copy, "catalog entry rebuilt from its metadata slice"), ()
    holders = _other_holders(cluster, copy)
    if copy.part is CopyPart.METADATA:
        source, sealed = _good_metadata(holders, copy)
        take(len(sealed))
        request = RepairMeta(copy.domain, copy.dataset, copy.partition)
        checked = device.ask(request, ScrubReply, payload=sealed)
        return Mended(
            copy, "metadata slice replaced by a good copy's", source.name
        ), checked.corrupt
    errors = []
    for holder in holders:
        try:
            _copy_slice(holder, device, copy, take)
            return Mended(copy, "slice rewritten from a good copy", holder.name), ()
        except (CorruptSlice, DeviceUnavailable) as error:
            errors.append(str(error))
    raise CorruptSlice(
        f"no other replica holds a good copy of {_named(copy)} "
        f"({'; '.join(errors) or 'it has none'}): it is kept, what of it still checks stays "
        "readable; ingest the dataset again to restore it"
    )


def _named(copy: CorruptCopy) -> str:
    whats = {CopyPart.SLICE: f"slice {copy.slice}", CopyPart.METADATA: "the metadata slice"}
    what = whats.get(copy.part, "the catalog entry")
    return f"{what} of partition {copy.partition} of {copy.qualified} on device {copy.device}"


def _other_holders(cluster: Membership, copy: CorruptCopy) -> list[DeviceClient]:
    """The devices that answer and hold the partition, but for the damaged copy's own."""
    entry = cluster.catalog.get(copy.qualified)
    partition = (
        None
        if entry is None
        else next((p for p in entry.partitions if p.partition == copy.partition), None)
    )
    if partition is None:
        return []
    return [
        cluster.devices[name]
        for name in partition.devices
        if name != copy.device and name not in cluster.down
    ]


def _good_metadata(holders: list[DeviceClient], copy: CorruptCopy) -> tuple[DeviceClient, bytes]:
    """A holder whose metadata slice of the partition checks, and that slice as stored."""
    errors = []
    key = naming.meta_key(copy.domain, copy.dataset, copy.partition)
    what = f"the metadata slice of partition {copy.partition} of {copy.qualified}"
    for holder in holders:
        try:
            keys = [k for k in holder.kv_list(key) if k == key or k.startswith(key + ".")]
            sealed = codec.unstripe([holder.kv_get(k)[0] for k in sorted(keys)])
            if not checksum.unseal(sealed, f"{what} on device {holder.name}")[1]:
                raise CorruptSlice(f"{what} on device {holder.name} carries no checksum")
            return holder, sealed
        except QuarryError as error:  # damaged there too, not there, or not answering
            errors.append(str(error))
    raise CorruptSlice(
        f"no other replica holds a good copy of partition {copy.partition} of {copy.qualified}"
        f" ({'; '.join(errors) or 'it has none'}): the damaged one on {copy.device} is kept, "
        "what of it still checks stays readable; ingest the dataset again to restore it"
    )


def _copy_slice(
    holder: DeviceClient, device: DeviceClient, copy: CorruptCopy, take: Callable[[int], None]
) -> None:
    """The holder's slice (checked as it reads it) written over the damaged one."""
    assert copy.slice is not None
    description = holder.describe(copy.domain, copy.dataset, copy.partition)
    version = description.slices[copy.slice].version
    end = copy.slice + 1
    reader = holder.scan(copy.domain, copy.dataset, copy.partition, first=copy.slice, end=end)
    batches = list(holder.batches(reader))
    take(sum(pa.ipc.get_record_batch_size(b) for b in batches))
    request = RepairSlice(copy.domain, copy.dataset, copy.partition, copy.slice, version)
    writer, reader_ = device.open_put(request, description.summary.schema)
    for part in batches:
        device.guard(lambda part=part: writer.write_batch(part))
    Version.from_bytes(device.guard(lambda: finish_put(writer, reader_)))
