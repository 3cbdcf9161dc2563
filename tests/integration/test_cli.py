"""The command line as a user types it: up --detach, ingest, datasets --json, scan, down."""

import json
import os
import re

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import quarry
from quarry.cli import app
from quarry.samples import particles
from tests.commands import run_quarry

CUTS = ("full", "filter", "raw")


_quarry = run_quarry


@pytest.mark.slow
def test_up_ingest_datasets_scan_down(tmp_path):
    path = tmp_path / "particles.parquet"
    table = particles.table(1_000_000, seed=11)
    pq.write_table(table, path)
    try:  # `down` even after an `up` that started its devices and then failed
        _quarry("up", "--devices", "4", "--detach", cwd=tmp_path)
        status = json.loads(_quarry("status", "--json", cwd=tmp_path).stdout)
        assert [row["up"] for row in status] == [True] * 4
        ingested = _quarry(
            "ingest",
            str(path),
            "--dataset",
            "physics/particles",
            "--compression",
            "lz4",
            "--json",
            cwd=tmp_path,
        )
        listed = json.loads(_quarry("datasets", "--json", cwd=tmp_path).stdout)
        (entry,) = listed
        stored = json.loads(ingested.stdout)  # the dataset as listed, and how long it took
        assert list(stored) == [*entry, "seconds"] and stored["rows"] == entry["rows"]
        assert entry["dataset"] == "physics/particles" and entry["rows"] == 1_000_000
        assert len(entry["devices"]) == 4
        assert sum(d["partitions"] for d in entry["devices"].values()) == entry["partitions"]
        assert sum(d["rows"] for d in entry["devices"].values()) == 1_000_000
        described = json.loads(
            _quarry("describe", "physics/particles", "--json", cwd=tmp_path).stdout
        )
        with quarry.connect(tmp_path / ".quarry" / "cluster.json") as cluster:
            back = cluster.scan("physics/particles").read_all().sort_by("id")
            # what the commands print is the Python records' JSON, key for key
            assert listed == [d.to_json() for d in cluster.datasets()]
            assert described == cluster.describe("physics/particles").to_json()
            shown = json.loads(_quarry("status", "--json", cwd=tmp_path).stdout)
            _same_status(shown, [row.to_json() for row in cluster.status()])
        assert back.equals(pq.read_table(path).sort_by("id"))
        detail = described["partitions_detail"]
        assert [p["partition"] for p in detail] == list(range(described["partitions"]))
        assert described["columns"][0] == {"name": "id", "type": "int64"}
        _explain_shows_the_cut(tmp_path)
        again = _quarry(
            "ingest", str(path), "--dataset", "physics/particles", cwd=tmp_path, check=False
        )
        assert again.returncode == 2
        assert "already exists" in again.stderr and "Traceback" not in again.stderr
    finally:
        _quarry("down", cwd=tmp_path, check=False)
    gone = _quarry("status", cwd=tmp_path, check=False)
    assert gone.returncode == 2 and "no cluster file" in gone.stderr


@pytest.mark.slow
def test_up_with_storage_servers_and_down_stops_every_process(tmp_path):
    """`quarry up --servers`: the host sees the servers, EXPLAIN ANALYZE shows each server's
    drives below it, and `quarry down` stops servers and drives."""
    path = tmp_path / "particles.parquet"
    table = particles.table(100_000, seed=12)
    pq.write_table(table, path)
    try:  # `down` even after an `up` that started devices and then failed
        _quarry("up", "--servers", "2", "--drives-per-server", "2", "--detach", cwd=tmp_path)
        status = json.loads(_quarry("status", "--json", cwd=tmp_path).stdout)
        assert sorted(row["device"] for row in status) == ["s0", "s1"]
        assert all(row["up"] for row in status)
        _quarry("ingest", str(path), "--dataset", "physics/particles", cwd=tmp_path)
        sql = "SELECT count(*) AS n FROM particles WHERE ke > 1"
        shown = _quarry("sql", sql, "--pushdown", "server", "--analyze", cwd=tmp_path).stdout
        assert "└ s0d0" in shown and "└ s1d1" in shown and "drive links" in shown
        assert "time, wall/cpu ms: query" in shown and "execute" in shown
        answer = _quarry("sql", sql, "--format", "json", cwd=tmp_path).stdout
        expected = sum(1 for ke in table.column("ke").to_pylist() if ke > 1)
        assert json.loads(answer)["result"] == [{"n": expected}]
        spec = json.loads((tmp_path / ".quarry" / "cluster.json").read_text())
    finally:
        _quarry("down", cwd=tmp_path)
    pids = [d["pid"] for server in spec["devices"] for d in [server, *server["drives"]]]
    assert len(pids) == 6
    from quarry.coordinator.processes.spawn import is_device

    assert not [pid for pid in pids if is_device(pid)], "a server or drive still runs"


@pytest.mark.slow
def test_up_with_a_layout_three_levels_deep(tmp_path):
    """`quarry up --layout`: a server in front of a drive and of another server; EXPLAIN ANALYZE
    indents each level under the one above, and `quarry down` stops all five processes."""
    layout = json.dumps([["host", ["host", "host"]]])
    try:  # `down` even after an `up` that started devices and then failed
        _quarry("up", "--layout", layout, "--detach", cwd=tmp_path)
        table = particles.table(50_000, seed=13)
        path = tmp_path / "particles.parquet"
        pq.write_table(table, path)
        _quarry("ingest", str(path), "--dataset", "physics/particles", "--partitions", "4",
                cwd=tmp_path)  # fmt: skip
        sql = "SELECT count(*) AS n FROM particles WHERE ke > 1"
        shown = _quarry("sql", sql, "--pushdown", "always", "--analyze", cwd=tmp_path).stdout
        assert "└ s0s0" in shown and "  └ s0s0d1" in shown
        spec = json.loads((tmp_path / ".quarry" / "cluster.json").read_text())
    finally:
        _quarry("down", cwd=tmp_path)

    def pids(entries):
        return [p for e in entries for p in [e["pid"], *pids(e.get("drives", []))]]

    assert len(pids(spec["devices"])) == 5
    from quarry.coordinator.processes.spawn import is_device

    assert not [pid for pid in pids(spec["devices"]) if is_device(pid)]
    wrong = _quarry("up", "--layout", '[["host", []]]', cwd=tmp_path, check=False)
    assert wrong.returncode == 2 and "--layout" in wrong.stderr


def test_errors_are_one_clear_line(tmp_path):
    done = _quarry("datasets", cwd=tmp_path, check=False)
    assert done.returncode == 2
    assert "no cluster file" in done.stderr and "quarry up" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_up_with_one_profile_per_device(tmp_path):
    wrong = _quarry(
        "up", "--devices", "3", "--profile", "host,kinetic", "--detach", cwd=tmp_path, check=False
    )
    assert wrong.returncode == 2 and "2 profiles given for 3 devices" in wrong.stderr
    try:  # `down` even after an `up` that started devices and then failed
        _quarry("up", "--devices", "2", "--profile", "host,kinetic", "--detach", cwd=tmp_path)
        status = json.loads(_quarry("status", "--json", cwd=tmp_path).stdout)
        assert [row["profile"] for row in status] == ["host", "kinetic"]
        dead = next(row for row in status if row["device"] == "dev1")
        os.kill(dead["pid"], 9)  # a device that crashed before `down`
    finally:
        stopped = _quarry("down", cwd=tmp_path).stdout
    assert re.search(r"dev0 \(pid \d+\): stopped", stopped), stopped
    assert re.search(r"dev1 \(pid \d+\): was not running", stopped), stopped
    assert not list(tmp_path.rglob("ready.json"))  # nothing left that looks like a live start


def _same_status(shown: list[dict], held: list[dict]) -> None:
    """`quarry status --json` and ``Cluster.status()``: the same keys in the same order, the
    same devices; the counts of work may move between the two asks."""
    assert [list(row) for row in shown] == [list(row) for row in held]
    stable = ("device", "address", "up", "profile", "pid", "partitions", "exchanges_max")
    assert [[row[k] for k in stable] for row in shown] == [[row[k] for k in stable] for row in held]
    assert list(shown[0])[:5] == ["device", "address", "up", "profile", "pid"]
    assert {"keys", "file_bytes", "running", "admitted", "refused"} <= set(shown[0])


def _explain_shows_the_cut(cwd) -> None:
    """`--explain` under auto prints, in table output, the cut the cost model chose: one row per
    cut, the chosen one marked, with its estimate and what it ships."""
    shown = _quarry(
        "sql",
        "SELECT count(*) FROM physics.particles WHERE ke > 10",
        "--pushdown",
        "auto",
        "--explain",
        cwd=cwd,
    ).stdout
    assert "cost model: the cut per fragment" in shown, shown
    rows = [
        [cell.strip() for cell in re.split(r"[│|]", line)[1:-1]]
        for line in shown.splitlines()
        if re.search(r"[│|]\s*(full|filter|raw)( \*)?\s*[│|]", line)
    ]
    assert [row[1].removesuffix(" *") for row in rows] == list(CUTS), shown
    assert rows[0][0].startswith("__quarry_fragment_"), shown
    chosen = [row for row in rows if row[1].endswith(" *")]
    assert len(chosen) == 1, shown
    assert chosen[0][1].removesuffix(" *") in CUTS and float(chosen[0][2]) >= 0, shown


def test_de_is_one_command():
    """`quarry de` is registered once; `quarry genes` holds only the matrix-only commands."""
    listed = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert listed.exit_code == 0, listed.output
    assert len(re.findall(r"^│ de\b", listed.output, re.MULTILINE)) == 1, listed.output
    grouped = CliRunner().invoke(app, ["genes", "--help"], env={"COLUMNS": "200"})
    assert grouped.exit_code == 0, grouped.output
    assert re.search(r"^│ ingest\b", grouped.output, re.MULTILINE), grouped.output
    assert not re.search(r"^│ de\b", grouped.output, re.MULTILINE), grouped.output
    helped = CliRunner().invoke(app, ["de", "--help"])
    assert helped.exit_code == 0 and "--groupby" in helped.output


def test_an_error_is_one_line_however_long(tmp_path):
    missing = tmp_path / ("deep-" * 40) / "cluster.json"
    done = _quarry("status", "--cluster", str(missing), cwd=tmp_path, check=False)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and str(missing) in done.stderr, done.stderr


def test_explain_verbose_lists_the_rules_that_fired_in_order(tmp_path):
    """`quarry sql --explain --verbose`: after the cut, each rule that fired, in order, with the
    cut it left; the same list under ``rules`` in JSON; --verbose alone says what it needs."""
    path = tmp_path / "particles.parquet"
    pq.write_table(particles.table(20_000, seed=14), path)
    try:  # `down` even after an `up` that started devices and then failed
        _quarry("up", "--devices", "2", "--detach", cwd=tmp_path)
        _quarry("ingest", str(path), "--dataset", "physics/particles", cwd=tmp_path)
        sql = "SELECT count(*) AS n FROM particles WHERE ke > 10"
        shown = _quarry(
            "sql", sql, "--pushdown", "always", "--explain", "--verbose", cwd=tmp_path
        ).stdout
        as_json = _quarry(
            "sql", sql, "--explain", "--verbose", "--format", "json", cwd=tmp_path
        ).stdout
        alone = _quarry("sql", sql, "--verbose", cwd=tmp_path, check=False)
    finally:
        _quarry("down", cwd=tmp_path)
    rules = ["push_filter", "push_projection", "split_predicate_by_capability"]
    rules += ["split_aggregate", "prune_slices"]
    listed = re.findall(r"^rule (\d+): (\w+)$", shown, re.MULTILINE)
    assert listed == [(str(n), rule) for n, rule in enumerate(rules, 1)], shown
    assert shown.index("sub-plan __quarry_fragment_0") < shown.index("rule 1: push_filter")
    after_split = shown.split("rule 4: split_aggregate", 1)[1].split("rule 5:", 1)[0]
    assert "aggregate: count(1)" in after_split and "filter (ke > 10.0)" in after_split, shown
    assert "zone-map predicates: ke > 10.0" in shown.split("rule 5: prune_slices", 1)[1]
    steps = json.loads(as_json)["explain"]["rules"]
    assert [step["rule"] for step in steps] == rules
    assert all(step["plan"].startswith("super-plan:") for step in steps)
    assert alone.returncode == 2 and "--explain" in alone.stderr
