"""Ingest under faults: a device dies while rows stream, once its partition is durable, or when
asked to commit; the coordinator dies at random moments. Afterwards every dataset is complete
or absent on every device, no pending partition outlives its lease, and the name can be
ingested again, with no device restarted to clean up."""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import sys
import textwrap
import time

import pyarrow as pa
import pytest

import quarry
from quarry.errors import QuarryError
from quarry.samples import particles
from quarry.settings import FAULT_FILE, INGEST_LEASE_S

ROUNDS = 10
LEASE_S = 2.0  # short leases, so that what a coordinator left behind goes within seconds
SETTLE_S_MAX = 30.0
ROWS = 200_000


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ingest-faults")
    fault_file = folder / "fault"
    fault_file.write_text("")
    # set for the whole module (monkeypatch is per test), and put back after
    saved = {k: os.environ.get(k) for k in (FAULT_FILE.name, INGEST_LEASE_S.name)}
    os.environ[FAULT_FILE.name] = str(fault_file)
    os.environ[INGEST_LEASE_S.name] = str(LEASE_S)
    try:
        with quarry.local(devices=3, data=folder / "cluster") as cluster:
            yield cluster, fault_file
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _settled(cluster) -> None:
    """Wait until no device holds anything pending (the lease, then a janitor pass) or still
    reads rows of a coordinator that died (they may arrive after it is gone)."""
    deadline = time.monotonic() + SETTLE_S_MAX
    while any(_busy(client.stats()) for client in cluster.live_devices()):
        assert time.monotonic() < deadline, "pending partitions outlived their lease"
        time.sleep(0.2)


def _busy(stats) -> bool:
    return bool(stats.pending_partitions or stats.ingesting)


def _complete_or_absent(cluster, dataset: str, table: pa.Table) -> str:
    """Every device agrees: the dataset is whole (and reads back) or nowhere."""
    cluster.refresh()
    domain, name = dataset.split("/")
    held = [
        summary
        for client in cluster.live_devices()
        for summary in client.inventory()
        if (summary.domain, summary.dataset) == (domain, name)
    ]
    if dataset not in cluster.catalog:
        assert held == [], f"{dataset} is not listed but devices hold {len(held)} partitions"
        return "absent"
    entry = cluster.entry(dataset)
    assert not entry.unavailable
    assert all(len(p.devices) == 2 for p in entry.partitions)  # every replica committed
    back = cluster.scan(dataset).read_all().sort_by("id")
    assert back.equals(table.sort_by("id"))
    return "complete"


def _again(cluster, dataset: str, table: pa.Table, state: str) -> None:
    if state == "complete":
        cluster.drop(dataset)
    cluster.ingest(table, dataset, replicas=2)
    assert _complete_or_absent(cluster, dataset, table) == "complete"


@pytest.mark.slow
def test_a_device_dying_at_any_phase_of_an_ingest(faulty):
    cluster, fault_file = faulty
    rng = random.Random(5)
    table = particles.table(ROWS, seed=2)
    states = []
    for round_number in range(ROUNDS):
        phase = ("stream", "prepare", "commit")[round_number % 3]
        # commit rounds go round the devices: the ingest's decider once, others the other times
        victim = f"dev{round_number // 3 % 3}" if phase == "commit" else f"dev{rng.randrange(3)}"
        dataset = f"faults/round{round_number}"
        if phase == "stream":
            batches = iter(table.to_batches(max_chunksize=10_000))

            def source(victim=victim, batches=batches):
                for index, batch in enumerate(batches):
                    if index == 5:
                        cluster.kill_device(victim)
                    yield batch

            reader = pa.RecordBatchReader.from_batches(table.schema, source())
            with pytest.raises(QuarryError):
                cluster.ingest(reader, dataset, replicas=2)
        else:
            fault_file.write_text(f"{victim}:{phase}")
            # a failed ingest, or a committed one not visible while its device is down
            with contextlib.suppress(QuarryError):
                cluster.ingest(table, dataset, replicas=2)
            fault_file.write_text("")
            deadline = time.monotonic() + 10
            while cluster.processes[victim].poll() is None:  # a fault may hit no partition
                if time.monotonic() > deadline:
                    cluster.kill_device(victim)
                time.sleep(0.05)
        cluster.restart_device(victim)
        _settled(cluster)
        state = _complete_or_absent(cluster, dataset, table)
        states.append((phase, state))
        _again(cluster, dataset, table, state)
    print("ingest rounds (phase, outcome):", states)
    assert ("stream", "absent") in states and ("prepare", "absent") in states
    # a device lost at commit after the decider committed: the ingest stands, and the device
    # commits its part when it is back
    assert ("commit", "complete") in states


@pytest.mark.slow
def test_the_coordinator_dying_at_random_moments(faulty):
    cluster, _ = faulty
    rng = random.Random(9)
    table = particles.table(ROWS, seed=3)
    # a moment drawn from each quarter of the stream, and one past its end (between phases):
    # every stretch of the ingest is hit in five rounds (ten random moments did not promise it)
    batches = ROWS // 10_000
    stretches = [(i * batches // 4, (i + 1) * batches // 4) for i in range(4)]
    moments = [rng.randrange(*stretch) for stretch in stretches] + [batches + 1]
    for round_number, kill_after in enumerate(moments):
        dataset = f"orphans/round{round_number}"
        script = textwrap.dedent(f"""
            import os, signal, pyarrow as pa, quarry
            from quarry.samples import particles
            c = quarry.connect({str(cluster.cluster_file)!r})
            table = particles.table({ROWS}, seed=3)
            def source():
                for i, batch in enumerate(table.to_batches(max_chunksize=10_000)):
                    if i == {kill_after}:
                        os.kill(os.getpid(), signal.SIGKILL)
                    yield batch
                os.kill(os.getpid(), signal.SIGKILL)  # between phases, or none
            c.ingest(pa.RecordBatchReader.from_batches(table.schema, source()), {dataset!r},
                     replicas=2)
        """)
        done = subprocess.run([sys.executable, "-c", script], timeout=120)
        assert done.returncode == -9
        _settled(cluster)  # no restart: the leases run out, the devices clean up
        state = _complete_or_absent(cluster, dataset, table)
        assert state == "absent"  # it never got to commit
        _again(cluster, dataset, table, state)
