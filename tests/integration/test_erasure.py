"""Erasure-coded datasets (issue 33, item 3): rows stay whole on their devices, parity over
stripes of K slices on M more; a lost device's (or a damaged copy's) slices are rebuilt on the
host from K survivors of their stripe, so every query answers as on the healthy cluster, in
every pushdown mode; repair rebuilds lost members onto live devices; an ingest is a stripe
visible whole or not at all."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import quarry
from quarry import netns
from quarry.coordinator.ingest.atomic import stripe_devices
from quarry.coordinator.reads.degraded import Rebuilder
from quarry.errors import DeviceUnavailable, IngestFailed, QuarryError
from quarry.samples import particles
from quarry.store import naming
from tests.commands import run_quarry
from tests.integration.test_integrity import _flip
from tests.plan.conftest import TPCH_TABLES, tpch  # noqa: F401 - the session fixture
from tests.plan.harness import assert_same_rows

MODES = ("never", "always", "auto")
# slices of 256 KiB: each partition is several slices, so stripes are many and runs end unevenly
PROFILES = '[profiles.small]\nfrom = "host"\nkv_bytes_max = 262144\n'
QUERIES = (
    "SELECT count(*) AS n, sum(ke) AS ke, min(id) AS lo, max(id) AS hi FROM t.p",
    "SELECT floor(x) AS b, count(*) AS n, sum(ke) AS ke FROM t.p GROUP BY 1 ORDER BY 1",
    "SELECT id, ke FROM t.p WHERE ke > 4.5 ORDER BY id",
)


def _expected(table: pa.Table, sql: str) -> pa.Table:
    connection = duckdb.connect()
    connection.register("p", table)
    return connection.execute(sql.replace("t.p", "p")).fetch_arrow_table()


def _answers(cluster, table: pa.Table, context: str) -> None:
    for sql in QUERIES:
        for mode in MODES:
            got = cluster.sql(sql, pushdown=mode).read_all()
            ordered = "ORDER BY" in sql
            assert_same_rows(got, _expected(table, sql), ordered, context=f"{context} {mode}")


def _devices_of(entry, partitions) -> set[str]:
    return {d for p in partitions for d in p.devices}


@pytest.fixture(scope="module")
def small_profiles(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("erasure") / "profiles.toml"
    path.write_text(PROFILES)
    return str(path)


@pytest.mark.slow
def test_ec_2_1_answers_as_duckdb_healthy_lost_and_repaired(small_profiles):
    table = particles.table(120_000, seed=21)
    with quarry.local(devices=4, profile="small", profiles_file=small_profiles) as cluster:
        entry = cluster.ingest(table, "t/p", redundancy="ec:2+1")
        assert entry.redundancy == "ec:2+1" and len(entry.partitions) % 2 == 0
        assert entry.parity and entry.parity_bytes_stored > 0
        for group in entry.ingests[0].stripes:  # K + M members on K + M distinct devices
            members = [*group.data, *group.parity]
            held = [entry.ingests[0].placement[str(p)][0] for p in members]
            assert len(set(held)) == 3
        listed = cluster.datasets()[0]
        assert listed.redundancy == "ec:2+1" and listed.parity_bytes_stored > 0
        _answers(cluster, table, "healthy")
        victim = entry.partitions[0].devices[0]
        cluster.kill_device(victim)
        cluster.refresh()
        lost = cluster.entry("t/p")
        assert [p.partition for p in lost.partitions if p.lost], "the victim held data"
        assert cluster.datasets()[0].rebuilt_partitions
        _answers(cluster, table, f"{victim} lost")
        assert cluster.scan("t/p").read_all().sort_by("id").equals(table.sort_by("id"))
        _one_column_rebuilds_its_bytes_only(cluster, next(p for p in lost.partitions if p.lost))
        planned = cluster.query(QUERIES[0], pushdown="always")
        planned.execute().read_all()
        explained = planned.explain(analyze=True)
        devices = {p.device for p in explained.analyze.partitions}
        assert any(d.startswith("parity:") for d in devices), devices
        short = cluster.deficits()
        assert short and all(d.redundancy == "ec:2+1" for d in short)
        report = cluster.repair()
        assert report.failed == [] and len(report.copied) == len(short)
        assert cluster.deficits() == []
        repaired = cluster.entry("t/p")
        assert not any(p.lost for p in repaired.partitions) and not repaired.parity_lost
        assert victim not in _devices_of(repaired, [*repaired.partitions, *repaired.parity])
        assert [p.rows for p in repaired.partitions] == [p.rows for p in entry.partitions]
        # the stripes are whole again: another device lost, and still every answer right
        other = next(d for d in sorted(cluster.devices) if d != victim)
        cluster.kill_device(other)
        cluster.refresh()
        _answers(cluster, table, f"repaired, then {other} lost")


def _one_column_rebuilds_its_bytes_only(cluster, lost) -> None:
    """A degraded read of one column rebuilds that column's bytes from the same bytes of the
    survivors (the code works byte by byte): fewer bytes read than for whole slices, the
    same values."""
    whole, one = Rebuilder.of(cluster, lost), Rebuilder.of(cluster, lost)
    rows = pa.Table.from_batches(list(whole.scan("t", "p", lost.partition)))
    ke = pa.Table.from_batches(list(one.scan("t", "p", lost.partition, columns=["ke"])))
    assert ke.column_names == ["ke"] and ke.column("ke").equals(rows.column("ke"))
    assert one.rebuilt_slices == whole.rebuilt_slices > 1
    # ec:2+1: the parity block whole and the other data slice's streams that overlap ke's
    assert one.bytes_read < 0.75 * whole.bytes_read, (one.bytes_read, whole.bytes_read)


@pytest.mark.slow
def test_a_damaged_data_slice_with_no_replica_is_rebuilt_from_parity(small_profiles):
    table = pa.table({"id": pa.array(range(60_000), pa.int64()), "v": pa.array([1.0] * 60_000)})
    with quarry.local(devices=3, profile="small", profiles_file=small_profiles) as cluster:
        entry = cluster.ingest(table, "t/ones", redundancy="ec:2+1", partitions=2)
        device = entry.partitions[0].devices[0]
        slices = cluster.devices[device].describe("t", "ones", 0).slices
        assert len(slices) > 1
        kv = Path(cluster.info[device].data) / "kv"
        cluster.kill_device(device)
        _flip(kv, naming.slice_key("t", "ones", 0, 1), slices[1].columns[0])
        cluster.restart_device(device)
        cluster.refresh()
        for mode in MODES:
            got = cluster.sql("SELECT max(v) AS m, sum(v) AS s FROM t.ones", pushdown=mode)
            assert got.read_all().to_pylist() == [{"m": 1.0, "s": 60_000.0}], mode
            wrong = cluster.sql("SELECT id FROM t.ones WHERE v <> 1.0", pushdown=mode)
            assert wrong.read_all().num_rows == 0, mode
        report = cluster.repair()
        assert report.mended and report.unmended == []
        assert "rebuilt" in report.mended[0].how
        assert cluster.scrub().clean


@pytest.fixture(scope="module")
def ec_4_2(small_profiles):
    """Six devices holding one particle table as EC 4+2."""
    table = particles.table(200_000, seed=33)
    with quarry.local(devices=6, profile="small", profiles_file=small_profiles) as cluster:
        cluster.ingest(table, "t/p", redundancy="ec:4+2")
        yield cluster, table


QUERY_SHAPES = st.tuples(
    st.sampled_from(["count(*)", "sum(ke)", "min(x)", "max(id)", "avg(y)"]),
    st.sampled_from(["", "WHERE ke > {t}", "WHERE x < {t} AND id % 3 = 0"]),
    st.sampled_from(["", "floor(x)"]),
    st.floats(min_value=-2.0, max_value=6.0, allow_nan=False),
)


def _sql(shape) -> str:
    aggregate, where, group, threshold = shape
    where = where.format(t=round(threshold, 3))
    if group:
        return f"SELECT {group} AS g, {aggregate} AS a FROM t.p {where} GROUP BY 1 ORDER BY 1"
    return f"SELECT {aggregate} AS a FROM t.p {where}"


@pytest.mark.slow
@settings(
    max_examples=10,
    deadline=None,
    derandomize=True,
    phases=(Phase.explicit, Phase.generate),  # an example costs seconds: no shrinking
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    lost=st.sets(st.integers(min_value=0, max_value=5), max_size=2),
    shapes=st.lists(QUERY_SHAPES, min_size=2, max_size=3),
)
def test_ec_4_2_any_two_lost_devices_answer_as_healthy(ec_4_2, lost, shapes):
    cluster, table = ec_4_2
    victims = [f"dev{i}" for i in sorted(lost)]
    for victim in victims:
        cluster.kill_device(victim)
    try:
        cluster.refresh()
        for shape in shapes:
            sql = _sql(shape)
            expected = _expected(table, sql)
            for mode in MODES:
                got = cluster.sql(sql, pushdown=mode).read_all()
                context = f"{victims} lost, {mode}: {sql}"
                assert_same_rows(got, expected, "ORDER BY" in sql, context=context)
    finally:
        for victim in victims:
            cluster.restart_device(victim)
        cluster.refresh()


@pytest.mark.slow
def test_ec_4_2_three_lost_devices_name_what_is_missing(ec_4_2):
    cluster, _ = ec_4_2
    entry = cluster.entry("t/p")
    group = entry.ingests[0].stripes[0]
    placement = entry.ingests[0].placement
    victims = [placement[str(p)][0] for p in group.data[:3]]  # three of one stripe's members
    for victim in victims:
        cluster.kill_device(victim)
    try:
        cluster.refresh()
        for mode in MODES:
            with pytest.raises(DeviceUnavailable) as raised:
                cluster.sql("SELECT sum(ke) FROM t.p", pushdown=mode).read_all()
            text = str(raised.value)
            assert "ec:4+2" in text and "fewer than the 4 of 6 blocks" in text, text
            assert all(victim in text for victim in victims), text
    finally:
        for victim in victims:
            cluster.restart_device(victim)
        cluster.refresh()


@pytest.mark.slow
def test_an_ec_ingest_with_a_device_killed_mid_way_leaves_nothing_visible(small_profiles):
    table = particles.table(300_000, seed=5)
    with quarry.local(devices=4, profile="small", profiles_file=small_profiles) as cluster:
        victim = "dev2"

        def source():
            for number, batch in enumerate(table.to_batches(max_chunksize=20_000)):
                if number == 5:
                    cluster.kill_device(victim)
                yield batch

        reader = pa.RecordBatchReader.from_batches(table.schema, source())
        with pytest.raises(IngestFailed):
            cluster.ingest(reader, "t/p", redundancy="ec:2+1")
        cluster.restart_device(victim)
        time.sleep(0.5)
        cluster.refresh()
        assert "t/p" not in cluster.catalog
        for name, client in cluster.devices.items():  # no stripe member left anywhere
            assert not [s for s in client.inventory() if s.dataset == "p"], name
        entry = cluster.ingest(table, "t/p", redundancy="ec:2+1")  # the name is free again
        assert entry.rows == table.num_rows
        appended = cluster.ingest(table.slice(0, 1000), "t/p", mode="append")
        assert appended.rows == table.num_rows + 1000 and appended.redundancy == "ec:2+1"
        assert len(appended.ingests) == 2 and appended.ingests[1].stripes
        numbers = [p for g in appended.ingests[1].stripes for p in g.parity]
        assert min(numbers) > max(p for g in appended.ingests[0].stripes for p in g.parity)
        cluster.kill_device(appended.partitions[-1].devices[0])
        cluster.refresh()
        got = cluster.sql("SELECT count(*) AS n FROM t.p").read_all().column("n")[0].as_py()
        assert got == table.num_rows + 1000
        cluster.restart_device(appended.partitions[-1].devices[0])
        cluster.refresh()
        cluster.drop("t/p")
        assert all(not c.inventory() for c in cluster.devices.values())


def test_asking_for_more_stripe_members_than_devices_says_so():
    with quarry.local(devices=2) as cluster:
        with pytest.raises(IngestFailed, match="ec:2\\+1 puts each stripe's 3 slices"):
            cluster.ingest(pa.table({"a": [1, 2, 3]}), "t/a", redundancy="ec:2+1")
        with pytest.raises(QuarryError, match="give 'ec:K\\+M'"):
            cluster.ingest(pa.table({"a": [1, 2, 3]}), "t/a", redundancy="raid5")


@pytest.mark.slow
def test_rebalance_moves_stripe_members_onto_a_new_device_and_off_a_drained_one(small_profiles):
    table = particles.table(120_000, seed=8)
    with quarry.local(devices=4, profile="small", profiles_file=small_profiles) as cluster:
        cluster.ingest(table, "t/p", redundancy="ec:2+1")
        cluster.start_device("dev4", profile="small")
        grown = cluster.rebalance()
        assert grown.failed == [] and grown.moved, grown.to_json()
        assert "dev4" in _members_on(cluster), "the new device takes its share"
        drained = cluster.drain("dev1")
        assert drained.failed == [] and drained.moved, drained.to_json()
        assert "dev1" not in _members_on(cluster)
        assert cluster.rebalance(dry_run=True).planned == []  # a fixed point
        _answers(cluster, table, "rebalanced")
        victim = cluster.entry("t/p").partitions[0].devices[0]
        cluster.kill_device(victim)  # every stripe whole again: one more lost is still right
        cluster.refresh()
        _answers(cluster, table, f"rebalanced, {victim} lost")


def _members_on(cluster) -> set[str]:
    """The devices holding the stripe members of t/p, each member on one device and each
    stripe group's members on distinct ones."""
    entry = cluster.entry("t/p")
    held = {p.partition: p.devices for p in [*entry.partitions, *entry.parity]}
    for group in entry.ingests[0].stripes:
        devices = [held[p] for p in (*group.data, *group.parity)]
        assert all(len(d) == 1 for d in devices), devices
        assert len({d[0] for d in devices}) == len(devices), devices
    return {d for devices in held.values() for d in devices}


@dataclass
class SixDevices:
    """Six devices on three hosts to store TPC-H on, and how to crash and restart one."""

    cluster: Any
    kill: Callable[[str], None]
    restart: Callable[[str], None]  # the device serves again and the cluster knows it
    where: str


@contextlib.contextmanager
def _six_devices(folder: Path) -> Iterator[SixDevices]:
    """Three hosts' network namespaces of two devices each (``quarry.netns``: TLS, each host
    on its own address, its failure domain) where the harness runs; local processes that say
    they run on three hosts otherwise."""
    if netns.missing() is not None:
        with quarry.local(devices=6, hosts=3) as cluster:
            kill, restart = cluster.kill_device, cluster.restart_device
            yield SixDevices(cluster, kill, restart, "local processes")
        return
    with netns.cluster(6, data=folder / "cluster", devices_per_host=2) as running:
        yield SixDevices(running.cluster, running.kill, running.start, "namespaces")


@pytest.fixture(scope="module")
def tpch_ec(tpch, tmp_path_factory):  # noqa: F811
    """TPC-H SF 0.1 stored as EC 4+2 on six devices, shared by the healthy and killed halves."""
    with _six_devices(tmp_path_factory.mktemp("tpch_ec")) as six:
        for name in TPCH_TABLES:
            six.cluster.ingest(tpch.data[f"tpch/{name}"], f"tpch/{name}", redundancy="ec:4+2")
        yield six


def _ordered(sql: str) -> bool:
    return "order by" in sql.lower().rsplit(")", 1)[-1]


def _stripes_survive_a_host(cluster) -> None:
    """Three hosts of two devices: no host holds more than M of any stripe's K + M members, so
    a host lost whole (its devices, or its link) leaves every stripe decodable."""
    hosts = {device: domain.host for device, domain in cluster.domains().items()}
    assert sorted(Counter(hosts.values()).values()) == [2, 2, 2], hosts
    for name in TPCH_TABLES:
        record = cluster.entry(f"tpch/{name}").ingests[0]
        for group in record.stripes:
            held = Counter(hosts[d] for d in stripe_devices(group, record.placement))
            assert max(held.values()) <= 2, (name, group, held)


QUERIES_PER_KILL = 4  # queries run at once while one device is killed under them


def _run_into(cluster, sql: str, outcome: dict) -> None:
    try:
        outcome["table"] = cluster.sql(sql, pushdown="auto").read_all()
    except BaseException as error:  # handed to the test
        outcome["error"] = error


def _killed_under(six: SixDevices, victim: str, queries: dict[int, str]) -> dict[int, dict]:
    """Run ``queries`` at once on the healthy cluster, kill ``victim`` under them, start it
    again once they end: each query's table or error."""
    outcomes: dict[int, dict] = {number: {} for number in queries}
    threads = [
        threading.Thread(target=_run_into, args=(six.cluster, sql, outcomes[number]))
        for number, sql in queries.items()
    ]
    for thread in threads:
        thread.start()
    time.sleep(0.05)
    six.kill(victim)
    for thread in threads:
        thread.join(120)
    assert not any(t.is_alive() for t in threads), f"{sorted(queries)}: a query hangs"
    six.restart(victim)
    return outcomes


@pytest.mark.slow
def test_tpch_on_ec_4_2_healthy_and_with_a_device_killed_mid_query(tpch_ec, tpch):  # noqa: F811
    six, cluster = tpch_ec, tpch_ec.cluster
    _stripes_survive_a_host(cluster)
    for number in sorted(tpch.queries):
        sql = tpch.queries[number]
        got = cluster.sql(sql, pushdown="auto").read_all()
        context = f"Q{number} healthy, {six.where}"
        assert_same_rows(got, tpch.expected(number), _ordered(sql), context=context)
    # Each query starts on the healthy cluster and has one device killed under it; a few run
    # at once under each kill, so the 22 cost six restarts rather than 22.
    devices = sorted(cluster.devices)
    numbers = sorted(tpch.queries)
    for index, at in enumerate(range(0, len(numbers), QUERIES_PER_KILL)):
        victim = devices[index % len(devices)]
        queries = {n: tpch.queries[n] for n in numbers[at : at + QUERIES_PER_KILL]}
        for number, outcome in _killed_under(six, victim, queries).items():
            context = f"Q{number}, {victim} killed, {six.where}"
            assert "error" not in outcome, f"{context}: {outcome.get('error')!r}"
            expected = tpch.expected(number)
            assert_same_rows(outcome["table"], expected, _ordered(queries[number]), context=context)


@pytest.mark.slow
def test_ingest_with_ec_from_the_command_line(tmp_path):
    path = tmp_path / "particles.parquet"
    pq.write_table(particles.table(100_000, seed=2), path)
    try:  # `down` even after an `up` that started devices and then failed
        run_quarry("up", "--devices", "3", "--detach", cwd=tmp_path)
        ingested = run_quarry(
            "ingest", str(path), "--dataset", "physics/p", "--ec", "2+1", cwd=tmp_path
        ).stdout
        assert "parity (ec:2+1)" in " ".join(ingested.split())
        (listed,) = json.loads(run_quarry("datasets", "--json", cwd=tmp_path).stdout)
        assert listed["redundancy"] == "ec:2+1" and listed["parity_bytes_stored"] > 0
        assert "ec:2+1" in run_quarry("datasets", cwd=tmp_path).stdout
        status = run_quarry("status", cwd=tmp_path).stdout
        assert "physics/p ec:2+1" in " ".join(status.split())
    finally:
        run_quarry("down", cwd=tmp_path, check=False)
