"""A device that stops answering mid-query: with a replica, the query finishes on it, every
slice counted once. (Without one it fails at once, naming the device: tests/integration/test_sql
test_device_dying_mid_query_fails_naming_it.)"""

from __future__ import annotations

import random
import threading
import time

import duckdb
import pytest

import quarry
from quarry.coordinator.query.explain import Explain
from quarry.errors import QuarryError
from quarry.samples import particles
from tests.plan.conftest import tpch  # noqa: F401 - the session fixture
from tests.plan.harness import assert_same_rows

ROUNDS = 20
QUERY_TIMEOUT_S = 120
PUSHDOWNS = ("always", "auto", "never")
PARTICLE_SQL = "SELECT floor(x) AS b, count(*) AS n, sum(ke) AS ke FROM particles GROUP BY 1"
# Drives slow enough that a query lasts about a second: a kill lands mid-query.
PROFILES = (
    '[profiles.slow]\nfrom = "host"\ncompute_factor = 6.0\ncores = 2\nkv_bytes_max = 262144\n'
)


@pytest.fixture(scope="module")
def replicated(tpch, tmp_path_factory):  # noqa: F811
    profiles = tmp_path_factory.mktemp("failover") / "profiles.toml"
    profiles.write_text(PROFILES)
    with quarry.local(devices=4, profile="slow", profiles_file=str(profiles)) as cluster:
        for name in ("lineitem", "orders"):
            cluster.ingest(tpch.data[f"tpch/{name}"], f"tpch/{name}", replicas=2)
        table = particles.table(1_000_000, seed=4)
        cluster.ingest(table, "physics/particles", replicas=2)
        con = duckdb.connect()
        con.register("particles", table)
        expected = con.execute(PARTICLE_SQL).fetch_arrow_table()
        yield cluster, expected


def _run(cluster, sql: str, pushdown: str, outcome: dict) -> None:
    try:
        planned = cluster.query(sql, pushdown=pushdown)
        outcome["table"] = planned.execute().read_all()
        outcome["explain"] = planned.explain(analyze=True)
    except BaseException as error:  # handed to the test
        outcome["error"] = error


def _failovers(explain: Explain) -> list[dict]:
    return [f for d in explain.analyze.devices for f in d.failovers]


@pytest.mark.slow
def test_a_device_killed_mid_query_fails_over_to_its_replica(replicated, tpch):  # noqa: F811
    cluster, particle_expected = replicated
    rng = random.Random(12)
    cases = [
        ("q1", tpch.queries[1], tpch.expected(1), True),
        ("q6", tpch.queries[6], tpch.expected(6), False),
        ("q12", tpch.queries[12], tpch.expected(12), True),
        ("particles", PARTICLE_SQL, particle_expected, False),
    ]
    durations = {}
    for name, sql, _, _ in cases:  # how long each takes, to aim the kills
        for pushdown in PUSHDOWNS:
            started = time.perf_counter()
            cluster.sql(sql, pushdown=pushdown).read_all()
            durations[(name, pushdown)] = time.perf_counter() - started
    completed, failed_over, wrong, errors = 0, 0, [], []
    for round_number in range(ROUNDS):
        name, sql, expected, ordered = cases[round_number % len(cases)]
        pushdown = rng.choice(PUSHDOWNS)
        victim = f"dev{rng.randrange(4)}"
        outcome: dict = {}
        thread = threading.Thread(target=_run, args=(cluster, sql, pushdown, outcome))
        thread.start()
        time.sleep(rng.uniform(0.05, 0.5) * durations[(name, pushdown)])
        cluster.kill_device(victim)
        thread.join(QUERY_TIMEOUT_S)
        assert not thread.is_alive(), f"round {round_number}: the query hangs"
        cluster.restart_device(victim)
        if "error" in outcome:
            errors.append((round_number, name, pushdown, repr(outcome["error"])[:300]))
            continue
        completed += 1
        try:
            assert_same_rows(outcome["table"], expected, ordered=ordered, context=name)
        except AssertionError as error:
            wrong.append((round_number, name, pushdown, str(error)[:200]))
        failed_over += bool(_failovers(outcome["explain"]))
    print(f"failover rounds: {completed} of {ROUNDS} completed, {failed_over} failed over")
    print(errors)
    assert wrong == [], wrong
    assert completed >= ROUNDS - 1, f"{completed} of {ROUNDS} completed"
    assert failed_over >= ROUNDS // 2, f"only {failed_over} rounds saw a failover"


def test_explain_analyze_shows_the_failover(replicated):
    cluster, expected = replicated
    started = time.perf_counter()
    cluster.sql(PARTICLE_SQL, pushdown="always").read_all()
    duration_s = time.perf_counter() - started
    failovers: list[dict] = []
    for fraction in (0.3, 0.15, 0.5):  # a kill after dev2's part is done shows no failover
        outcome: dict = {}
        thread = threading.Thread(target=_run, args=(cluster, PARTICLE_SQL, "always", outcome))
        thread.start()
        time.sleep(fraction * duration_s)
        cluster.kill_device("dev2")
        thread.join(QUERY_TIMEOUT_S)
        cluster.restart_device("dev2")
        assert "error" not in outcome, outcome.get("error")
        assert_same_rows(outcome["table"], expected, ordered=False)
        failovers = _failovers(outcome["explain"])
        if failovers:
            break
    assert failovers and all(f["from"] == "dev2" for f in failovers)
    resumed = [
        p
        for p in outcome["explain"].analyze.partitions
        if any(d.stage == "elsewhere" for d in p.decisions)
    ]
    for partition in resumed:  # a replica ran the rest; what the lost device did, it skipped
        assert partition.device != "dev2"


def test_a_scan_goes_on_from_the_next_slice_on_a_replica(replicated):
    cluster, _ = replicated
    entry = cluster.entry("physics/particles")
    reader = cluster.scan("physics/particles")
    ids = []
    for index, batch in enumerate(reader):
        ids.extend(batch.column("id").to_pylist())
        if index == 3:
            cluster.kill_device("dev1")  # partitions it was streaming go on elsewhere
        time.sleep(0.002)  # a slow reader: the devices' streams stay open
    cluster.restart_device("dev1")
    assert len(ids) == entry.rows and len(set(ids)) == entry.rows  # each row once


@pytest.mark.slow
def test_gene_statistics_fail_over_to_replicas(replicated):
    from quarry import genes
    from tests.genes.test_genes_cluster import assert_same_bits, mixed_matrix

    cluster, _ = replicated
    matrix = mixed_matrix(seed=5, genes=3000, cells=1500)
    genes.ingest(cluster, matrix, "lab/failover", replicas=2)
    rng = random.Random(3)
    names = [f"c{i}" for i in range(1500)]

    def cells() -> list[str]:  # a grouping no device has cached: the work is done afresh
        return rng.sample(names, 300)

    failovers = []
    for victim in ("dev0", "dev3", "dev1"):
        group = cells()
        baseline = genes.rank_genes(cluster, "lab/failover", group=group, pushdown="never")
        outcome: dict = {}
        admitted = cluster.devices[victim].stats().admitted

        def run(outcome: dict = outcome, group: list[str] = group) -> None:
            try:
                outcome["ranked"] = genes.rank_genes(
                    cluster, "lab/failover", group=group, pushdown="always"
                )
            except BaseException as error:
                outcome["error"] = error

        thread = threading.Thread(target=run)
        thread.start()
        _while_it_works(cluster, victim, admitted, thread)
        cluster.kill_device(victim)
        thread.join(QUERY_TIMEOUT_S)
        cluster.restart_device(victim)
        assert "error" not in outcome, outcome.get("error")
        assert_same_bits(outcome["ranked"], baseline)
        failovers += outcome["ranked"].attrs["quarry"]["failovers"]
    assert failovers, "no kill landed mid-request"


def _while_it_works(cluster, victim: str, admitted: int, thread: threading.Thread) -> None:
    """Return once the victim runs the request's work (its second exchange: the first only
    learns that it must be sent the grouping), or the request is over; bounded."""
    deadline = time.monotonic() + QUERY_TIMEOUT_S
    while thread.is_alive() and time.monotonic() < deadline:
        stats = cluster.devices[victim].stats()
        if stats.running and stats.admitted >= admitted + 2:
            return
        time.sleep(0.005)


@pytest.mark.slow
def test_without_a_replica_a_kill_is_a_clear_error_never_a_wrong_answer(replicated):
    cluster, _ = replicated
    table = particles.table(400_000, seed=8)
    cluster.ingest(table, "physics/single", replicas=1)
    sql = PARTICLE_SQL.replace("particles", "physics.single")
    con = duckdb.connect()
    con.register("particles", table)
    expected = con.execute(PARTICLE_SQL).fetch_arrow_table()
    cluster.sql(sql, pushdown="always").read_all()  # its plan is kept: time a run like the rest
    started = time.perf_counter()
    cluster.sql(sql, pushdown="always").read_all()
    duration_s = time.perf_counter() - started
    rng = random.Random(21)
    answered, refused = 0, []
    for round_number in range(10):
        victim = f"dev{rng.randrange(4)}"
        outcome: dict = {}
        pushdown = rng.choice(PUSHDOWNS)
        thread = threading.Thread(target=_run, args=(cluster, sql, pushdown, outcome))
        thread.start()
        time.sleep(rng.uniform(0.05, 0.5) * duration_s)
        cluster.kill_device(victim)
        thread.join(QUERY_TIMEOUT_S)
        assert not thread.is_alive(), f"round {round_number}: the query hangs"
        cluster.restart_device(victim)
        if "error" in outcome:  # clear: the device, and that no replica holds its partition
            assert isinstance(outcome["error"], QuarryError), outcome["error"]
            assert victim in str(outcome["error"]), outcome["error"]
            refused.append(str(outcome["error"]).splitlines()[0][:160])
        else:  # the kill came after the victim's part: then the answer must be right
            assert_same_rows(outcome["table"], expected, ordered=False, context="single")
            answered += 1
    print(f"replicas=1: {answered} answered right, {len(refused)} clear errors: {refused[:2]}")
    assert refused, "no kill landed mid-query"
    cluster.drop("physics/single")


@pytest.mark.slow
def test_a_filter_planned_while_its_sampled_slice_is_down_is_a_clear_error_then_right(
    replicated,
):
    """Planning counts each conjunct on a sampled slice: with the device holding that slice
    dead and no replica, the query says which device, as any query over the partition would;
    once it is back, the same query (planned anew) answers right."""
    cluster, _ = replicated
    table = particles.table(50_000, seed=9)
    cluster.ingest(table, "physics/sampled", replicas=1)
    entry = cluster.entry("physics/sampled")
    victim = max(entry.partitions, key=lambda p: p.rows).devices[0]
    sql = "SELECT count(*) AS n FROM physics.sampled WHERE ke > 1.0 AND x < 0.5"
    con = duckdb.connect()
    con.register("tbl", table)
    expected = con.execute(sql.replace("physics.sampled", "tbl")).fetch_arrow_table()
    cluster.kill_device(victim)
    try:
        with pytest.raises(QuarryError, match=victim):
            cluster.sql(sql, pushdown="always").read_all()
    finally:
        cluster.restart_device(victim)
    cluster.refresh()
    again = sql + " AND y > -100"
    assert_same_rows(
        cluster.sql(again, pushdown="always").read_all(),
        con.execute(again.replace("physics.sampled", "tbl")).fetch_arrow_table(),
        ordered=False,
    )
    assert_same_rows(cluster.sql(sql, pushdown="always").read_all(), expected, ordered=False)
    cluster.drop("physics/sampled")
