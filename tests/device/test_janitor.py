"""Pending ingests settle on the device, as their decider says, with no restart."""

from __future__ import annotations

import time

import pyarrow as pa

from quarry.device.janitor import resolve
from quarry.protocol.ingest import Outcome
from quarry.store import partition as partitions
from quarry.store.kv import KeyValueStore

TABLE = pa.table({"k": pa.array(range(1000), pa.int64())})


def _pending(store: KeyValueStore, ingest_id: str, decider: str, lease_s: float) -> None:
    record = {
        "id": ingest_id,
        "first_partition": 0,
        "partitions": 1,
        "replicas": 2,
        "mode": "create",
        "created_at": 0.0,
        "decider": decider,
        "addresses": {"dev0": "grpc://decider", "dev1": "grpc://other"},
    }
    meta = partitions.PartitionMeta("d", "t", 0, record, TABLE.schema, "none")
    writer = partitions.PartitionWriter(store, meta, lease_s=lease_s)
    writer.write(TABLE.to_batches()[0])
    writer.finish()


def _store(tmp_path, name: str) -> KeyValueStore:
    return KeyValueStore(tmp_path / name, kv_bytes_max=64 * 1024)


def test_a_live_lease_is_left_alone(tmp_path):
    store = _store(tmp_path, "a")
    _pending(store, "i1", "dev0", lease_s=60)
    asked = []
    assert resolve(store, "dev1", startup=False, ask=lambda a, i: asked.append(a)) == {}
    assert asked == [] and partitions.pending_ingests(store)


def test_a_participant_commits_what_the_decider_committed(tmp_path):
    store = _store(tmp_path, "a")
    _pending(store, "i1", "dev0", lease_s=0.1)
    time.sleep(0.2)
    settled = resolve(store, "dev1", startup=False, ask=lambda a, i: Outcome.COMMIT)
    assert settled == {"i1": "committed"}
    assert partitions.read_meta(store, "d", "t", 0).rows == 1000


def test_a_participant_waits_while_the_decider_is_down_or_still_pending(tmp_path):
    store = _store(tmp_path, "a")
    _pending(store, "i1", "dev0", lease_s=60)
    for answer in (None, Outcome.PENDING):
        assert resolve(store, "dev1", startup=True, ask=lambda a, i, x=answer: x) == {}
    assert partitions.pending_ingests(store)
    assert resolve(store, "dev1", startup=True, ask=lambda a, i: Outcome.ABORT) == {"i1": "aborted"}
    assert partitions.pending_ingests(store) == {}


def test_the_decider_aborts_what_its_coordinator_left_behind(tmp_path):
    store = _store(tmp_path, "a")
    _pending(store, "i1", "dev0", lease_s=60)
    assert partitions.outcome(store, "i1", time.time()) == "pending"  # coordinator alive
    assert partitions.outcome(store, "i1", time.time() + 120) == "abort"  # lease ran out
    assert partitions.pending_ingests(store) == {}
    # a coordinator that comes back late finds nothing to commit: it aborts everywhere
    assert partitions.commit(store, "i1", "dev0") == []
    assert partitions.outcome(store, "i1", time.time()) == "abort"


def test_renewing_keeps_a_lease_alive(tmp_path):
    store = _store(tmp_path, "a")
    _pending(store, "i1", "dev0", lease_s=0.2)
    assert partitions.renew(store, "i1", lease_s=60) == 1
    time.sleep(0.3)
    assert resolve(store, "dev0", startup=False) == {}  # the decider itself: still pending
