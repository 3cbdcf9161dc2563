"""SQL through real devices: answers equal DuckDB's whatever is pushed down or pushed back."""

from __future__ import annotations

import random
import threading
import time

import pyarrow as pa
import pytest

import quarry
from quarry.coordinator.query import planning
from quarry.errors import DeviceUnavailable, QueryError
from quarry.samples import particles
from tests.plan.harness import assert_same_rows, duckdb_answer

TPCH_QUERIES = range(1, 23)


def _ordered(sql: str) -> bool:
    return "order by" in sql.lower().rsplit(")", 1)[-1]


@pytest.mark.slow
@pytest.mark.parametrize("pushdown", ["never", "always"])
@pytest.mark.parametrize("number", TPCH_QUERIES)
def test_tpch_matches_duckdb(tpch_cluster, tpch, number, pushdown):
    sql = tpch.queries[number]
    result = tpch_cluster.sql(sql, pushdown=pushdown).read_all()
    assert_same_rows(
        result,
        tpch.expected(number),
        ordered=_ordered(sql),
        context=f"TPC-H Q{number} pushdown={pushdown}",
    )


@pytest.mark.parametrize("number", [1, 3, 6, 12, 14, 18])
def test_tpch_with_random_device_push_back(tpch_cluster, tpch, number):
    """Devices forced to push back random slice ranges, raw or filtered: same answer."""
    rng = random.Random(number)
    decisions = {}
    for name, entry in tpch_cluster.catalog.items():
        for p in entry.partitions:
            if p.slices:
                first = rng.randrange(p.slices)
                end = rng.randrange(first, p.slices) + 1
                decisions[(name, p.partition)] = [
                    {"first": first, "end": end, "stage": rng.choice(["raw", "filter"])}
                ]
    sql = tpch.queries[number]
    planned = tpch_cluster.query(sql, pushdown="always", decisions=decisions)
    result = planned.execute().read_all()
    assert_same_rows(
        result,
        tpch.expected(number),
        ordered=_ordered(sql),
        context=f"TPC-H Q{number} forced push-back",
    )
    report = planned.explain(analyze=True).analyze
    assert sum(d.counters.slices_pushed_back for d in report.devices) > 0


@pytest.mark.slow
@pytest.mark.parametrize("number", TPCH_QUERIES)
def test_tpch_on_kinetic_and_scaleflux_under_load(mixed_cluster, tpch, number):
    """Issue 4: every profile, every decision: emulated load on the kinetic drives, auto."""
    for device in ("dev0", "dev2"):
        mixed_cluster.load(device, 0.5, seconds=120)
    sql = tpch.queries[number]
    result = mixed_cluster.sql(sql, pushdown="auto").read_all()
    assert_same_rows(
        result,
        tpch.expected(number),
        ordered=_ordered(sql),
        context=f"TPC-H Q{number} kinetic+scaleflux under load",
    )


@pytest.mark.slow
def test_scaleflux_pushes_only_supported_conjuncts(mixed_cluster, tpch):
    sql = (
        "SELECT count(*) AS n, sum(l_quantity) AS q FROM tpch.lineitem "
        "WHERE l_shipmode LIKE '%AIR%' AND l_quantity > 10 "
        "AND l_extendedprice * (1 - l_discount) > 20000 AND l_discount <= 0.05"
    )
    report = mixed_cluster.explain(sql, analyze=True, pushdown="always")
    (fragment,) = report.cut.fragments
    pushed = " ".join(str(p) for p in fragment.predicates)
    assert "l_quantity" in pushed and "l_discount" in pushed
    plan = report.plan
    assert "LIKE" in plan.upper() or "like" in plan  # the host keeps the LIKE ...
    assert "l_extendedprice" in plan  # ... and the arithmetic
    result = mixed_cluster.sql(sql, pushdown="always").read_all()
    expected = tpch.connection.execute(sql.replace("tpch.", "")).fetch_arrow_table()
    assert_same_rows(result, expected, ordered=False, context="scaleflux LIKE + arithmetic")


# ---- Kinetic Pipe queries: bytes moved ----------------------------------------------------------


@pytest.fixture(scope="module")
def particle_cluster():
    with quarry.local(devices=3) as cluster:
        cluster.ingest(particles.reader(1_000_000, seed=5), "physics/particles")
        yield cluster


@pytest.mark.parametrize("select", ["*", "sum(ke) AS ke_sum"])
def test_pushdown_ships_fifty_times_fewer_bytes(particle_cluster, select):
    x = particles.ke_threshold(0.01)
    sql = f"SELECT {select} FROM particles WHERE ke > {x}"
    never = particle_cluster.explain(sql, analyze=True, pushdown="never").analyze
    always = particle_cluster.explain(sql, analyze=True, pushdown="always").analyze
    shipped_never = sum(d.counters.bytes_shipped for d in never.devices)
    shipped_always = sum(d.counters.bytes_shipped for d in always.devices)
    assert shipped_never >= 50 * shipped_always, (shipped_never, shipped_always)
    assert {d.device for d in always.devices} == {"dev0", "dev1", "dev2"}
    assert always.rows == never.rows


def test_answers_match_across_modes_and_duckdb(particle_cluster):
    sql = (
        "SELECT CAST(floor(x / 25) AS BIGINT) AS b, count(*) AS n, avg(ke) AS a, stddev(ke) AS s, "
        "min(y) AS lo, max(z) AS hi FROM particles WHERE ke > 1.5 GROUP BY 1 ORDER BY 1"
    )
    table = particle_cluster.scan("physics/particles").read_all()
    expected = duckdb_answer(table, "particles", sql)
    for mode in ("never", "always", "auto"):
        result = particle_cluster.sql(sql, pushdown=mode).read_all()
        assert_same_rows(result, expected, ordered=True, context=mode)
    assert table.num_rows == 1_000_000


def test_explain_shows_the_cut(particle_cluster):
    report = particle_cluster.explain("SELECT sum(ke) FROM particles WHERE ke > 2")
    (fragment,) = report.cut.fragments
    assert "filter" in fragment.pushed and "partial_aggregate" in fragment.pushed
    assert "super-plan" in report.plan and "sub-plan" in report.plan
    assert report.analyze is None and "analyze" not in report.to_json()


def test_explain_verbose_lists_the_rules_that_fired_also_for_a_kept_plan(particle_cluster):
    """EXPLAIN VERBOSE: the rules that fired, in order, each with the cut it left; the plan the
    plan cache keeps shows the same, and a plain EXPLAIN shows none."""
    sql = "SELECT sum(ke) AS total FROM particles WHERE ke > 3"
    first = particle_cluster.explain(sql, pushdown="always", verbose=True)
    hits = particle_cluster.plans.hits
    again = particle_cluster.explain(sql, pushdown="always", verbose=True)
    assert particle_cluster.plans.hits == hits + 1  # planned once, kept
    rules = ["push_filter", "split_predicate_by_capability", "split_aggregate", "prune_slices"]
    assert [step.rule for step in first.rules] == rules
    assert again.rules == first.rules
    assert "partial_aggregate" in first.rules[2].plan
    plain = particle_cluster.explain(sql, pushdown="always")
    assert plain.rules == () and "rules" not in plain.to_json()


def test_explain_analyze_reports_every_device(particle_cluster):
    explained = particle_cluster.explain("SELECT sum(ke) FROM particles WHERE ke > 2", True)
    report = explained.analyze
    shown = explained.to_json()["analyze"]["devices"]
    assert [row["device"] for row in shown] == [device.device for device in report.devices]
    for device, row in zip(report.devices, shown, strict=True):
        for key in (
            "slices_pruned",
            "slices_scanned",
            "slices_executed",
            "slices_pushed_back",
            "rows_read",
            "bytes_read",
            "bytes_shipped",
            "device_cpu_s",
        ):
            assert row[key] == getattr(device.counters, key)  # the JSON as it always was
        assert device.counters.rows_read > 0
    assert report.host_cpu_s >= 0 and report.wall_s > 0


def test_zone_maps_prune_slices(particle_cluster):
    report = particle_cluster.explain(
        "SELECT count(*) FROM particles WHERE id < 1000", analyze=True, pushdown="always"
    ).analyze
    assert sum(d.counters.slices_pruned for d in report.devices) > 0
    assert (
        particle_cluster.sql(
            "SELECT count(*) AS n FROM particles WHERE id < 1000", pushdown="always"
        )
        .read_all()
        .column("n")[0]
        .as_py()
        == 1000
    )


@pytest.mark.slow
@pytest.mark.parametrize("low", [-5, 333_333, 999_999])
def test_slices_every_row_of_which_passes_run_without_the_filter_and_answer_the_same(
    particle_cluster, low
):
    """``id`` rises through the table: slices wholly past ``low`` run without the filter (zone
    maps say every row passes), the slices across either bound with it; the answers are
    DuckDB's (the rows a quarter of the table at most: comparing them is the test's cost)."""
    table = particle_cluster.scan("physics/particles").read_all()
    for sql in (
        f"SELECT sum(ke) AS s, count(*) AS n FROM particles WHERE id >= {low}",
        f"SELECT id, ke FROM particles WHERE id > {low} AND ke >= 0 AND id <= {low + 250_000}",
    ):
        expected = duckdb_answer(table, "particles", sql)
        for mode in ("always", "auto"):
            result = particle_cluster.sql(sql, pushdown=mode).read_all()
            assert_same_rows(result, expected, ordered=False, context=f"{mode}: {sql}")


# ---- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "words"),
    [
        ("SELEC * FROM particles", "syntax"),
        ("SELECT * FROM nowhere", "nowhere"),
        ("SELECT nothing FROM particles", "nothing"),
        ("SELECT sum(x) FROM particles WHERE x > 'abc' || 1", ""),
    ],
)
def test_bad_sql_is_a_clear_error(particle_cluster, sql, words):
    with pytest.raises(QueryError) as caught:
        particle_cluster.sql(sql).read_all()
    message = str(caught.value)
    assert words.lower() in message.lower()
    assert "Traceback" not in message


def test_device_that_cannot_run_a_sub_plan(particle_cluster, monkeypatch):
    """The device hands the work back, naming why; the host runs that part itself."""
    from quarry.coordinator.query import fragments
    from quarry.protocol.stage import Stage

    original = fragments.device_stages

    def broken(fragment):
        stages, schema, complete_from = original(fragment)
        return {**stages, Stage.FULL: b"\x08\x01garbage"}, schema, complete_from

    monkeypatch.setattr(fragments, "device_stages", broken)
    sql = "SELECT count(*) AS n FROM particles WHERE ke > 2"
    planned = particle_cluster.query(sql, pushdown="always")
    result = planned.execute().read_all()
    monkeypatch.undo()
    expected = particle_cluster.sql(sql, pushdown="never").read_all()
    assert result.equals(expected)
    analyzed = planned.explain(analyze=True).analyze
    for d in analyzed.devices:
        assert d.counters.pushed_back_by() == {"capability": d.counters.slices_scanned}
        assert d.counters.slices_scanned > 0 and d.counters.slices_executed == 0
    reasons = [d.reason for p in analyzed.partitions for d in p.decisions]
    assert reasons and all("cannot run the sub-plan" in reason for reason in reasons)


@pytest.mark.slow
def test_device_dying_mid_query_fails_naming_it():
    with quarry.local(devices=2, profile="kinetic") as cluster:
        cluster.ingest(particles.reader(2_000_000), "physics/particles")
        errors: list[BaseException] = []

        def run() -> None:
            try:
                cluster.sql(
                    "SELECT CAST(x AS INT) AS b, avg(ke) FROM particles GROUP BY 1",
                    pushdown="always",
                ).read_all()
            except BaseException as error:
                errors.append(error)

        run()  # each device loads its engine on its first sub-plan
        started = time.perf_counter()
        run()  # how long it takes, to land the kill in its middle
        duration_s = time.perf_counter() - started
        thread = threading.Thread(target=run)
        thread.start()
        time.sleep(0.3 * duration_s)
        cluster.kill_device("dev1")
        thread.join(timeout=120)
        assert not thread.is_alive()
        assert len(errors) == 1 and isinstance(errors[0], DeviceUnavailable), errors
        assert "dev1" in str(errors[0])


def test_result_is_a_record_batch_reader(particle_cluster):
    reader = particle_cluster.sql("SELECT id FROM particles WHERE id < 10")
    assert isinstance(reader, pa.RecordBatchReader)
    assert sorted(reader.read_all().column("id").to_pylist()) == list(range(10))


@pytest.mark.slow
def test_a_filter_scan_streams_and_can_be_closed_early(particle_cluster):
    sql = "SELECT id, ke FROM particles WHERE ke > 0.5"
    planned = particle_cluster.query(sql, pushdown="always")
    assert "pass-through" in planned.explain(analyze=False).plan
    reader = planned.execute()
    assert reader.read_next_batch().num_rows > 0
    reader.close()  # the devices' producers stop; the cluster answers the next query
    expected = particle_cluster.sql(sql, pushdown="never").read_all()
    assert_same_rows(particle_cluster.sql(sql).read_all(), expected, ordered=False)


# ---- errors while running, and what EXPLAIN ANALYZE counts ----------------------------------


ON_DEVICES = "SELECT {} / ({} - {}) AS q FROM particles WHERE ke > 1"
IN_SUPER_PLAN = "SELECT {} / ({} - {}) AS q FROM particles"
DECIMAL = "CAST({} AS DECIMAL(18, 2))"


@pytest.mark.parametrize("pushdown", ["never", "always", "auto"])
@pytest.mark.parametrize(
    "sql",
    [
        ON_DEVICES.format(*[DECIMAL.format("id")] * 3),
        IN_SUPER_PLAN.format(*[DECIMAL.format(f) for f in ("sum(id)", "count(*)", "count(*)")]),
    ],
)
def test_division_by_zero_is_the_querys_error_in_every_mode(particle_cluster, sql, pushdown):
    """A decimal divided by zero (an integer one is NULL, below)."""
    from quarry.errors import ExecutionError

    with pytest.raises(ExecutionError) as caught:
        particle_cluster.sql(sql, pushdown=pushdown).read_all()
    message = str(caught.value)
    assert "divide by zero" in message.lower()
    assert "\n" not in message and "Traceback" not in message
    assert "cannot run the sub-plan" not in message  # not mistaken for a device that can't


@pytest.mark.parametrize("pushdown", ["never", "always", "auto"])
def test_an_integer_divided_by_zero_is_null_in_every_mode(particle_cluster, pushdown):
    """As SQLite and DuckDB's integer division answer, on the devices and in the super-plan."""
    for sql in (
        ON_DEVICES.format("id", "id", "id"),
        IN_SUPER_PLAN.format("sum(id)", *["count(*)"] * 2),
    ):
        column = particle_cluster.sql(sql, pushdown=pushdown).read_all().column("q")
        assert len(column) > 0 and column.null_count == len(column), sql


def test_a_range_filtered_on_the_device_and_shipped_is_counted_once(particle_cluster):
    entry = particle_cluster.entry("physics/particles")
    partition = max(entry.partitions, key=lambda p: p.slices)
    assert partition.slices >= 2
    forced = {
        ("physics/particles", partition.partition): [
            {"first": 0, "end": 1, "stage": "filter"},
            {"first": 1, "end": 2, "stage": "raw"},
        ]
    }
    sql = "SELECT count(*) AS n FROM particles WHERE ke > 1"
    report = particle_cluster.explain(sql, analyze=True, pushdown="always", decisions=forced)
    (row,) = [p for p in report.analyze.partitions if p.partition == partition.partition]
    assert row.counters.slices_scanned == row.counters.slices_total == partition.slices
    assert row.counters.rows_read == partition.rows
    assert row.counters.slices_pushed_back == 2
    assert row.counters.slices_executed == partition.slices - 2


@pytest.mark.slow
@pytest.mark.parametrize("pushdown", ["never", "always", "auto"])
def test_division_by_zero_is_one_line_on_the_cli(particle_cluster, pushdown):
    """An engine's error is one line. (A decimal divided by zero: an integer one is NULL, as
    SQLite and DuckDB answer, ``plan/rules/null_divisor.py``.)"""
    import subprocess
    import sys

    decimal = "CAST({} AS DECIMAL(12, 2))"
    sql = f"SELECT {decimal.format('id')} / {decimal.format('id - id')} AS q FROM particles"
    sql += " WHERE ke > 1"
    command = [sys.executable, "-m", "quarry", "sql", sql, "--pushdown", pushdown]
    command += ["--cluster", str(particle_cluster.cluster_file)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and "divide by zero" in lines[0].lower(), lines


JOIN_KEY_QUERIES = [5, 8, 9, 17, 18, 20]


@pytest.mark.slow
@pytest.mark.parametrize("number", JOIN_KEY_QUERIES)
def test_a_joins_keys_cut_its_probe_and_never_the_answer(tpch_cluster, tpch, number):
    """The keys of a filtered build fragment go to the devices of the large one: the same
    answer with and without, under always and auto, fewer bytes shipped, and EXPLAIN ANALYZE
    says what each join sent."""
    sql = tpch.queries[number]
    shipped = {}
    for pushdown in ("always", "auto"):
        for cut in (True, False):
            planned = tpch_cluster.query(sql, pushdown=pushdown, join_filters=cut)
            result = planned.execute().read_all()
            context = f"TPC-H Q{number} pushdown={pushdown} join_filters={cut}"
            assert_same_rows(result, tpch.expected(number), ordered=_ordered(sql), context=context)
            explained = planned.explain(analyze=True)
            shipped[(pushdown, cut)] = explained.analyze.bytes_shipped
            if cut:
                outcomes = [f.outcome for f in explained.join_filters]
                assert outcomes and any(o.startswith("sent") for o in outcomes), outcomes
            else:
                assert explained.join_filters == ()
    assert shipped[("always", True)] < shipped[("always", False)]


@pytest.mark.parametrize("number", [2, 11])
def test_a_fragment_read_twice_is_cut_for_both_reads_and_never_the_answer(
    tpch_cluster, tpch, number, small_probes_pay
):
    """Q2 and Q11 read a fragment in the query and in its subquery (partsupp, supplier); a
    cut of it serves both. Their probes are under the size that pays at SF 0.1: lowered here."""
    sql = tpch.queries[number]
    planned = tpch_cluster.query(sql, pushdown="always")
    result = planned.execute().read_all()
    outcomes = [f.outcome for f in planned.explain(True).join_filters]
    assert_same_rows(result, tpch.expected(number), ordered=_ordered(sql), context=f"Q{number}")
    assert outcomes and all(o.startswith("sent") for o in outcomes), outcomes


def test_reads_alike_are_kept_apart_when_join_keys_cut_them_apart(tpch_cluster, tpch):
    """Q21 reads lineitem alike twice (l1, and l3 in ``NOT EXISTS``): one shared read could be
    cut by neither read's keys; apart, l1 takes the suppliers of one nation's and l3 l1's order
    keys. Fewer bytes than the shared read, and DuckDB's answer."""
    sql = tpch.queries[21]
    apart = tpch_cluster.query(sql, pushdown="always")
    result = apart.execute().read_all()
    assert_same_rows(result, tpch.expected(21), ordered=_ordered(sql), context="Q21")
    explained = apart.explain(analyze=True, verbose=True)
    lineitem = [f for f in explained.cut.fragments if f.dataset == "tpch/lineitem"]
    assert len(lineitem) == 3
    rules = [step.rule for step in explained.rules]
    assert rules[-1] == "split_alike_by_join_keys" and "read_once" not in rules, rules
    sent = [f.filter for f in explained.join_filters if f.outcome.startswith("sent")]
    probes = {text.split(".")[0] for text in sent}
    assert len(probes & {f.name for f in lineitem}) >= 2, (sent, lineitem)
    shared = tpch_cluster.query(sql, pushdown="always", join_filters=False)
    shared.execute().read_all()
    explained_shared = shared.explain(False, verbose=True)
    fragments = explained_shared.cut.fragments
    assert len([f for f in fragments if f.dataset == "tpch/lineitem"]) == 2
    assert explained_shared.rules[-1].rule == "read_once"
    shipped = explained.analyze.bytes_shipped
    assert shipped < shared.explain(analyze=True).analyze.bytes_shipped


def test_probes_cut_by_the_same_keys_share_one_key_set(tpch_cluster, tpch, monkeypatch):
    """Q21 cuts its EXISTS and NOT EXISTS reads of lineitem by the order keys of its first: the
    keys are made distinct once, for both (at SF 10 twice took half a second before the second
    probe could start)."""
    from quarry.plan import keys

    made = []
    real = keys.distinct
    monkeypatch.setattr(keys, "distinct", lambda values: made.append(len(values)) or real(values))
    sql = tpch.queries[21]
    planned = tpch_cluster.query(sql, pushdown="always")
    result = planned.execute().read_all()
    assert_same_rows(result, tpch.expected(21), ordered=_ordered(sql), context="Q21")
    pairs = planned.explain(analyze=True).join_filters
    sent = [p for p in pairs if p.outcome.startswith("sent")]
    builds = [p.filter.split(" IN ")[1] for p in sent]
    assert len(builds) > len(set(builds)), f"two probes take one build's keys: {pairs}"
    assert len(made) == len(set(builds))
    shared = [p.outcome for p in sent if builds.count(p.filter.split(" IN ")[1]) > 1]
    assert len(set(shared)) == 1, shared


def test_q17_ships_a_hundredth_with_the_parts_keys(tpch_cluster, tpch):
    sql = tpch.queries[17]
    cut = tpch_cluster.query(sql, pushdown="always")
    cut.execute().read_all()
    whole = tpch_cluster.query(sql, pushdown="always", join_filters=False)
    whole.execute().read_all()
    with_keys = cut.explain(analyze=True).analyze.bytes_shipped
    without = whole.explain(analyze=True).analyze.bytes_shipped
    assert with_keys * 100 < without


@pytest.mark.parametrize("number", [5, 9, 17, 18])
def test_join_keys_with_random_device_push_back(tpch_cluster, tpch, number):
    """Ranges pushed back raw or filtered are cut by the keys when the host completes them."""
    rng = random.Random(1000 + number)
    decisions = {}
    for name, entry in tpch_cluster.catalog.items():
        for p in entry.partitions:
            if p.slices:
                first = rng.randrange(p.slices)
                decisions[(name, p.partition)] = [
                    {"first": first, "end": p.slices, "stage": rng.choice(["raw", "filter"])}
                ]
    sql = tpch.queries[number]
    planned = tpch_cluster.query(sql, pushdown="always", decisions=decisions)
    result = planned.execute().read_all()
    assert_same_rows(result, tpch.expected(number), ordered=_ordered(sql), context=f"Q{number}")
    assert any(f.outcome.startswith("sent") for f in planned.explain(True).join_filters)


@pytest.mark.parametrize(
    "bound, value, said",
    [("KEYS_MAX", 10, "over 10"), ("KEY_SET_BYTES_MAX", 64, "MiB")],
    ids=["keys", "bytes"],
)
def test_a_build_with_too_many_keys_sends_none(tpch_cluster, tpch, monkeypatch, bound, value, said):
    """Keys that come out past either bound, in keys or in bytes on the wire (few text keys
    may still be many bytes), are not sent and the answer is the uncut one. The pairs are
    chosen first, with the bounds as they are (and kept for the query's shape): the keys are
    found too many only once they are in, as when a build's estimate was wrong."""
    from quarry.plan import keys

    sql = tpch.queries[17]
    planned = tpch_cluster.query(sql, pushdown="always")
    planned.execute().read_all()
    assert all(f.outcome.startswith("sent") for f in planned.explain(True).join_filters)
    monkeypatch.setattr(keys, bound, value)
    planned = tpch_cluster.query(sql, pushdown="always")
    result = planned.execute().read_all()
    assert_same_rows(result, tpch.expected(17), ordered=_ordered(sql), context="Q17, no keys")
    outcomes = [f.outcome for f in planned.explain(True).join_filters]
    assert outcomes and all(o.startswith("not sent") and said in o for o in outcomes), outcomes


def test_a_build_through_the_hosts_filter_too_large_to_hold_sends_none(
    tpch_cluster, tpch, monkeypatch
):
    """Q18's build is kept whole to run its HAVING; past the bound it sends nothing."""
    from quarry.coordinator.query import join_keys

    monkeypatch.setattr(join_keys, "through_bytes_max", lambda: 1024)
    sql = tpch.queries[18]
    planned = tpch_cluster.query(sql, pushdown="always")
    result = planned.execute().read_all()
    assert_same_rows(result, tpch.expected(18), ordered=_ordered(sql), context="Q18, no keys")
    shown = planned.explain(True).join_filters
    outcomes = [f.outcome for f in shown if "after the host's filter" in f.filter]
    assert outcomes and all(o.startswith("not sent") and "MiB" in o for o in outcomes), outcomes


def test_a_build_through_the_hosts_filter_runs_on_every_host_core(tpch_cluster, tpch, monkeypatch):
    """Q18's HAVING over the partial sums of every order runs while every probe waits for it:
    on the host's cores (the super-plan's), the same keys as on one."""
    from quarry.coordinator.query import join_keys

    runs = []
    real = join_keys.run_through

    def counted(pair, batches, cores=1, extras=None):
        here, on_one = real(pair, batches, cores, extras), real(pair, batches, extras=extras)
        runs.append((cores, sorted(here.to_pylist(), key=str), sorted(on_one.to_pylist(), key=str)))
        return here

    monkeypatch.setattr(join_keys, "run_through", counted)
    sql = tpch.queries[18]
    result = tpch_cluster.sql(sql, pushdown="always").read_all()
    assert_same_rows(result, tpch.expected(18), ordered=_ordered(sql), context="Q18")
    assert runs and all(cores == planning.host_pace().cores for cores, _, _ in runs)
    assert all(on_cores == on_one and on_one for _, on_cores, on_one in runs)


def test_a_build_that_fails_ends_the_query_with_its_error(tpch_cluster):
    """The probe waits for keys that never come: the query ends with the build's error."""
    sql = (
        "SELECT sum(l_extendedprice) FROM tpch.lineitem JOIN tpch.part ON l_partkey = p_partkey "
        "WHERE CAST(p_size AS DECIMAL(12, 2)) / CAST(p_size - p_size AS DECIMAL(12, 2)) > 1"
    )  # a decimal divided by zero fails (an integer one is NULL: plan/rules/null_divisor.py)
    planned = tpch_cluster.query(sql, pushdown="always")
    assert planned.explain(False).join_filters, "the part fragment is a build"
    started = time.perf_counter()
    with pytest.raises(QueryError, match="[Dd]ivi"):
        planned.execute().read_all()
    assert time.perf_counter() - started < 30


def test_filter_conjuncts_go_in_the_order_a_sampled_slice_ranks_them(tpch_cluster, tpch):
    """Q12's lineitem filter, ranked by what one stored slice keeps of each conjunct: the
    receipt date's upper bound (two fifths of the rows) first, where the textbook's guesses (a
    third for every comparison) put ``l_shipdate < l_commitdate`` (half) first; the shipping
    modes (string comparisons) last. A conjunct that fails on the sample leaves the textbook's
    guess, and the query its own error."""
    sql = tpch.queries[12]
    query = tpch_cluster.query(sql, pushdown="always")
    assert_same_rows(query.execute().read_all(), tpch.expected(12), ordered=_ordered(sql))
    (lineitem,) = [f for f in query.explain(False).cut.fragments if f.dataset == "tpch/lineitem"]
    assert lineitem.device_filter[0] == "(l_receiptdate < DATE '1995-01-01')"
    assert "l_shipmode" in lineitem.device_filter[-1]
    assert "l_receiptdate < Date32" in lineitem.plan.split("AND")[0]  # the full stage's too
    failing = "SELECT count(*) FROM tpch.nation WHERE n_nationkey > 1 AND CAST(n_name AS INT) > 3"
    with pytest.raises(QueryError, match="(?i)cast"):
        tpch_cluster.sql(failing, pushdown="always").read_all()
