"""Writes that mend a damaged copy on its own device (docs/integrity.md).

A slice that fails its checksum is rewritten from a good copy's rows (``rewrite_slice``): the
same rows, so its version stays and its zone map comes out the same. A damaged metadata slice is
replaced by a good copy's (``install_meta``): replicas hold the same slices, so the device keeps
its own values and a scrub then checks them against it. A zone map that disagrees
with rows that check is rewritten from the rows (``set_zone_maps``): a summary is never trusted
over the data it summarises, or an answer would depend on whether it was read. A catalog entry
that fails its check is rebuilt from the metadata slice (``rewrite_catalog``). Each is one
transaction: the metadata slice, its catalog entry and the values change together or not at all.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from quarry.errors import CorruptSlice, KeyNotFound, SchemaMismatch, VersionConflict
from quarry.store import checksum, naming
from quarry.store import partition as partitions
from quarry.store.kv import KeyValueStore


def rewrite_slice(
    store: KeyValueStore,
    domain: str,
    dataset: str,
    partition: int,
    number: int,
    batch: pa.RecordBatch,
    version: int,
) -> int:
    """Slice ``number`` stored again from ``batch``, a good copy's rows of the slice at
    ``version``; its version is kept (the rows are the ones it held). Refused unless the
    metadata slice says the same number of rows, schema and version."""
    key = naming.slice_key(domain, dataset, partition, number)
    with store.transaction() as txn:
        meta = partitions.meta_in(txn, domain, dataset, partition)
        if not 0 <= number < len(meta.slices):
            raise KeyNotFound(
                f"slice {number} of {domain}/{dataset} partition {partition} does not exist"
            )
        old = meta.slices[number]
        if old.version != version:
            raise VersionConflict(
                f"slice {number} of {domain}/{dataset} partition {partition} is at version "
                f"{old.version} here, the good copy at {version}: nothing was written"
            )
        if batch.num_rows != old.rows or not batch.schema.equals(meta.schema):
            raise SchemaMismatch(
                f"the good copy of slice {number} of {domain}/{dataset} partition {partition} "
                f"holds {batch.num_rows} rows of {batch.schema}, this one {old.rows} of "
                f"{meta.schema}: copy the partition whole instead"
            )
        for stale in txn.list(key):  # the damaged value's key-values, however it was cut
            if stale == key or stale.startswith(key + "."):
                txn.delete(stale)
        # in the blocks it had: the same bytes as the good copy's, block checksums and all
        meta.slices[number] = partitions.store_slice(
            txn, key, batch, meta.compression, store.kv_bytes_max, version, old.block_rows
        )
        partitions.put_meta(txn, meta, store.kv_bytes_max)
    return version


def install_meta(
    store: KeyValueStore, domain: str, dataset: str, partition: int, sealed: bytes, device: str
) -> None:
    """Put a good copy's metadata slice (``sealed``, as stored, checked here) in place of this
    device's damaged one, naming this device; its slice values stay as they are."""
    what = f"the good copy of {partitions.meta_what(domain, dataset, partition)}"
    if not checksum.is_sealed(sealed):
        raise CorruptSlice(f"{what}: carries no checksum, so nothing shows it is good")
    meta = partitions.meta_of(sealed, what)
    if (meta.domain, meta.dataset, meta.partition) != (domain, dataset, partition):
        raise CorruptSlice(
            f"{what}: describes partition {meta.partition} of {meta.domain}/{meta.dataset}"
        )
    meta.device = device
    with store.transaction() as txn:
        if not txn.list(naming.partition_prefix(domain, dataset, partition)):
            raise KeyNotFound(f"partition {partition} of {domain}/{dataset} is not on this device")
        partitions.put_meta(txn, meta, store.kv_bytes_max)


def set_zone_maps(
    store: KeyValueStore,
    domain: str,
    dataset: str,
    partition: int,
    zone_maps: dict[int, tuple[int, dict[str, dict[str, Any]]]],
) -> int:
    """Replace the zone maps of some slices (number -> (the version they were computed at,
    the zone map)); a slice updated since keeps its own. Returns how many were replaced."""
    replaced = 0
    with store.transaction() as txn:
        meta = partitions.meta_in(txn, domain, dataset, partition)
        for number, (version, zone_map) in zone_maps.items():
            if number < len(meta.slices) and meta.slices[number].version == version:
                meta.slices[number].zone_map = zone_map
                replaced += 1
        if replaced:
            partitions.put_meta(txn, meta, store.kv_bytes_max)
    return replaced


def rewrite_catalog(store: KeyValueStore, domain: str, dataset: str, partition: int) -> None:
    """The catalog entry (and the metadata slice, unchanged) written again from the metadata
    slice, which must check."""
    with store.transaction() as txn:
        meta = partitions.meta_in(txn, domain, dataset, partition)
        partitions.put_meta(txn, meta, store.kv_bytes_max)


def catalog_agrees(store: KeyValueStore, meta: partitions.PartitionMeta) -> bool:
    """Whether the partition's catalog entry checks and says what its metadata slice says."""
    try:
        entry = partitions.catalog_entry(store, meta.domain, meta.dataset, meta.partition)
    except (CorruptSlice, KeyNotFound):
        return False
    expected = partitions.json_round_trip(meta.summary())
    # an entry written before checksums does not say whether they are kept: they are not
    return {**entry, "verified": expected["verified"]} == expected
