"""Partitions, not only kills: devices in network namespaces on their own addresses, TLS on,
their links cut silently (nothing resets the connection) in the middle of queries, ingests and
repairs. Needs root, `ip` and `tc` (quarry.netns); skipped in one line where they are missing.

Each test runs a few rounds (``QUERY_ROUNDS``, ``INGEST_ROUNDS``, ``REPAIR_ROUNDS``);
``bench/partitions.py`` runs the issue's 20 and 10 and plots them."""

from __future__ import annotations

import random
import time

import duckdb
import pyarrow as pa
import pytest

from quarry import netns, settings
from quarry.coordinator.ingest import atomic
from quarry.coordinator.query.explain import Explain
from quarry.coordinator.query.planning import serving
from quarry.errors import DeviceUnavailable, QuarryError
from quarry.samples import particles
from tests.plan.conftest import tpch  # noqa: F401 - the session fixture
from tests.plan.harness import assert_same_rows

pytestmark = pytest.mark.slow  # every test starts devices in namespaces and cuts links

QUERY_ROUNDS = 4
INGEST_ROUNDS = 2
REPAIR_ROUNDS = 2
PUSHDOWNS = ("always", "auto", "never")
PARTICLE_SQL = "SELECT floor(x) AS b, count(*) AS n, sum(ke) AS ke FROM particles GROUP BY 1"
# Drives slow enough that a query lasts about a second: a cut lands mid-query.
PROFILES = (
    '[profiles.slow]\nfrom = "host"\ncompute_factor = 6.0\ncores = 2\nkv_bytes_max = 262144\n'
)
LINK_BYTES_PER_S = 50e6  # each device's link, each way (tc tbf)
# A loaded machine (two cores, other tests) stretches a query's own time: what a round may
# take beyond the silence bound and its query's time measured alone.
SLACK_S = 3.0
HEAL_S = 30.0  # a healed device answers again within this (its heartbeat, then a refresh)


@pytest.fixture(scope="module")
def namespaced(tpch, tmp_path_factory):  # noqa: F811
    reason = netns.missing()
    if reason is not None:
        pytest.skip(reason)
    folder = tmp_path_factory.mktemp("netns")
    profiles = folder / "profiles.toml"
    profiles.write_text(PROFILES)
    with netns.cluster(3, "slow", folder / "cluster", str(profiles)) as running:
        for name in running.network.links:
            running.network.shape(name, LINK_BYTES_PER_S)
        cluster = running.cluster
        cluster.ingest(tpch.data["tpch/lineitem"], "tpch/lineitem", replicas=2)
        table = particles.table(600_000, seed=4)
        cluster.ingest(table, "physics/particles", replicas=2)
        con = duckdb.connect()
        con.register("particles", table)
        expected = con.execute(PARTICLE_SQL).fetch_arrow_table()
        yield running, expected


def _cases(tpch, particle_expected):  # noqa: F811
    return [
        ("q1", tpch.queries[1], tpch.expected(1), True),
        ("q6", tpch.queries[6], tpch.expected(6), False),
        ("particles", PARTICLE_SQL, particle_expected, False),
    ]


def _query(cluster, sql: str, pushdown: str) -> tuple[pa.Table, Explain]:
    planned = cluster.query(sql, pushdown=pushdown)
    return planned.execute().read_all(), planned.explain(analyze=True)


def _heal(running, victim: str) -> None:
    """The link back, and the device answering the cluster again, without a restart."""
    running.heal(victim)
    cluster = running.cluster
    client = cluster.devices[victim]
    assert netns.wait_until(lambda: not client.heartbeat.silent, HEAL_S), f"{victim} silent"
    cluster.settle()
    assert netns.wait_until(lambda: _back(cluster, victim), HEAL_S), cluster.down


def _back(cluster, name: str) -> bool:
    cluster.settle()
    if name in cluster.down:
        cluster.refresh()
    return name not in cluster.down


def _bound_s() -> float:
    return settings.DEVICE_SILENCE_S.get()


def test_sql_over_namespaced_links_equals_duckdb(namespaced, tpch):  # noqa: F811
    running, particle_expected = namespaced
    for name, sql, expected, ordered in _cases(tpch, particle_expected):
        for pushdown in PUSHDOWNS:
            got = running.cluster.sql(sql, pushdown=pushdown).read_all()
            assert_same_rows(got, expected, ordered=ordered, context=f"{name} {pushdown}")
    addresses = {s.address.split("//")[1].split(":")[0] for s in running.specs}
    assert len(addresses) == 3 and all(s.address.startswith("grpc+tls://") for s in running.specs)


def test_a_link_cut_mid_query_fails_over_within_the_bound(namespaced, tpch):  # noqa: F811
    running, particle_expected = namespaced
    cluster = running.cluster
    cases = _cases(tpch, particle_expected)
    rng = random.Random(32)
    durations = {}
    for name, sql, _, _ in cases:
        for pushdown in PUSHDOWNS:
            _query(cluster, sql, pushdown)  # plans kept: time a run like the rounds'
            started = time.perf_counter()
            _query(cluster, sql, pushdown)
            durations[(name, pushdown)] = time.perf_counter() - started
    failed_over, landed, problems = 0, 0, []
    for number in range(QUERY_ROUNDS):
        name, sql, expected, ordered = cases[number % len(cases)]
        pushdown = rng.choice(PUSHDOWNS)
        victim = f"dev{rng.randrange(3)}"
        duration = durations[(name, pushdown)]
        outcome = netns.cut_during(
            running,
            victim,
            rng.uniform(0.1, 0.6) * duration,
            lambda sql=sql, pushdown=pushdown: _query(cluster, sql, pushdown),
        )
        _heal(running, victim)
        label = f"round {number}: {name} {pushdown}, {victim} cut"
        assert not outcome.hung, f"{label}: the query hangs"
        if outcome.error is not None:
            problems.append(f"{label}: {outcome.error!r}"[:300])
            continue
        table, explain = outcome.result
        assert_same_rows(table, expected, ordered=ordered, context=label)
        allowed = duration + _bound_s() + SLACK_S + duration
        assert outcome.seconds <= allowed, f"{label}: {outcome.seconds:.1f} s > {allowed:.1f} s"
        landed += outcome.landed
        moves = [f for d in explain.analyze.devices for f in d.failovers]
        failed_over += bool(moves)
        assert all(f["from"] == victim for f in moves), moves
    print(f"{QUERY_ROUNDS} rounds: {landed} cuts mid-query, {failed_over} failed over")
    assert problems == [], problems
    assert failed_over, "no cut landed on a device at work"


def test_a_healed_device_serves_again_without_a_restart(namespaced):
    running, expected = namespaced
    cluster = running.cluster
    victim = serving(cluster, cluster.entry("physics/particles"))[0]  # serves partition 0
    running.cut(victim)
    started = time.perf_counter()
    table, _ = _query(cluster, PARTICLE_SQL, "always")
    assert time.perf_counter() - started < _bound_s() + SLACK_S + 5
    assert_same_rows(table, expected, ordered=False)
    pid = running.processes[victim].pid
    _heal(running, victim)
    assert running.processes[victim].pid == pid and running.processes[victim].poll() is None
    table, explain = _query(cluster, PARTICLE_SQL, "always")
    assert_same_rows(table, expected, ordered=False)
    served = {p.device for p in explain.analyze.partitions if p.partition == 0}
    assert served == {victim}, served


def test_without_a_replica_a_cut_is_a_clear_error_naming_the_device(namespaced):
    running, _ = namespaced
    cluster = running.cluster
    table = particles.table(300_000, seed=8)
    cluster.ingest(table, "physics/single", replicas=1)
    sql = PARTICLE_SQL.replace("particles", "physics.single")
    _query(cluster, sql, "always")
    started = time.perf_counter()
    _query(cluster, sql, "always")
    duration = time.perf_counter() - started
    entry = cluster.entry("physics/single")
    victim = max(entry.partitions, key=lambda p: p.rows).devices[0]
    outcome = netns.cut_during(
        running, victim, 0.3 * duration, lambda: _query(cluster, sql, "always")
    )
    _heal(running, victim)
    assert not outcome.hung
    if outcome.error is None:  # the cut came after the victim's part: then right
        pytest.skip("the cut landed after the victim's part was in")
    assert isinstance(outcome.error, DeviceUnavailable), repr(outcome.error)
    assert victim in str(outcome.error), outcome.error
    assert outcome.after_cut_s <= _bound_s() + SLACK_S, outcome.after_cut_s
    cluster.drop("physics/single")


def test_a_drop_while_a_holder_is_cut_off_is_refused_naming_it(namespaced):
    running, _ = namespaced
    cluster = running.cluster
    cluster.ingest(particles.table(50_000, seed=2), "t/dropped", replicas=2, partitions=3)
    victim = cluster.entry("t/dropped").partitions[0].devices[0]
    running.cut(victim)
    started = time.perf_counter()
    with pytest.raises(DeviceUnavailable, match=victim):
        cluster.drop("t/dropped")
    assert time.perf_counter() - started <= _bound_s() + SLACK_S
    _heal(running, victim)
    assert cluster.entry("t/dropped").rows == 50_000  # nothing was dropped anywhere
    cluster.drop("t/dropped")
    assert "t/dropped" not in cluster.catalog


def _key_counts(cluster) -> dict[str, int]:
    return {name: client.stats().keys for name, client in cluster.devices.items()}


def _settled(cluster) -> bool:
    """No device holds a pending partition or an open ingest stream."""
    stats = [client.stats() for client in cluster.devices.values()]
    return all(s.pending_partitions == 0 and s.ingesting == 0 for s in stats)


def test_a_link_cut_during_an_ingest_ends_complete_or_absent(namespaced, monkeypatch):
    running, _ = namespaced
    cluster = running.cluster
    monkeypatch.setenv(settings.INGEST_LEASE_S.name, "3")
    rows = 400_000

    def ingest(name: str):
        source = pa.RecordBatchReader.from_batches(
            particles.SCHEMA, particles.batches(rows, batch_rows=20_000, seed=7)
        )
        return cluster.ingest(source, name, replicas=2)

    started = time.perf_counter()
    ingest("t/timed")
    duration = time.perf_counter() - started
    cluster.drop("t/timed")
    before = _key_counts(cluster)
    rng = random.Random(6)
    outcomes = []
    for number in range(INGEST_ROUNDS):
        victim = f"dev{rng.randrange(3)}"
        name = f"t/cut{number}"
        outcome = netns.cut_during(
            running, victim, rng.uniform(0.1, 0.9) * duration, lambda name=name: ingest(name)
        )
        _heal(running, victim)
        assert not outcome.hung, f"round {number}: the ingest hangs"
        assert netns.wait_until(lambda: _settled(cluster), HEAL_S), "debris outlived the lease"
        cluster.refresh()
        listed = name in {d.dataset for d in cluster.datasets()}
        # the decider cut while asked to commit: only its word, once healed, says which
        unknown = isinstance(outcome.error, atomic.OutcomeUnknown)
        if outcome.error is None or (unknown and listed):  # complete: every row, every replica
            assert listed and cluster.entry(name).rows == rows
            assert cluster.scan(name).read_all().num_rows == rows
            cluster.drop(name)
        else:  # absent, with nothing left behind
            assert isinstance(outcome.error, QuarryError), repr(outcome.error)
            assert not listed, f"round {number}: a failed ingest is listed: {outcome.error!r}"
        assert _key_counts(cluster) == before, f"round {number}: debris"
        outcomes.append("complete" if outcome.error is None or listed else "absent")
    print(f"ingest rounds: {outcomes}")


def test_a_commit_missed_behind_a_cut_is_reconciled_before_the_device_serves(namespaced):
    """The link of a participant is cut after its partitions are durable and before its commit:
    the ingest stands; when the link heals the device is committed by the coordinator that reads
    it, long before its own lease would have it ask the decider."""
    running, _ = namespaced
    cluster = running.cluster
    table = particles.table(90_000, seed=3)
    decide = atomic._decide
    cut: list[str] = []

    def cut_then_decide(decider, record, dataset):
        cut.append(next(d for d in sorted(record.addresses) if d != record.decider))
        running.cut(cut[0])
        decide(decider, record, dataset)

    atomic._decide = cut_then_decide
    try:
        entry = cluster.ingest(table, "t/missed", replicas=2, partitions=3)
    finally:
        atomic._decide = decide
    (victim,) = cut
    assert victim in cluster.down and entry.rows == 90_000
    assert not any(victim in p.devices for p in entry.partitions)
    _heal(running, victim)  # its lease (a minute) has not run out: the coordinator commits it
    healed = cluster.entry("t/missed")
    assert any(victim in p.devices for p in healed.partitions), healed.partitions
    assert all(len(p.devices) == 2 for p in healed.partitions)
    assert cluster.devices[victim].stats().pending_partitions == 0
    cluster.drop("t/missed")


def test_a_decider_cut_while_it_commits_leaves_the_ingest_to_its_word(namespaced, monkeypatch):
    running, _ = namespaced
    cluster = running.cluster
    monkeypatch.setenv(settings.INGEST_LEASE_S.name, "3")
    before = _key_counts(cluster)
    decide = atomic._decide
    cut: list[str] = []

    def cut_then_decide(decider, record, dataset):
        cut.append(decider.name)
        running.cut(decider.name)  # the commit never reaches it
        decide(decider, record, dataset)

    atomic._decide = cut_then_decide
    try:
        started = time.perf_counter()
        with pytest.raises(atomic.OutcomeUnknown, match="only it knows"):
            cluster.ingest(particles.table(60_000, seed=5), "t/undecided", replicas=2)
        assert time.perf_counter() - started <= 3 * _bound_s() + SLACK_S
    finally:
        atomic._decide = decide
    (decider,) = cut
    _heal(running, decider)
    # the others ask it once their leases run out: it never committed, so all abort
    assert netns.wait_until(lambda: _settled(cluster), HEAL_S)
    cluster.refresh()
    assert "t/undecided" not in cluster.catalog
    assert _key_counts(cluster) == before


def test_a_link_cut_during_a_repair_leaves_each_copy_complete_or_absent(namespaced, monkeypatch):
    running, _ = namespaced
    cluster = running.cluster
    monkeypatch.setenv(settings.INGEST_LEASE_S.name, "3")
    rows = 300_000
    cluster.ingest(particles.table(rows, seed=11), "t/repaired", replicas=2, partitions=6)
    rng = random.Random(9)
    landed = 0
    for number in range(REPAIR_ROUNDS):
        entry = cluster.entry("t/repaired")
        gone = entry.partitions[number % len(entry.partitions)].devices[0]
        running.cut(gone)  # its partitions are under-replicated while it is away
        assert netns.wait_until(lambda gone=gone: _down(cluster, gone), HEAL_S)
        assert cluster.deficits()
        others = [n for n in cluster.devices if n != gone]
        victim = rng.choice(others)
        outcome = netns.cut_during(
            running,
            victim,
            rng.uniform(0.2, 1.0),
            lambda: cluster.repair(bandwidth_bytes_per_s=4e6),
        )
        assert not outcome.hung, f"round {number}: the repair hangs"
        landed += outcome.landed
        for name in (victim, gone):
            _heal(running, name)
        assert netns.wait_until(lambda: _settled(cluster), HEAL_S), "a copy outlived its lease"
        cluster.refresh()
        healed = cluster.entry("t/repaired")
        assert healed.rows == rows and not healed.unavailable
        assert all(len(p.devices) >= 2 for p in healed.partitions), healed.partitions
        assert cluster.scan("t/repaired").read_all().num_rows == rows
    print(f"repair rounds: {landed} of {REPAIR_ROUNDS} cuts landed mid-repair")
    assert landed, "no cut landed while the repair ran"
    cluster.drop("t/repaired")


def _down(cluster, name: str) -> bool:
    cluster.settle()
    return name in cluster.down
