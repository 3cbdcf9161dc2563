"""A device scrubbing its own slices: damage found and remembered until it is mended, a zone map
that disagrees with rows that check rewritten from the rows, at a bounded rate."""

from __future__ import annotations

import time

import pytest

from quarry.device.emulation import Emulator
from quarry.device.integrity import IntegrityLog
from quarry.device.profile import get_profile
from quarry.device.scrub import agrees, scrub
from quarry.errors import CorruptSlice
from quarry.protocol.integrity import CopyPart, FoundBy, Scrub
from quarry.store import checksum, mend, naming
from quarry.store import partition as partitions
from tests.store.test_checksum import _stored


@pytest.fixture
def device(tmp_path):
    store = _stored(tmp_path / "kv")
    return store, Emulator(get_profile("host")), IntegrityLog(tmp_path, "dev0")


def test_a_clean_partition_scrubs_clean(device):
    store, emulator, log = device
    reply = scrub(store, emulator, Scrub("d", "n", 0), log)
    meta = partitions.read_meta(store, "d", "n", 0)
    assert reply.slices == reply.slices_total == len(meta.slices)
    assert reply.rows == 20_000 and not reply.corrupt and not reply.zone_maps_fixed
    assert reply.bytes_read == meta.bytes_stored and reply.unverified == 0
    assert log.held().corrupt == ()


def test_damage_is_found_remembered_and_forgotten_once_mended(device, tmp_path):
    store, emulator, log = device
    meta = partitions.read_meta(store, "d", "n", 0)
    good = partitions.read_slice(store, meta, 1)
    key = naming.slice_key("d", "n", 0, 1)
    value = bytearray(store.get(key)[0])
    value[-30] ^= 0x04
    store.put(key, bytes(value))
    reply = scrub(store, emulator, Scrub("d", "n", 0), log)
    (copy,) = reply.corrupt
    assert (copy.part, copy.slice, copy.device, copy.found_by) == (
        CopyPart.SLICE,
        1,
        "dev0",
        FoundBy.SCRUB,
    )
    assert reply.slices == len(meta.slices) and reply.rows == 20_000 - meta.slices[1].rows
    assert IntegrityLog(tmp_path, "dev0").held().corrupt == (copy,)  # kept across a restart
    mend.rewrite_slice(store, "d", "n", 0, 1, good, version=1)
    assert not scrub(store, emulator, Scrub("d", "n", 0), log).corrupt
    assert log.held().corrupt == ()


def test_a_zone_map_that_disagrees_with_its_rows_is_rewritten_from_them(device):
    store, emulator, log = device
    meta = partitions.read_meta(store, "d", "n", 0)
    wrong = {**meta.slices[0].zone_map, "v": {**meta.slices[0].zone_map["v"], "max": 2.0}}
    assert not agrees(wrong, meta.slices[0].zone_map)
    mend.set_zone_maps(store, "d", "n", 0, {0: (1, wrong)})  # written wrong, checksum and all
    assert partitions.read_meta(store, "d", "n", 0).slices[0].zone_map["v"]["max"] == 2.0
    reply = scrub(store, emulator, Scrub("d", "n", 0), log)
    assert reply.zone_maps_fixed == 1 and not reply.corrupt
    assert partitions.read_meta(store, "d", "n", 0).slices[0].zone_map["v"]["max"] == 1.0


def test_a_damaged_metadata_slice_and_catalog_entry(device):
    store, emulator, log = device
    catalog = partitions._catalog_key("d", "n", 0)
    store.put(catalog, store.get(catalog)[0][:-1])
    reply = scrub(store, emulator, Scrub("d", "n", 0, 0, 0), log)
    assert reply.catalog_fixed and reply.slices == 0
    assert partitions.catalog_entry(store, "d", "n", 0)["rows"] == 20_000
    key = naming.meta_key("d", "n", 0)
    good = store.get(key)[0]
    store.put(key, good[:-1])
    reply = scrub(store, emulator, Scrub("d", "n", 0), log)
    assert reply.slices_total == 0 and [c.part for c in reply.corrupt] == [CopyPart.METADATA]
    with pytest.raises(CorruptSlice, match="no checksum"):
        mend.install_meta(store, "d", "n", 0, good[checksum.SEAL_BYTES :], "dev0")
    mend.install_meta(store, "d", "n", 0, good, "dev0")  # a replica's: the same slices
    assert not scrub(store, emulator, Scrub("d", "n", 0), log).corrupt
    assert log.held().corrupt == ()


def test_a_scrub_keeps_to_its_rate(device):
    store, emulator, log = device
    meta = partitions.read_meta(store, "d", "n", 0)
    rate = meta.bytes_stored / 0.4  # every slice in about 0.4 s
    started = time.perf_counter()
    scrub(store, emulator, Scrub("d", "n", 0, bytes_per_s=rate), log)
    last = meta.slices[-1].bytes_stored / rate  # a bucket without burst waits before a slice
    assert time.perf_counter() - started >= 0.4 - last - 0.05


def test_a_read_that_meets_damage_is_remembered_naming_the_device(device):
    store, emulator, log = device
    error = log.found(CorruptSlice("slice 4 of partition 0 of d/n: column v: checksum mismatch"))
    assert error.device == "dev0" and "on device dev0" in str(error)
    (copy,) = log.held().corrupt
    assert copy.slice == 4 and copy.found_by is FoundBy.READ
    log.found(CorruptSlice("slice 4 of partition 0 of d/n on device dev0: again"))
    assert len(log.held().corrupt) == 1  # the same copy, once
    log.dropped("d", "n")  # the dataset dropped: nothing of it left to mend
    assert log.held().corrupt == ()
