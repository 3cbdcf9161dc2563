"""The silence bound's parts without devices: the channel's figures, what counts as silence, the
heartbeat's word to the membership, a check that does not wait on a silent device, commits a
device missed, and which replica serves a partition."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from types import SimpleNamespace

import pyarrow as pa
import pytest
from pyarrow import flight

from quarry import settings
from quarry.coordinator.membership import catalog
from quarry.coordinator.membership.freshness import CatalogCheck, CatalogState
from quarry.coordinator.membership.liveness import Heartbeat, Liveness, is_silence
from quarry.coordinator.query.planning import serving
from quarry.errors import DeviceSilent, DeviceUnavailable
from quarry.protocol.control import IngestRecord, LoadStatus, PartitionSummary, PulseReply

SCHEMA = pa.schema([("id", pa.int64())])


def test_the_channel_s_figures_add_up_to_the_bound(monkeypatch):
    monkeypatch.setenv(settings.DEVICE_SILENCE_S.name, "5")
    liveness = Liveness.configured()
    assert liveness.keepalive_ms + liveness.keepalive_timeout_ms == 5000
    assert liveness.heartbeat_period_s * 2 <= liveness.keepalive_ms / 1000
    options = dict(liveness.channel_options())
    assert options["grpc.keepalive_time_ms"] == 2000
    assert options["grpc.keepalive_timeout_ms"] == 3000
    assert options["grpc.http2.max_pings_without_data"] == 0


def test_silence_is_told_from_a_refusal():
    assert is_silence(flight.FlightTimedOutError("Deadline Exceeded"))
    cut = "Stream removed (recvmsg:Connection timed out)"  # TCP_USER_TIMEOUT, a cut link
    assert is_silence(flight.FlightUnavailableError(cut))
    assert is_silence(flight.FlightUnavailableError("keepalive watchdog timeout"))
    assert not is_silence(flight.FlightUnavailableError("failed to connect: Connection refused"))
    silent = Liveness(5.0).silent("dev1", "grpc+tls://10.0.0.2:1")
    assert isinstance(silent, DeviceSilent) and isinstance(silent, DeviceUnavailable)
    assert "dev1" in str(silent) and settings.DEVICE_SILENCE_S.name in str(silent)


class _Reader:
    """A heartbeat stream that gives ``beats`` batches, then fails with ``error``."""

    def __init__(self, beats: int, error: BaseException | None):
        self.beats, self.error = beats, error
        self.cancelled = threading.Event()

    def read_chunk(self):
        if self.beats:
            self.beats -= 1
            return None
        if self.error is None:
            self.cancelled.wait(5)
            raise flight.FlightCancelledError("cancelled")
        raise self.error

    def cancel(self):
        self.cancelled.set()


def test_the_heartbeat_tells_when_a_device_goes_silent_and_comes_back():
    silence = flight.FlightUnavailableError("Stream removed (keepalive watchdog timeout)")
    readers = iter([_Reader(2, silence), _Reader(1, None)])
    heard: list[tuple[str, bool]] = []

    class Listener:
        def heard(self, name: str, silent: bool) -> None:
            heard.append((name, silent))

    listener = Listener()
    heartbeat = Heartbeat("dev1", lambda: next(readers), Liveness(1.0))
    heartbeat.listen(listener.heard)
    heartbeat.ensure()
    deadline = time.monotonic() + 10
    while heard != [("dev1", True), ("dev1", False)] and time.monotonic() < deadline:
        time.sleep(0.01)
    heartbeat.stop()
    assert heard == [("dev1", True), ("dev1", False)]
    assert heartbeat.beats == 3 and heartbeat.opened == 2 and not heartbeat.silent


def test_a_check_does_not_wait_on_a_device_down_for_silence():
    state = CatalogState(3, {}, {}, {"dev1": "silent"}, {"dev0": "g0"}, frozenset({"dev1"}))
    answered: Future = Future()
    answered.set_result(PulseReply("g0", LoadStatus(0.0, 0.0, 0.0)))
    never: Future = Future()  # the silent device's pulse: it would wait out the bound
    cluster = SimpleNamespace(state=state, loads_seen=lambda loads: None, refresh=None)
    started = time.perf_counter()
    assert CatalogCheck(cluster, state, {"dev0": answered, "dev1": never}).holds()
    assert time.perf_counter() - started < 0.5


def _summary(partition: int, record: IngestRecord, rows: int = 100) -> PartitionSummary:
    return PartitionSummary(
        domain="t",
        dataset="d",
        partition=partition,
        ingest=record,
        schema=SCHEMA,
        rows=rows,
        slices=1,
        bytes_stored=rows * 8,
    )


def test_a_commit_a_device_missed_is_found_only_where_the_decider_committed():
    placement = {"0": ["dev0", "dev1"], "1": ["dev1", "dev2"]}
    record = IngestRecord(id="i1", first_partition=0, partitions=2, replicas=2,
                          placement=placement, decider="dev0")  # fmt: skip
    inventories = {
        "dev0": [_summary(0, record)],
        "dev1": [],  # cut off when the commit was sent: its partitions are pending
        "dev2": [_summary(1, record)],
    }
    assert catalog.missed_commits(inventories) == {"dev1": {"i1"}}
    undecided = {"dev0": [], "dev1": [], "dev2": [_summary(1, record)]}
    assert catalog.missed_commits(undecided) == {}  # the decider holds it pending: wait
    assert catalog.missed_commits({"dev0": [_summary(0, record)]}) == {}  # dev1 is not asked


def test_replicas_are_listed_in_placement_order_and_serve_evenly():
    placement = {str(p): ["dev0", "dev1"] if p % 2 else ["dev1", "dev0"] for p in range(4)}
    placement["4"] = ["dev0", "dev2"]
    record = IngestRecord(id="i1", first_partition=0, partitions=5, replicas=2,
                          placement=placement, decider="dev1")  # fmt: skip
    inventories: dict[str, list[PartitionSummary]] = {}
    for partition, devices in placement.items():
        for device in devices:
            inventories.setdefault(device, []).append(_summary(int(partition), record))
    (entry,) = catalog.build(inventories).values()
    assert [p.devices for p in entry.partitions] == [placement[str(p)] for p in range(5)]
    cluster = SimpleNamespace(devices={"dev0": 0, "dev1": 0, "dev2": 0}, down={})
    served = serving(cluster, entry)
    counts = {name: list(served.values()).count(name) for name in cluster.devices}
    assert max(counts.values()) - min(counts.values()) <= 1, served
    assert serving(cluster, entry) == served  # the same catalog, the same answer
    cluster.down = {"dev0": "silent"}
    assert "dev0" not in serving(cluster, entry).values()
    cluster.down = {"dev0": "silent", "dev2": "silent"}
    with pytest.raises(DeviceUnavailable, match="partition 4 of t/d"):
        serving(cluster, entry)


def test_a_replica_with_nothing_to_serve_is_found_along_a_chain():
    """Greedy alone left dev2 idle and dev1 with two partitions: only moving partition 0 to
    dev2 and then partition 3 to dev3 evens them (tests/integration/test_failover.py kills dev2
    and must see it at work)."""
    holders = [["dev3", "dev2"], ["dev0", "dev2"], ["dev0", "dev1"], ["dev3", "dev1"]]
    sizes = [10_547_880, 10_547_880, 9_648_504, 9_493_784]
    partitions = [
        SimpleNamespace(partition=n, devices=d, bytes_stored=b)
        for n, (d, b) in enumerate(zip(holders, sizes, strict=True))
    ]
    entry = SimpleNamespace(partitions=partitions, qualified="physics/particles")
    cluster = SimpleNamespace(devices=dict.fromkeys(["dev0", "dev1", "dev2", "dev3"]), down={})
    assert sorted(serving(cluster, entry).values()) == ["dev0", "dev1", "dev2", "dev3"]
