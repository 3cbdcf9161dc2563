"""Why work came back, and quarantine, on real devices: each push-back counted by its reason in
EXPLAIN ANALYZE and in the devices' metrics (the same figures), a stage that fails on a device
quarantining its sub-plan's shape there until it expires or ``quarry quarantine clear``; the
answers DuckDB's throughout."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import quarry
from quarry import cli
from quarry.protocol.stage import PushBack
from quarry.samples import particles
from tests.device.test_metrics import scrape
from tests.plan.harness import assert_same_rows, duckdb_answer

QUARANTINE_S = 3.0  # long enough for the next query to meet it, short enough to wait out
# slices of 64 KiB: 40,000 rows make 28 of them, enough for a controller to measure and decide
PROFILES = '[profiles.small]\nfrom = "host"\nkv_bytes_max = 65536\n'
SQL = "SELECT count(*) AS n, sum(ke) AS s FROM particles WHERE ke > {low}"
POLICY = {"warmup_chunks": 0, "sample_chunks": 1}  # decide after one chunk measured


@pytest.fixture(scope="module")
def watched(tmp_path_factory):
    """Two devices serving metrics, reading a fault file, quarantining for ``QUARANTINE_S``:
    settings a device reads when it starts, so these tests share a cluster of their own."""
    root = tmp_path_factory.mktemp("pushed_back")
    (root / "profiles.toml").write_text(PROFILES)
    faults = root / "faults"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("QUARRY_METRICS_PORT", "0")
        patch.setenv("QUARRY_FAULT_FILE", str(faults))
        patch.setenv("QUARRY_QUARANTINE_S", str(QUARANTINE_S))
        with quarry.local(
            devices=2, profile="small", profiles_file=str(root / "profiles.toml")
        ) as c:
            for name in ("QUARRY_METRICS_PORT", "QUARRY_FAULT_FILE", "QUARRY_QUARANTINE_S"):
                patch.delenv(name)
            table = particles.table(40_000, seed=3)
            c.ingest(table, "physics/particles", partitions=4)
            ports = {
                spec.name: json.loads((Path(spec.data) / "ready.json").read_text())["metrics_port"]
                for spec in c.specs
            }
            c.sql(SQL.format(low=0), pushdown="always").read_all()  # each engine's first run
            yield c, table, ports, faults


def _run(cluster, table, low: float, pushdown: str = "always", **options):
    """The query run and checked against DuckDB; what each device did, by name."""
    sql = SQL.format(low=low)
    planned = cluster.query(sql, pushdown=pushdown, **options)
    return _ran(planned, table, sql)


def _ran(planned, table, sql: str):
    result = planned.execute().read_all()
    assert_same_rows(result, duckdb_answer(table, "particles", sql), ordered=True, context=sql)
    analyzed = planned.explain(analyze=True).analyze
    return analyzed, {row.device: row.counters for row in analyzed.devices}


def _moved(before: dict, after: dict, reason: PushBack) -> int:
    metric = f"quarry_pushed_back_slices_total{{reason={reason.value}}}"
    return int(after[metric] - before[metric])


def _held(cluster) -> dict[str, list[dict]]:
    """What ``quarry status --json`` lists as quarantined, per device."""
    shown = CliRunner().invoke(
        cli.app, ["status", "--json", "--cluster", str(cluster.cluster_file)]
    )
    assert shown.exit_code == 0, shown.output
    return {row["device"]: row["quarantined"] for row in json.loads(shown.output)}


@pytest.mark.slow
def test_push_backs_say_why_in_explain_analyze_and_in_the_metrics(watched, monkeypatch):
    """A drive loaded after the query was planned hands the rest back as ``busy``; a sub-plan a
    drive cannot run goes back as ``capability``. EXPLAIN ANALYZE counts each reason per
    device, says it in words, and each device's scrape moved by the same counts."""
    cluster, table, ports, _ = watched
    planned = cluster.query(SQL.format(low=1.0), pushdown="auto", chunk_slices=1, policy=POLICY)
    assert {c.cut for c in planned.choices.values()} == {"full"}  # an idle drive is worth it
    before = {name: scrape(port) for name, port in ports.items()}
    cluster.load("dev0", 0.9, seconds=30)
    try:
        analyzed, counted = _ran(planned, table, SQL.format(low=1.0))
    finally:
        cluster.load("dev0", 0.0, seconds=0.1)  # load ends: the next query meets an idle drive
    by = counted["dev0"].pushed_back_by()
    assert list(by) == [PushBack.BUSY] and by[PushBack.BUSY] > 0, by
    assert _moved(before["dev0"], scrape(ports["dev0"]), PushBack.BUSY) == by[PushBack.BUSY]
    with cli.console.capture() as captured:
        cli._print_analyzed(analyzed)
    assert f"dev0: pushed back {by[PushBack.BUSY]} (busy {by[PushBack.BUSY]})" in captured.get()

    from quarry.coordinator.query import fragments
    from quarry.protocol.stage import Stage

    original = fragments.device_stages

    def beyond_the_devices(fragment):  # a plan no device's engine can read
        stages, schema, complete_from = original(fragment)
        return {**stages, Stage.FULL: b"\x08\x01garbage"}, schema, complete_from

    monkeypatch.setattr(fragments, "device_stages", beyond_the_devices)
    before = {name: scrape(port) for name, port in ports.items()}
    analyzed, counted = _run(cluster, table, 1.5)
    monkeypatch.undo()
    for name, port in ports.items():
        by = counted[name].pushed_back_by()
        assert by == {PushBack.CAPABILITY: counted[name].slices_scanned}, (name, by)
        assert counted[name].slices_executed == 0
        assert _moved(before[name], scrape(port), PushBack.CAPABILITY) == by[PushBack.CAPABILITY]
    reasons = {d.reason for p in analyzed.partitions for d in p.decisions}
    assert all("cannot run the sub-plan" in reason for reason in reasons), reasons


@pytest.mark.slow
def test_a_failed_stage_quarantines_its_shape_until_it_expires_or_is_cleared(watched):
    """dev0's stage fails (a fault point): that shape is quarantined on dev0 for the dataset,
    the next query of it (other constants) is handed back whole by dev0 and run on the host,
    ``quarry status`` and the metrics list it, and it lifts by itself after
    ``QUARRY_QUARANTINE_S``, or at once by ``quarry quarantine clear``. dev1 runs its share
    throughout, and every answer is DuckDB's."""
    cluster, table, ports, faults = watched

    def quarantined_by_a_failed_stage(low: float) -> None:
        faults.write_text("dev0:stage")
        try:
            _, counted = _run(cluster, table, low)
        finally:
            faults.write_text("")
        by = counted["dev0"].pushed_back_by()
        assert PushBack.FAILED_STAGE in by and set(by) <= {"failed_stage", "quarantine"}, by
        assert counted["dev1"].slices_pushed_back == 0

    quarantined_by_a_failed_stage(1.0)
    (held,) = _held(cluster)["dev0"]
    assert (held["dataset"], held["cause"]) == ("physics/particles", "failed_stage")
    assert "fault injected" in held["detail"] and _held(cluster)["dev1"] == []
    assert scrape(ports["dev0"])["quarry_quarantined_plans"] == 1

    _, counted = _run(cluster, table, 2.0)  # the same shape: not run on dev0
    slices = counted["dev0"].slices_scanned  # read raw by the host
    assert counted["dev0"].pushed_back_by() == {PushBack.QUARANTINE: slices} and slices > 0
    assert counted["dev0"].slices_executed == 0 and counted["dev1"].slices_executed > 0

    deadline = time.monotonic() + QUARANTINE_S + 10
    while _held(cluster)["dev0"] and time.monotonic() < deadline:  # it expires by itself
        time.sleep(0.5)
    _, counted = _run(cluster, table, 2.5)
    assert counted["dev0"].slices_pushed_back == 0 and counted["dev0"].slices_executed > 0

    quarantined_by_a_failed_stage(3.0)
    cleared = CliRunner().invoke(
        cli.app,
        ["quarantine", "clear", "--device", "dev0", "--cluster", str(cluster.cluster_file)],
    )
    assert cleared.exit_code == 0, cleared.output
    assert "dev0: 1 quarantined sub-plan shapes lifted" in cleared.output
    assert _held(cluster)["dev0"] == [] and scrape(ports["dev0"])["quarry_quarantined_plans"] == 0
    _, counted = _run(cluster, table, 3.5)
    assert counted["dev0"].slices_pushed_back == 0 and counted["dev0"].slices_executed > 0
