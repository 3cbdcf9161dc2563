"""A hierarchy: the host in front of storage servers, each in front of drives of its own.

A server is a device to the host and a coordinator to its drives: the answers are DuckDB's
whatever each level decides, what a drive hands back is completed by its server (not shipped on
to the host), and EXPLAIN ANALYZE shows both levels. A drive that dies mid-query behind a
server, with replicas behind another server, leaves a right answer or an error naming both.
"""

from __future__ import annotations

import random
import threading
import time

import duckdb
import pytest

import quarry
from quarry.errors import QuarryError
from quarry.samples import particles
from tests.integration.conftest import _ingest_tpch
from tests.plan.conftest import tpch  # noqa: F401 - the session fixture
from tests.plan.harness import assert_same_rows

TPCH_QUERIES = range(1, 23)
QUERY_TIMEOUT_S = 120
PARTICLE_SQL = "SELECT floor(x) AS b, count(*) AS n, sum(ke) AS ke FROM particles GROUP BY 1"


def _ordered(sql: str) -> bool:
    return "order by" in sql.lower().rsplit(")", 1)[-1]


def _each_slice_pushed_back(cluster, rng: random.Random, share: float) -> dict:
    """Forced decisions: about ``share`` of the slices handed back raw or filtered, every
    other one of a dataset's passed on by its server to the host (``to_host``), the others
    completed by it (alternating, so a dataset of few slices has both kinds)."""
    decisions = {}
    for name, entry in cluster.catalog.items():
        to_host = rng.random() < 0.5
        for p in entry.partitions:
            if p.slices:
                forced = []
                for n in range(p.slices):
                    if rng.random() < share:
                        stage = rng.choice(["raw", "filter"])
                        forced.append(
                            {"first": n, "end": n + 1, "stage": stage, "to_host": to_host}
                        )
                        to_host = not to_host
                decisions[(name, p.partition)] = forced
    return decisions


@pytest.fixture(scope="module")
def hierarchy(tpch):  # noqa: F811
    """Two storage servers, three drives each, of three kinds (a ScaleFlux scan engine behind
    each server), holding TPC-H at SF 0.1."""
    with quarry.local(
        servers=2,
        drives_per_server=3,
        drive_profile=["host", "scaleflux", "kinetic", "kinetic", "scaleflux", "host"],
    ) as cluster:
        _ingest_tpch(cluster, tpch)
        yield cluster


def test_the_host_sees_the_servers_and_each_partition_once(hierarchy, tpch):  # noqa: F811
    assert sorted(hierarchy.devices) == ["s0", "s1"]
    lineitem = hierarchy.entry("tpch/lineitem")
    assert lineitem.rows == tpch.data["tpch/lineitem"].num_rows
    assert {p.devices[0] for p in lineitem.partitions} == {"s0", "s1"}


@pytest.mark.slow
@pytest.mark.parametrize("pushdown", ["never", "always", "auto"])
@pytest.mark.parametrize("number", TPCH_QUERIES)
def test_tpch_on_a_hierarchy_matches_duckdb(hierarchy, tpch, number, pushdown):  # noqa: F811
    sql = tpch.queries[number]
    result = hierarchy.sql(sql, pushdown=pushdown).read_all()
    assert_same_rows(
        result,
        tpch.expected(number),
        ordered=_ordered(sql),
        context=f"TPC-H Q{number} pushdown={pushdown} on host -> 2 servers -> 3 drives each",
    )


@pytest.mark.parametrize("number", [1, 3, 6, 12, 14, 18])
def test_what_drives_push_back_their_server_completes(hierarchy, tpch, number):  # noqa: F811
    """Drives forced to hand back random ranges, raw or filtered: the answer is the same, the
    servers completed every one of them, and nothing came to the host unfinished."""
    rng = random.Random(number)
    decisions = {}
    for name, entry in hierarchy.catalog.items():
        for p in entry.partitions:
            if p.slices:
                first = rng.randrange(p.slices)
                end = rng.randrange(first, p.slices) + 1
                decisions[(name, p.partition)] = [
                    {"first": first, "end": end, "stage": rng.choice(["raw", "filter"])}
                ]
    sql = tpch.queries[number]
    planned = hierarchy.query(sql, pushdown="always", decisions=decisions)
    result = planned.execute().read_all()
    assert_same_rows(
        result, tpch.expected(number), ordered=_ordered(sql), context=f"Q{number} forced"
    )
    partitions = planned.explain(analyze=True).analyze.partitions
    below = [level for p in partitions for level in p.below]
    assert below, "EXPLAIN ANALYZE shows the drives below the servers"
    assert {level.device[:2] for level in below} <= {"s0", "s1"}
    assert sum(level.metrics.counters.slices_pushed_back for level in below) > 0
    assert sum(p.counters.slices_pushed_back for p in partitions) == 0  # completed on servers
    assert all(p.bytes_shipped_raw == 0 for p in partitions)


@pytest.mark.slow
@pytest.mark.parametrize("number", TPCH_QUERIES)
def test_push_back_at_each_level(hierarchy, tpch, number):  # noqa: F811
    """Forced push-back at both levels: some ranges the drives hand back are completed by their
    server, others (``to_host``) passed on and completed by the host. Same answer."""
    decisions = _each_slice_pushed_back(hierarchy, random.Random(100 + number), share=0.7)
    sql = tpch.queries[number]
    planned = hierarchy.query(sql, pushdown="always", decisions=decisions)
    result = planned.execute().read_all()
    assert_same_rows(
        result, tpch.expected(number), ordered=_ordered(sql), context=f"Q{number} two levels"
    )
    partitions = planned.explain(analyze=True).analyze.partitions
    passed = sum(p.counters.slices_pushed_back for p in partitions)
    below = [level for p in partitions for level in p.below]
    handed = sum(level.metrics.counters.slices_pushed_back for level in below)
    assert 0 < passed < handed  # the host completed some, the servers the rest
    for p in partitions:  # every slice counted once at the host's level
        counted = p.counters
        assert counted.slices_scanned == counted.slices_executed + counted.slices_pushed_back, p


def test_a_busy_server_passes_its_drives_push_backs_on_to_the_host(hierarchy, tpch):  # noqa: F811
    """Under auto, a storage server whose CPU is taken by other work does not complete what its
    drives hand back: it passes it on, and the host completes it. An idle server completes."""
    hierarchy.load("s0", 0.95, seconds=60)
    try:
        decisions = {
            (name, p.partition): [{"first": 0, "end": p.slices, "stage": "raw"}]
            for name, entry in hierarchy.catalog.items()
            for p in entry.partitions
            if p.slices
        }
        sql = tpch.queries[6]
        planned = hierarchy.query(sql, pushdown="auto", decisions=decisions)
        result = planned.execute().read_all()
    finally:
        hierarchy.load("s0", 0.0, seconds=1)
    assert_same_rows(result, tpch.expected(6), ordered=False, context="Q6, s0 busy")
    partitions = planned.explain(analyze=True).analyze.partitions
    busy = [p.counters for p in partitions if p.device == "s0"]
    idle = [p.counters for p in partitions if p.device == "s1"]
    assert busy and all(c.slices_pushed_back == c.slices_scanned > 0 for c in busy)
    assert idle and all(c.slices_pushed_back == 0 for c in idle)


@pytest.mark.parametrize("number", [1, 6, 12, 19])
def test_server_pushdown_reads_on_the_drives_and_computes_on_the_servers(hierarchy, tpch, number):  # noqa: F811
    """POLARDB's CPU-based pushdown: every slice the drives read goes to their server raw, the
    servers run the sub-plan, and the host receives only what a drive pushdown would send."""
    sql = tpch.queries[number]
    planned = hierarchy.query(sql, pushdown="server")
    result = planned.execute().read_all()
    assert_same_rows(result, tpch.expected(number), ordered=_ordered(sql), context=f"Q{number}")
    partitions = planned.explain(analyze=True).analyze.partitions
    below = [level.metrics.counters for p in partitions for level in p.below]
    assert sum(c.slices_executed for c in below) == 0
    assert sum(c.slices_pushed_back for c in below) == sum(c.slices_scanned for c in below)
    assert all(p.counters.slices_executed == p.counters.slices_scanned for p in partitions)
    assert all(p.bytes_shipped_raw == 0 for p in partitions)
    levels = planned.explain(analyze=True).analyze.levels
    assert levels.drive_links_bytes > levels.network_bytes


def test_a_scan_engine_behind_a_server_gets_only_its_comparisons(hierarchy, tpch):  # noqa: F811
    """The server cuts the sub-plan again for a ScaleFlux drive: it filters on its comparisons
    (the LIKE stays with the server) and ships only the rows that pass them."""
    sql = (
        "SELECT count(*) AS n, sum(l_extendedprice) AS p FROM tpch.lineitem "
        "WHERE l_shipdate >= DATE '1994-06-01' AND l_shipdate < DATE '1994-07-01' "
        "AND l_comment LIKE '%fur%'"
    )
    planned = hierarchy.query(sql, pushdown="always")
    result = planned.execute().read_all()
    expected = tpch.connection.execute(sql.replace("tpch.", "")).fetch_arrow_table()
    assert_same_rows(result, expected, ordered=False, float_absolute=1e-6)
    levels = planned.explain(analyze=True).analyze.levels
    engines = [d.counters for d in levels.drives if d.device in ("s0d1", "s1d1")]
    assert engines and all(c.slices_executed == c.slices_scanned > 0 for c in engines)
    assert all(c.bytes_shipped < c.bytes_read / 5 for c in engines)  # about 1/80 pass


@pytest.mark.slow
def test_a_scan_engine_runs_a_sub_plan_of_comparisons_and_columns_whole(hierarchy, tpch):  # noqa: F811
    """POLARDB's TS-5: a comparison of two stored columns, one column selected. The ScaleFlux
    drive runs all of it, so it ships only the selected column of the rows that pass (not the
    compared columns for a re-check), and its server passes that on as it came."""
    sql = "SELECT l_orderkey FROM tpch.lineitem WHERE l_commitdate < l_receiptdate"
    planned = hierarchy.query(sql, pushdown="always")
    result = planned.execute().read_all()
    expected = tpch.connection.execute(sql.replace("tpch.", "")).fetch_arrow_table()
    assert_same_rows(result, expected, ordered=False)
    levels = planned.explain(analyze=True).analyze.levels
    engines = [d.counters for d in levels.drives if d.device in ("s0d1", "s1d1")]
    assert engines and all(c.slices_executed == c.slices_scanned > 0 for c in engines)
    rows = sum(c.rows_shipped for c in engines)
    assert rows > 0 and sum(c.bytes_shipped for c in engines) < 10 * rows  # 8 bytes a row


def test_behind_a_server_only_drives_that_run_aggregates_answer_from_statistics(hierarchy, tpch):  # noqa: F811
    """An aggregate every row passes: a drive that runs sub-plans whole answers it from its
    slices' statistics; a scan engine's share is cut to a scan, whose rows its server counts."""
    sql = "SELECT count(*) AS n FROM tpch.lineitem"
    planned = hierarchy.query(sql, pushdown="always")
    result = planned.execute().read_all()
    expected = tpch.connection.execute(sql.replace("tpch.", "")).fetch_arrow_table()
    assert_same_rows(result, expected, ordered=True)
    drives = planned.explain(analyze=True).analyze.levels.drives
    engines = [d.counters for d in drives if d.device in ("s0d1", "s1d1")]
    others = [d.counters for d in drives if d.device not in ("s0d1", "s1d1")]
    assert engines and all(c.slices_answered == 0 < c.slices_scanned for c in engines)
    assert others and all(c.slices_answered > 0 == c.bytes_read for c in others)


def test_compressed_slices_are_decompressed_where_they_are_scanned(hierarchy, tpch):  # noqa: F811
    """lz4 slices: a drive that scans decompresses them; read raw, they travel compressed and
    whoever scans them pays: the servers under server pushdown, the host under none (and its
    EXPLAIN ANALYZE says how long)."""
    hierarchy.ingest(tpch.data["tpch/lineitem"], "tpch/lineitem_lz4", compression="lz4")
    try:
        where = "WHERE l_shipdate < DATE '1995-01-01'"
        sql = f"SELECT count(*) AS n, sum(l_quantity) AS q FROM tpch.lineitem_lz4 {where}"
        expected = tpch.connection.execute(
            f"SELECT count(*) AS n, sum(l_quantity) AS q FROM lineitem {where}"
        ).fetch_arrow_table()
        analyzed = {}
        for way in ("never", "server", "always"):
            planned = hierarchy.query(sql, pushdown=way)
            result = planned.execute().read_all()
            assert_same_rows(result, expected, ordered=False, context=f"lz4, {way}")
            analyzed[way] = planned.explain(analyze=True).analyze
        assert analyzed["never"].host_decode_s > 0
        assert analyzed["server"].host_decode_s == analyzed["always"].host_decode_s == 0
        plain = hierarchy.query(sql.replace("lineitem_lz4", "lineitem"), pushdown="server")
        plain.execute().read_all()
        compressed = analyzed["server"].levels.drive_links_bytes
        assert compressed < 0.8 * plain.explain(analyze=True).analyze.levels.drive_links_bytes
    finally:
        hierarchy.drop("tpch/lineitem_lz4")


def test_without_pushdown_raw_slices_cross_drive_links_and_network_alike(hierarchy, tpch):  # noqa: F811
    planned = hierarchy.query(tpch.queries[6], pushdown="never")
    planned.execute().read_all()
    analyzed = planned.explain(analyze=True).analyze
    levels = analyzed.levels
    assert levels.drive_links_bytes == levels.network_bytes == analyzed.bytes_shipped > 0
    assert levels.drives_bytes_read == analyzed.bytes_read > 0


def test_a_raw_scan_and_a_dataset_drop_pass_through_the_servers(hierarchy):
    table = particles.table(20_000, seed=5)
    hierarchy.ingest(table, "physics/through", partitions=4)
    scanned = hierarchy.scan("physics/through").read_all()
    assert scanned.num_rows == table.num_rows
    assert hierarchy.drop("physics/through") > 0
    assert "physics/through" not in hierarchy.catalog


@pytest.fixture(scope="module")
def replicated(tmp_path_factory):
    """Two servers of two slow drives each; the particles on both servers (replicas=2)."""
    profiles = tmp_path_factory.mktemp("hierarchy") / "profiles.toml"
    profiles.write_text('[profiles.slow]\nfrom = "host"\ncompute_factor = 6.0\ncores = 2\n')
    with quarry.local(
        servers=2, drives_per_server=2, drive_profile="slow", profiles_file=str(profiles)
    ) as cluster:
        table = particles.table(400_000, seed=4)
        cluster.ingest(table, "physics/particles", replicas=2)
        con = duckdb.connect()
        con.register("particles", table)
        yield cluster, con.execute(PARTICLE_SQL).fetch_arrow_table()


@pytest.mark.slow
def test_a_drive_killed_mid_query_behind_a_server(replicated):
    """Killed while the query runs: the answer is right (the host went on with the replica
    behind the other server), or the error names the drive and its server."""
    cluster, expected = replicated
    started = time.perf_counter()
    cluster.sql(PARTICLE_SQL, pushdown="always").read_all()
    duration = time.perf_counter() - started
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["table"] = cluster.sql(PARTICLE_SQL, pushdown="always").read_all()
        except QuarryError as error:
            outcome["error"] = error

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(0.3 * duration)
    cluster.kill_device("s0d0")
    thread.join(QUERY_TIMEOUT_S)
    assert not thread.is_alive(), "the query hangs"
    print("outcome:", "error" if "error" in outcome else "answer", outcome.get("error"))
    if "error" in outcome:
        message = str(outcome["error"])
        assert "s0d0" in message and "s0" in message, message
    else:
        assert_same_rows(outcome["table"], expected, ordered=False, float_absolute=1e-6)
    # Afterwards the replicas behind s1 answer for what s0d0 held.
    again = cluster.sql(PARTICLE_SQL, pushdown="always").read_all()
    assert_same_rows(again, expected, ordered=False, float_absolute=1e-6)


@pytest.fixture(scope="module")
def three_levels(tpch):  # noqa: F811
    """Any depth in one cluster: server s0 in front of a drive (s0d0) and of a second server
    (s0s0, two drives of its own), beside a drive the host talks to directly (d0)."""
    with quarry.local(layout=[["scaleflux", ["host", "kinetic"]], "host"]) as cluster:
        for name in ("lineitem", "orders"):
            cluster.ingest(tpch.data[f"tpch/{name}"], f"tpch/{name}", partitions=8)
        yield cluster


@pytest.mark.slow
@pytest.mark.parametrize("number", [1, 4, 6, 12])
def test_three_levels_answer_like_duckdb_whatever_each_level_does(three_levels, tpch, number):  # noqa: F811
    assert sorted(three_levels.devices) == ["d0", "s0"]
    placed = {p.devices[0] for p in three_levels.entry("tpch/lineitem").partitions}
    assert placed == {"d0", "s0"}
    sql = tpch.queries[number]
    for way in ("never", "server", "always", "auto"):
        planned = three_levels.query(sql, pushdown=way)
        result = planned.execute().read_all()
        assert_same_rows(
            result, tpch.expected(number), ordered=_ordered(sql), context=f"Q{number} {way}"
        )
    analyzed = planned.explain(analyze=True).analyze
    below = {(level.device, level.above) for p in analyzed.partitions for level in p.below}
    assert {("s0d0", "s0"), ("s0s0", "s0"), ("s0s0d0", "s0s0"), ("s0s0d1", "s0s0")} <= below
    rows = {row.device: row for row in analyzed.levels.drives}
    assert rows["s0s0"].server and not rows["s0s0d1"].server


def test_push_back_at_each_of_three_levels(three_levels, tpch):  # noqa: F811
    """Drives two levels down hand back ranges; the inner server completes some and passes the
    others (``to_host``) through the outer server to the host. Same answer."""
    decisions = _each_slice_pushed_back(three_levels, random.Random(7), share=1.0)
    for number in (1, 4, 12):
        sql = tpch.queries[number]
        planned = three_levels.query(sql, pushdown="always", decisions=decisions)
        result = planned.execute().read_all()
        assert_same_rows(
            result, tpch.expected(number), ordered=_ordered(sql), context=f"Q{number} three"
        )
        partitions = planned.explain(analyze=True).analyze.partitions
        assert sum(p.counters.slices_pushed_back for p in partitions if p.device == "s0") > 0


@pytest.mark.slow
def test_under_auto_a_server_chooses_its_drives_cut_on_its_own_figures(tmp_path_factory):
    """The host sees a slow server and would have it hand everything back raw; the server,
    in front of drives faster than itself, has them run the whole sub-plan: each level picks
    with the one cost model on its own figures."""
    profiles = tmp_path_factory.mktemp("levels") / "profiles.toml"
    profiles.write_text('[profiles.slow]\nfrom = "host"\ncompute_factor = 8.0\ncores = 1\n')
    table = particles.table(200_000, seed=3)
    with quarry.local(
        servers=1,
        drives_per_server=2,
        server_profile="slow",
        drive_profile="host",
        profiles_file=str(profiles),
    ) as cluster:
        cluster.ingest(table, "physics/particles", partitions=4)
        planned = cluster.query(PARTICLE_SQL, pushdown="auto")
        result = planned.execute().read_all()
        report = planned.explain(analyze=True)
    con = duckdb.connect()
    con.register("particles", table)
    expected = con.execute(PARTICLE_SQL).fetch_arrow_table()
    assert_same_rows(result, expected, ordered=False, float_absolute=1e-6)
    (choice,) = report.cost_model.values()
    assert choice.cut == "raw"  # the host's choice for its device, the slow server
    firsts = [level.decisions[0] for p in report.analyze.partitions for level in p.below]
    assert firsts and all(d.stage == "full" for d in firsts), firsts
