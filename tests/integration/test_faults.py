"""Faults with real device processes: dead devices, value limits, races, crashes mid-ingest."""

import os
import subprocess
import sys
import textwrap
import threading
import time

import pyarrow as pa
import pytest

import quarry
from quarry import protocol
from quarry.coordinator.membership.cluster_file import DeviceSpec
from quarry.coordinator.membership.device_client import DeviceClient
from quarry.coordinator.membership.membership import client_of
from quarry.errors import (
    DeviceUnavailable,
    IngestFailed,
    ProtocolMismatch,
    UnknownProfile,
    ValueTooLarge,
    VersionConflict,
)
from quarry.samples import particles


def test_unknown_profile():
    with (
        pytest.raises(UnknownProfile, match="unknown profile 'floppy'.*kinetic"),
        quarry.local(devices=1, profile="floppy"),
    ):
        pass


def test_device_address_that_does_not_answer():
    client = DeviceClient("ghost", "grpc://127.0.0.1:9")
    with pytest.raises(
        DeviceUnavailable, match="device ghost at grpc://127.0.0.1:9 does not answer"
    ):
        client.hello()


def test_cluster_with_a_dead_address_lists_it_down(cluster):
    spec = [*cluster.specs, DeviceSpec("ghost", "grpc://127.0.0.1:9")]
    other = quarry.Cluster(spec)
    try:
        assert "ghost" in other.down
        status = {row.device: row for row in other.status()}
        assert status["ghost"].up is False and status["dev0"].up is True
        assert "does not answer" in status["ghost"].to_json()["error"]
    finally:
        other.close()


def test_value_over_the_limit(cluster):
    client = cluster.devices["dev0"]
    limit = client.hello().profile.kv_bytes_max
    with pytest.raises(ValueTooLarge, match=f"over this device's limit of {limit} bytes"):
        client.kv_put("~test/big", b"\0" * (limit + 1))
    assert client.kv_list("~test/big") == []


def test_protocol_version_mismatch(cluster, monkeypatch):
    spoken = protocol.frame.PROTOCOL_VERSION
    monkeypatch.setattr(protocol.frame, "PROTOCOL_VERSION", 99)  # a client from another release
    with pytest.raises(
        ProtocolMismatch, match=f"client speaks quarry protocol 99, this device speaks {spoken}"
    ):
        cluster.devices["dev0"].hello()


def test_two_concurrent_updates_of_one_slice(cluster):
    table = pa.table({"k": pa.array(range(1000), pa.int64())})
    cluster.ingest(table, "race/one", partitions=1)
    entry = cluster.entry("race/one")
    device = cluster.devices[entry.partitions[0].devices[0]]
    described = device.describe("race", "one", 0)
    version = described.slices[0].version
    keys_before = {k: device.kv_get(k) for k in device.kv_list("race/one/")}
    outcomes: list[object] = []
    barrier = threading.Barrier(2)

    def update(value: int) -> None:
        spec = next(s for s in cluster.specs if s.name == device.name)
        client = client_of(spec)  # two independent writers
        batch = pa.record_batch({"k": pa.array([value] * 10, pa.int64())})
        barrier.wait()
        try:
            outcomes.append((value, client.update_slice("race", "one", 0, 0, batch, version)))
        except VersionConflict as error:
            outcomes.append(error)

    threads = [threading.Thread(target=update, args=(v,)) for v in (111, 222)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wins = [o for o in outcomes if isinstance(o, tuple)]
    losses = [o for o in outcomes if isinstance(o, VersionConflict)]
    assert len(wins) == 1 and len(losses) == 1
    assert "another writer updated it first; nothing was written" in str(losses[0])
    winner = wins[0][0]
    assert cluster.scan("race/one").read_all().column("k").to_pylist() == [winner] * 10
    keys_after = {k: device.kv_get(k) for k in device.kv_list("race/one/")}
    assert keys_after.keys() == keys_before.keys()  # same slice keys, the winner's content
    cluster.drop("race/one")


def _key_counts(cluster) -> dict[str, int]:
    return {name: client.stats().keys for name, client in cluster.devices.items()}


@pytest.mark.slow
def test_device_killed_during_ingest():
    with quarry.local(devices=3) as c:
        before = _key_counts(c)
        sent = 0

        def source():
            nonlocal sent
            for batch in particles.batches(3_000_000, batch_rows=100_000):
                sent += 1
                if sent == 8:
                    c.kill_device("dev1")
                yield batch

        reader = pa.RecordBatchReader.from_batches(particles.SCHEMA, source())
        with pytest.raises((IngestFailed, DeviceUnavailable), match="dev1"):
            c.ingest(reader, "physics/killed")
        assert "physics/killed" not in {d.dataset for d in c.datasets()}
        c.restart_device("dev1")
        assert "physics/killed" not in {d.dataset for d in c.datasets()}
        assert _key_counts(c) == before
        assert all(client.stats().pending_partitions == 0 for client in c.devices.values())


@pytest.mark.slow
def test_coordinator_killed_during_ingest_leaves_nothing(tmp_path):
    """The ingesting process dies mid-stream: nothing is visible, and the devices clean up when
    its lease runs out, with no restart; the name can be ingested again."""
    with quarry.local(devices=2, data=tmp_path / "cluster") as c:
        before = _key_counts(c)
        script = textwrap.dedent(f"""
            import os, signal, pyarrow as pa, quarry
            from quarry.samples import particles
            c = quarry.connect({str(c.cluster_file)!r})
            def source():
                for i, batch in enumerate(particles.batches(2_000_000, batch_rows=100_000)):
                    if i == 6:
                        os.kill(os.getpid(), signal.SIGKILL)
                    yield batch
            reader = pa.RecordBatchReader.from_batches(particles.SCHEMA, source())
            c.ingest(reader, "physics/orphan")
        """)
        environment = {**os.environ, "QUARRY_INGEST_LEASE_S": "2"}
        done = subprocess.run([sys.executable, "-c", script], timeout=120, env=environment)
        assert done.returncode == -9
        assert "physics/orphan" not in {d.dataset for d in c.datasets()}
        deadline = time.monotonic() + 20  # the lease, then a janitor pass
        # rows of the dead process may still arrive after it is gone: ``ingesting`` counts them
        while any(
            s.pending_partitions or s.ingesting for s in (cl.stats() for cl in c.devices.values())
        ):
            assert time.monotonic() < deadline, "pending partitions outlived their lease"
            time.sleep(0.2)
        assert _key_counts(c) == before
        assert "physics/orphan" not in {d.dataset for d in c.datasets()}
        c.ingest(particles.reader(100_000), "physics/orphan")  # the name is free again


def test_a_small_table_lives_on_one_device_and_is_missed_by_name_when_it_is_down(tmp_path):
    """A table that fills one row group is one partition (a stream per device costs more than
    its scan gains); with its device down, asking for it names the devices that may hold it."""
    from quarry.errors import QueryError

    with quarry.local(devices=3, data=tmp_path / "cluster") as cluster:
        entry = cluster.ingest(pa.table({"k": pa.array(range(1_000), pa.int64())}), "t/small")
        assert len(entry.partitions) == 1
        (holder,) = {d for p in entry.partitions for d in p.devices}
        assert cluster.sql("SELECT sum(k) AS s FROM t.small").read_all().to_pylist() == [
            {"s": 499_500}
        ]
        cluster.kill_device(holder)
        with pytest.raises(QueryError, match=f"{holder} do not answer: they may hold it"):
            cluster.sql("SELECT sum(k) AS s FROM t.small").read_all()


@pytest.mark.slow
def test_a_dataset_with_a_device_down_is_marked_and_a_smaller_up_is_refused(tmp_path):
    from quarry.errors import ClusterError

    folder = tmp_path / "cluster"
    with quarry.local(devices=3, data=folder) as cluster:
        cluster.ingest(
            pa.table({"k": pa.array(range(30_000), pa.int64())}), "t/three", partitions=3
        )
        cluster.kill_device("dev2")
        command = [sys.executable, "-m", "quarry", "datasets", "--cluster"]
        shown = subprocess.run(
            [*command, str(cluster.cluster_file)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "COLUMNS": "250"},
        ).stdout
        assert "(partial)" in shown and "only on dev2, which do not answer" in shown, shown
    with pytest.raises(ClusterError, match="dev2, which 2 device"), quarry.local(2, data=folder):
        pass
