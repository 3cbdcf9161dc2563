"""The flipped-value experiment, as a test (issue 33): a dataset of 100,000 rows whose column v
is all 1.0; one device holding a copy stopped, one 8-byte value in its LMDB file changed from 1.0
to 2.0 (a flipped bit on a disk or in a DIMM looks the same), the device started again. Every
pushdown mode answers max(v) = 1.0 and sum(v) = 100000.0 from the good replica, the damaged copy
is reported, and a scrub mends it. The same for a damaged metadata slice and a value cut short;
with one replica, a clear ``CorruptSlice`` in every mode, never a wrong answer."""

from __future__ import annotations

import json
import os
import signal
import struct
from pathlib import Path

import lmdb
import pyarrow as pa
import pytest

import quarry
from quarry.coordinator.query.planning import serving
from quarry.errors import CorruptSlice
from quarry.protocol.integrity import CopyPart
from quarry.pushdown import Pushdown
from quarry.store import naming
from tests.integration.test_cli import _quarry

ROWS = 100_000
# slices of 256 KiB: each partition of 50,000 rows is a few slices, so failover resumes mid-way
PROFILES = '[profiles.small]\nfrom = "host"\nkv_bytes_max = 262144\n'
ANSWER = "SELECT max(v) AS m, sum(v) AS s FROM t.{name}"
NOT_ONE = "SELECT id FROM t.{name} WHERE v <> 1.0"
READS_V = "SELECT sum(v * id) AS s FROM t.{name}"  # no zone map answers it: v must be read
ALL_MODES = tuple(Pushdown)  # server too: on a flat cluster, the host completes raw slices


NAMES = tuple(f"{copies}_{kind}" for kind in ("flip", "meta", "cut") for copies in ("two", "one"))


def _ones(name: str = "") -> pa.Table:
    """v all 1.0; ids of their own per dataset, so no two datasets store the same bytes."""
    first = NAMES.index(name) * ROWS if name else 0
    ids = pa.array(range(first, first + ROWS), pa.int64())
    return pa.table({"id": ids, "v": pa.array([1.0] * ROWS)})


def _sum_of_ids(name: str) -> float:
    first = NAMES.index(name) * ROWS
    return float((first + first + ROWS - 1) * ROWS // 2)


def _data_db(kv: Path) -> tuple[lmdb.Environment, object]:
    env = lmdb.open(str(kv), max_dbs=4, subdir=True)
    return env, env.open_db(b"data")


def _value(kv: Path, key: str) -> bytes:
    env, data = _data_db(kv)
    try:
        with env.begin() as txn:
            value = txn.get(key.encode(), db=data)
            assert value is not None, key
            return bytes(value)
    finally:
        env.close()


def _put(kv: Path, key: str, value: bytes) -> None:
    """Overwrite a value in place of the device's own writes (its version stays): a torn or
    misdirected write."""
    env, data = _data_db(kv)
    try:
        with env.begin(write=True) as txn:
            txn.put(key.encode(), value, db=data)
    finally:
        env.close()


def _flip(kv: Path, key: str, v_starts_at: int) -> None:
    """One 8-byte value of column v changed in the device's LMDB file, found by its bytes: a
    float64 1.0 (little-endian 0x3FF0000000000000) becomes 2.0; compressed, one byte of the
    column's stream is flipped instead (no raw 1.0 is left to find)."""
    value = _value(kv, key)
    path = kv / "data.mdb"
    raw = bytearray(path.read_bytes())
    assert raw.count(value) == 1, "the slice value lies once in the file"
    base = raw.find(value)
    at = value.find(struct.pack("<d", 1.0) * 4, v_starts_at)
    if at >= 0:
        raw[base + at : base + at + 8] = struct.pack("<d", 2.0)
    else:
        at = v_starts_at + (len(value) - v_starts_at) // 2
        raw[base + at] ^= 0x20
    path.write_bytes(bytes(raw))


def _damage(cluster, victims: dict[str, str]) -> None:
    """Stop every device, damage one copy of each dataset as ``victims`` says (name -> how:
    flip, meta, cut), start them again."""
    plan = []
    for name, how in victims.items():
        entry = cluster.entry(f"t/{name}")
        device = serving(cluster, entry)[0]  # the replica that serves partition 0
        slices = cluster.devices[device].describe("t", name, 0).slices
        plan.append((name, how, device, slices))
    kvs = {name: Path(cluster.info[name].data) / "kv" for name in cluster.devices}
    for name in sorted(cluster.devices):
        cluster.kill_device(name)
    for name, how, device, slices in plan:
        kv = kvs[device]
        if how == "flip":
            _flip(kv, naming.slice_key("t", name, 0, 1), slices[1].columns[0])
        elif how == "cut":
            key = naming.slice_key("t", name, 0, 2)
            _put(kv, key, _value(kv, key)[:-100])
        else:  # a zone map's max of 1.0 made 2.0 in the stored metadata slice
            key = naming.meta_key("t", name, 0)
            value = _value(kv, key)
            assert value.count(b'"max":1.0') >= 1
            _put(kv, key, value.replace(b'"max":1.0', b'"max":2.0'))
    for name in sorted(cluster.devices):
        cluster.restart_device(name)
    cluster.refresh()


@pytest.fixture(scope="module", params=["none", "zstd"])
def damaged(request, tmp_path_factory):
    """Two devices; each kind of damage on a dataset of two replicas and on one of one."""
    profiles = tmp_path_factory.mktemp("profiles") / "profiles.toml"
    profiles.write_text(PROFILES)
    with quarry.local(devices=2, profile="small", profiles_file=str(profiles)) as cluster:
        for name in NAMES:
            replicas = 2 if name.startswith("two") else 1
            cluster.ingest(
                _ones(name), f"t/{name}", replicas=replicas, partitions=2, compression=request.param
            )
        _damage(cluster, {name: name.split("_")[1] for name in NAMES})
        yield cluster, request.param


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["flip", "meta", "cut"])
def test_every_mode_answers_from_the_good_replica(damaged, kind):
    cluster, _ = damaged
    name = f"two_{kind}"
    for mode in ALL_MODES:
        answer = cluster.sql(ANSWER.format(name=name), pushdown=mode).read_all().to_pylist()
        assert answer == [{"m": 1.0, "s": float(ROWS)}], (mode, answer)
        assert cluster.sql(NOT_ONE.format(name=name), pushdown=mode).read_all().num_rows == 0
        read = cluster.sql(READS_V.format(name=name), pushdown=mode).read_all()
        assert read.column("s")[0].as_py() == _sum_of_ids(name), mode
    assert cluster.scan(f"t/{name}").read_all().num_rows == ROWS


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["flip", "meta", "cut"])
def test_the_damaged_copy_is_reported(damaged, kind):
    cluster, _ = damaged
    name = f"two_{kind}"
    victim = serving(cluster, cluster.entry(f"t/{name}"))[0]
    explained = cluster.explain(READS_V.format(name=name), analyze=True, pushdown="never")
    rows = explained.to_json()["analyze"]["devices"]
    assert sum(row["slices_rejected"] for row in rows) == 1
    entry = cluster.entry(f"t/{name}")
    assert sum(row["slices_verified"] for row in rows) == sum(p.slices for p in entry.partitions)
    failovers = [f for row in rows for f in row.get("failovers", ())]
    (failover,) = [f for f in failovers if f"of t/{name}" in f["error"]]
    where = "the metadata slice" if kind == "meta" else f"slice {2 if kind == 'cut' else 1}"
    assert f"{where} of partition 0 of t/{name} on device {victim}" in failover["error"]
    assert failover["from"] == victim
    status = {row.device: row.stats for row in cluster.status()}
    assert status[victim].corrupt_copies >= 1


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["flip", "meta", "cut"])
def test_with_one_replica_a_clear_error_in_every_mode_never_a_wrong_answer(damaged, kind):
    cluster, _ = damaged
    name = f"one_{kind}"
    where = "the metadata slice" if kind == "meta" else f"slice {2 if kind == 'cut' else 1}"
    for mode in ALL_MODES:
        with pytest.raises(CorruptSlice, match=f"{where} of partition 0 of t/{name}") as raised:
            cluster.sql(READS_V.format(name=name), pushdown=mode).read_all()
        assert raised.value.dataset == f"t/{name}" and raised.value.partition == 0
        assert "good copy" in str(raised.value)
        for sql in (ANSWER, NOT_ONE):  # answered from zone maps that check, or refused
            try:
                rows = cluster.sql(sql.format(name=name), pushdown=mode).read_all().to_pylist()
            except CorruptSlice:
                continue
            assert rows in ([{"m": 1.0, "s": float(ROWS)}], []), (mode, sql, rows)
    with pytest.raises(CorruptSlice):
        cluster.scan(f"t/{name}").read_all()


@pytest.mark.slow
def test_scrub_mends_every_copy_a_good_replica_holds(damaged):
    """Runs after the tests above (their damage is still there): a scrub finds every damaged
    copy, mends those a replica holds good, and leaves the single ones reported."""
    cluster, _ = damaged
    progress = []
    report = cluster.scrub(progress=lambda done, total: progress.append((done, total)))
    found = {(c.dataset, c.part) for d in report.devices for c in d.corrupt}
    assert {(f"two_{k}", p) for k, p in (("flip", "slice"), ("cut", "slice"))} <= found
    assert ("two_meta", CopyPart.METADATA) in found and ("one_meta", CopyPart.METADATA) in found
    assert progress and progress[-1][0] == progress[-1][1]
    mended = {m.copy.dataset for m in report.repair.mended}
    assert {"two_flip", "two_cut", "two_meta"} <= mended
    assert {u.copy.dataset for u in report.repair.unmended} == {"one_flip", "one_cut", "one_meta"}
    assert report.repair.copied == []  # one slice, or one metadata slice, each in place
    again = cluster.scrub()
    left = {c.dataset for d in again.devices for c in d.corrupt}
    assert left == {"one_flip", "one_cut", "one_meta"}  # the good copies scrub clean
    for kind in ("flip", "meta", "cut"):  # each device holds a good copy again
        entry = cluster.entry(f"t/two_{kind}")
        assert all(len(p.devices) == 2 for p in entry.partitions)
        for device in entry.partitions[0].devices:
            client = cluster.devices[device]
            rows = pa.Table.from_batches(list(client.batches(client.scan("t", entry.name, 0))))
            assert rows.num_rows == entry.partitions[0].rows
            assert rows.column("v").to_pylist() == [1.0] * rows.num_rows
    for stats in (row.stats for row in cluster.status()):
        assert stats.last_scrub is not None and stats.last_scrub.slices > 0


@pytest.mark.slow
def test_scrub_and_status_from_the_command_line(tmp_path):
    try:  # `down` even after an `up` that started devices and then failed
        _quarry("up", "--devices", "2", "--detach", cwd=tmp_path)
        path = tmp_path / "ones.parquet"
        import pyarrow.parquet as pq

        pq.write_table(_ones(), path)
        _quarry("ingest", str(path), "--dataset", "t/ones", "--replicas", "2", cwd=tmp_path)
        assert "never scrubbed" in _quarry("status", cwd=tmp_path).stdout
        assert "clean" in _quarry("scrub", cwd=tmp_path).stdout
        rows = json.loads(_quarry("status", "--json", cwd=tmp_path).stdout)
        with quarry.connect(tmp_path / ".quarry" / "cluster.json") as cluster:
            serves = serving(cluster, cluster.entry("t/ones"))[0]
        victim = next(row for row in rows if row["device"] == serves)
        os.kill(victim["pid"], signal.SIGKILL)
        (kv,) = [p for p in tmp_path.rglob("kv") if p.parent.name == victim["device"]]
        key = naming.slice_key("t", "ones", 0, 0)
        _put(kv, key, _value(kv, key)[:-8])
        _quarry("device", "restart", victim["device"], cwd=tmp_path)
        sql = "SELECT max(v) AS m, sum(v) AS s FROM ones"
        analyzed = _quarry("sql", sql, "--analyze", "--pushdown", "never", cwd=tmp_path).stdout
        shown = " ".join(analyzed.split())  # as a terminal wraps it, on one line
        assert "1 damaged copies rejected" in shown and "slice 0 of partition 0" in shown
        answer = _quarry("sql", sql, "--format", "json", cwd=tmp_path).stdout
        assert json.loads(answer)["result"] == [{"m": 1.0, "s": float(ROWS)}]
        scrubbed = json.loads(_quarry("scrub", "--json", cwd=tmp_path).stdout)
        assert scrubbed["corrupt"] == 1 and len(scrubbed["repair"]["mended"]) == 1
        shown = _quarry("status", cwd=tmp_path).stdout
        assert "1 damaged, 1 repaired" in shown
        assert "clean" in _quarry("scrub", cwd=tmp_path).stdout
    finally:
        _quarry("down", cwd=tmp_path)
