"""What a coordinator keeps between queries (the catalog, plans, threads) never changes an
answer: a query after an ingest, a drop or a re-ingest sees it, made through this handle or
through another coordinator altogether; and EXPLAIN ANALYZE says where a query's time went."""

from __future__ import annotations

import threading

import duckdb
import pyarrow as pa
import pytest

import quarry
from quarry.errors import QueryError

SUM_BY_GROUP = "SELECT k % 3 AS g, sum(v) AS s FROM t.kept GROUP BY k % 3 ORDER BY g"


def _table(rows: int, scale: float) -> pa.Table:
    return pa.table(
        {"k": pa.array(range(rows), pa.int64()), "v": pa.array([i * scale for i in range(rows)])}
    )


def _expected(rows: int, scale: float) -> list[dict]:
    sums = [0.0, 0.0, 0.0]
    for i in range(rows):
        sums[i % 3] += i * scale
    return [{"g": g, "s": sums[g]} for g in range(3)]


def _answer(cluster, sql: str = SUM_BY_GROUP, pushdown: str = "always") -> list[dict]:
    return cluster.sql(sql, pushdown=pushdown).read_all().to_pylist()


@pytest.fixture(scope="module")
def cluster():
    with quarry.local(devices=3) as c:
        yield c


@pytest.mark.parametrize("pushdown", ["never", "always", "auto"])
def test_a_reingest_with_other_rows_gives_the_new_answer(cluster, pushdown):
    cluster.ingest(_table(300, 1.0), "t/kept", partitions=3)
    assert _answer(cluster, pushdown=pushdown) == _expected(300, 1.0)
    assert _answer(cluster, pushdown=pushdown) == _expected(300, 1.0)  # the kept plan
    cluster.drop("t/kept")
    cluster.ingest(_table(90, 2.0), "t/kept", partitions=2)
    assert _answer(cluster, pushdown=pushdown) == _expected(90, 2.0)
    cluster.drop("t/kept")


def test_a_dropped_dataset_is_gone_and_a_new_one_is_there(cluster):
    cluster.ingest(_table(30, 1.0), "t/kept", partitions=3)
    assert _answer(cluster) == _expected(30, 1.0)
    cluster.drop("t/kept")
    with pytest.raises(QueryError, match="kept"):
        _answer(cluster)
    cluster.ingest(_table(60, 1.0), "t/fresh", partitions=3)
    fresh = "SELECT count(*) AS n FROM t.fresh"
    assert _answer(cluster, fresh) == [{"n": 60}]
    cluster.drop("t/fresh")


@pytest.mark.parametrize("pushdown", ["always", "auto"])
def test_another_coordinator_s_ingest_and_drop_are_seen(cluster, pushdown):
    """Nothing tells this handle: each query asks every device whether what it holds changed
    since the catalog was read (its pulse), and reads the catalog again if so."""
    cluster.ingest(_table(300, 1.0), "t/kept", partitions=3)
    assert _answer(cluster, pushdown=pushdown) == _expected(300, 1.0)
    other = quarry.connect(cluster.cluster_file)
    try:
        other.drop("t/kept")
        other.ingest(_table(120, 3.0), "t/kept", partitions=3)
        assert _answer(cluster, pushdown=pushdown) == _expected(120, 3.0)
        other.ingest(_table(30, 1.0), "t/other", partitions=1)
        assert _answer(cluster, "SELECT count(*) AS n FROM t.other") == [{"n": 30}]
        other.drop("t/other")
        with pytest.raises(QueryError, match="other"):
            _answer(cluster, "SELECT count(*) AS n FROM t.other", pushdown=pushdown)
        other.ingest(_table(30, 1.0), "t/kept", partitions=1, mode="append")
        appended = _expected(120, 3.0)
        for row, extra in zip(appended, _expected(30, 1.0), strict=True):
            row["s"] += extra["s"]
        assert _answer(cluster, pushdown=pushdown) == appended
    finally:
        other.drop("t/kept")
        other.close()


def test_explain_without_running_shows_the_catalog_as_it_is(cluster):
    cluster.ingest(_table(30, 1.0), "t/kept", partitions=1)
    cluster.sql("SELECT count(*) FROM t.kept").read_all()
    other = quarry.connect(cluster.cluster_file)
    try:
        other.drop("t/kept")
        other.ingest(pa.table({"k": [1, 2], "w": [0.5, 1.5]}), "t/kept")
        plan = cluster.explain("SELECT sum(w) AS s FROM t.kept")
        assert "w" in plan.plan
    finally:
        other.drop("t/kept")
        other.close()


def test_a_query_from_many_threads_at_once_gives_one_answer(cluster):
    cluster.ingest(_table(600, 1.0), "t/kept", partitions=3)
    answers: list[list[dict]] = []
    errors: list[BaseException] = []

    def ask() -> None:
        try:
            for pushdown in ("auto", "always", "never"):
                answers.append(_answer(cluster, pushdown=pushdown))
        except BaseException as error:  # reported below, not lost in the thread
            errors.append(error)

    askers = [threading.Thread(target=ask) for _ in range(4)]
    for asker in askers:
        asker.start()
    for asker in askers:
        asker.join(120)
    cluster.drop("t/kept")
    assert not errors
    assert answers == [_expected(600, 1.0)] * 12


def test_plans_are_kept_per_catalog_and_bounded(cluster):
    cluster.ingest(_table(30, 1.0), "t/kept", partitions=1)
    _answer(cluster)
    hits = cluster.plans.hits
    _answer(cluster)
    assert cluster.plans.hits == hits + 1  # the same SQL on the same catalog: not cut again
    cluster.drop("t/kept")  # a new catalog: plans of the old one are not asked for again
    cluster.ingest(_table(30, 2.0), "t/kept", partitions=1)
    misses = cluster.plans.misses
    assert _answer(cluster) == _expected(30, 2.0)
    assert cluster.plans.misses == misses + 1
    assert len(cluster.plans) <= cluster.plans.entries_max
    cluster.drop("t/kept")


def test_a_device_s_pulse_changes_with_what_it_holds(cluster):
    device = cluster.devices["dev0"]
    before = device.pulse().generation
    assert device.pulse().generation == before  # nothing written: the same
    assert device.inventory_reply().generation == before
    cluster.ingest(_table(30, 1.0), "t/kept", partitions=3)
    after = device.pulse().generation
    assert after != before
    cluster.drop("t/kept")
    assert device.pulse().generation not in (before, after)


@pytest.mark.parametrize("pushdown", ["never", "always", "auto"])
def test_explain_analyze_says_where_the_time_went(cluster, pushdown):
    cluster.ingest(_table(3000, 1.0), "t/kept", partitions=3)
    report = cluster.explain(SUM_BY_GROUP, analyze=True, pushdown=pushdown)
    cluster.drop("t/kept")
    spent = report.to_json()["analyze"]["time"]  # as JSON: its shape is what users read
    spans = {name: value for name, value in spent.items() if isinstance(value, dict)}
    assert set(spans) == {
        "planning",
        "fragments",
        "host_completion",
        "super_plan",
        "device_queueing",
        "store_read",
        "decode",
        "execute",
        "ship",
        "devices",
    }
    for name, span in spans.items():
        assert span["wall_s"] >= 0 and span["cpu_s"] >= 0, name
    # the host's parts follow one another along the query's path: they fit in its wall time
    host_path = sum(spans[name]["wall_s"] for name in ("planning", "fragments", "super_plan"))
    assert 0 < host_path <= spent["wall_s"] * 1.01 + 1e-4
    assert spans["planning"]["wall_s"] > 0 and spans["super_plan"]["wall_s"] > 0
    assert spent["streams"] >= 3  # one per device, and any fetch of slices pushed back
    # each device part is a share of what the devices spent
    for name in ("store_read", "decode", "execute", "ship"):
        assert spans[name]["wall_s"] <= spans["devices"]["wall_s"] * 1.01 + 1e-4, name
    scanned = any(choice.runs_as for choice in report.cost_model.values())
    if pushdown == "never" or scanned:  # the host did the work: devices only read and ship
        assert spans["execute"]["wall_s"] == 0 and spans["host_completion"]["wall_s"] > 0
    else:
        assert spans["execute"]["wall_s"] > 0 and spans["store_read"]["wall_s"] > 0


def test_a_devices_partitions_share_one_stream(cluster):
    """Twelve partitions on three devices: three work streams, each device running its four
    partitions at once, and the same answer as DuckDB."""
    table = _table(12_000, 0.5)
    cluster.ingest(table, "t/kept", partitions=12)
    query = cluster.query(SUM_BY_GROUP, pushdown="always")
    result = query.execute().read_all()
    report = query.explain(analyze=True).analyze
    cluster.drop("t/kept")
    kept = table  # noqa: F841 - DuckDB reads it by name
    expected = duckdb.sql(SUM_BY_GROUP.replace("t.kept", "kept")).fetch_arrow_table()
    assert result.to_pylist() == expected.to_pylist()
    assert report.time.streams == 3
    assert sum(d.partitions for d in report.devices) == 12


def test_the_time_section_reads_as_text(cluster):
    cluster.ingest(_table(300, 1.0), "t/kept", partitions=3)
    query = cluster.query(SUM_BY_GROUP, pushdown="always")
    query.execute().read_all()
    cluster.drop("t/kept")
    lines = query.breakdown().render()
    assert lines[0].startswith("time, wall/cpu ms: query ")
    assert "planning" in lines[1] and "super-plan" in lines[1]
    assert "execute" in lines[2] and "; 3 streams" in lines[2]


def test_a_storage_server_reports_its_drives_time_and_its_own():
    """A server relays its drives' accounts (WorkDone) with its own work on top."""
    with quarry.local(servers=1, drives_per_server=2) as cluster:
        cluster.ingest(_table(3000, 1.0), "t/kept", partitions=2)
        report = cluster.explain(SUM_BY_GROUP, analyze=True, pushdown="always")
        spent = report.analyze.time
        assert spent.store_read.wall_s > 0  # the drives read
        assert spent.execute.wall_s > 0 and spent.ship.wall_s > 0
        below = [row.metrics.times for p in report.analyze.partitions for row in p.below]
        assert below and all(times.read_s > 0 for times in below)
        # every slice handed back raw: the server completes it (read when it fetches, which
        # reports no device times)
        report = cluster.explain(SUM_BY_GROUP, analyze=True, pushdown="server")
        spent = report.analyze.time
        assert spent.execute.wall_s > 0 and spent.ship.wall_s > 0


def test_a_small_table_under_auto_is_read_by_the_host_and_a_large_one_run_on_the_devices(
    cluster,
):
    """On the embedded default the devices compute on the host's own cores: a table of a few
    kilobytes costs less read by the host (a scan stream per partition) than run on the devices
    (a work exchange each), and the cost model says so; a large one runs on the devices. The
    answers are DuckDB's either way."""
    small, large = _table(300, 1.0), _table(600_000, 0.5)
    cluster.ingest(small, "t/kept", partitions=3)
    cluster.ingest(large, "t/large", partitions=3)
    try:
        for name, table, runs_as in (("kept", small, "scan"), ("large", large, "subplan")):
            sql = SUM_BY_GROUP.replace("t.kept", f"t.{name}")
            query = cluster.query(sql, pushdown="auto")
            result = query.execute().read_all()
            kept = table  # noqa: F841 - DuckDB reads it by name
            expected = duckdb.sql(sql.replace(f"t.{name}", "kept")).fetch_arrow_table()
            assert result.column("g").to_pylist() == expected.column("g").to_pylist()
            assert result.column("s").to_pylist() == pytest.approx(expected.column("s").to_pylist())
            explained = query.explain(analyze=True)
            (choice,) = explained.cost_model.values()
            assert (choice.runs_as is not None) == (runs_as == "scan"), choice
            assert {p.mode for p in explained.analyze.partitions} == {runs_as}
    finally:
        cluster.drop("t/kept")
        cluster.drop("t/large")


def test_a_small_scan_over_several_devices_is_completed_in_one_engine_run(cluster, monkeypatch):
    """The host reads a table of a few kilobytes from three devices and completes it in one run
    of its engine, not one per device; a table past one run's bytes is completed per device, on
    the host's cores at once. DuckDB's answer both ways."""
    from quarry.device.units import substrait

    runs: list[int] = []
    complete_group = substrait.complete_group

    def counted(stage, group):
        runs.append(sum(batch.num_rows for batch in group))
        return complete_group(stage, group)

    monkeypatch.setattr(substrait, "complete_group", counted)
    cluster.ingest(_table(300, 1.0), "t/kept", partitions=3)
    cluster.ingest(_table(600_000, 0.5), "t/large", partitions=3)
    try:
        assert _answer(cluster, pushdown="never") == _expected(300, 1.0)
        assert runs == [300]
        runs.clear()
        sql = SUM_BY_GROUP.replace("t.kept", "t.large")
        answer, expected = _answer(cluster, sql, pushdown="never"), _expected(600_000, 0.5)
        assert [row["g"] for row in answer] == [row["g"] for row in expected]
        assert [row["s"] for row in answer] == pytest.approx([row["s"] for row in expected])
        assert len(runs) >= 3 and sum(runs) == 600_000
    finally:
        cluster.drop("t/kept")
        cluster.drop("t/large")
