"""Units of work: a new kind is one module, and runs through the one loop and dispatch."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import quarry
from quarry.device import unit as units
from quarry.device.units.sample import SampleUnit, every_kth
from quarry.protocol.stage import Skip, Stage
from quarry.samples import particles

EVERY = 7


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two devices whose key-values hold 64 KiB, so a small table makes many slices."""
    profiles = tmp_path_factory.mktemp("profiles") / "profiles.toml"
    profiles.write_text('[profiles.small]\nfrom = "host"\nkv_bytes_max = 65536\n')
    with quarry.local(devices=2, profile="small", profiles_file=str(profiles)) as c:
        yield c


@pytest.fixture(scope="module")
def sampled(cluster):
    table = particles.table(30_000, seed=11)
    cluster.ingest(table, "units/particles", partitions=3)
    return cluster.entry("units/particles")


def _expected(cluster, entry) -> pa.Table:
    """Every 7th row of every slice, from a raw scan (one batch per slice)."""
    batches = []
    for p in entry.partitions:
        client = cluster.devices[p.devices[0]]
        for batch in client.batches(client.scan(entry.domain, entry.name, p.partition)):
            batches.append(every_kth(batch, EVERY))
    return pa.Table.from_batches(batches, schema=entry.schema)


def _sorted(table: pa.Table) -> pa.Table:
    return table.sort_by("id")


def test_the_sample_unit_is_found_without_being_listed():
    """The unit lives in one module of quarry.device.units; nothing registers it by hand."""
    assert units.lookup("sample") is SampleUnit
    assert SampleUnit.__module__ == "quarry.device.units.sample"
    assert all("sample" not in module for module in units.UNIT_MODULES)


def test_a_sample_with_forced_push_back_is_annotated_like_any_work(cluster, sampled):
    entry = sampled
    partition = max(entry.partitions, key=lambda p: p.slices)
    assert partition.slices >= 3
    forced = {(entry.qualified, partition.partition): [{"first": 1, "end": 3, "stage": "raw"}]}
    result = cluster.sample(entry.qualified, EVERY, decisions=forced)
    assert _sorted(result.table).equals(_sorted(_expected(cluster, entry)))
    report = next(r for r in result.reports if r.partition == partition.partition)
    stages = [(d.first, d.end, d.stage) for d in report.decisions]
    assert (1, 3, Stage.RAW) in stages
    assert report.counters.slices_pushed_back == 2 and report.slices_raw == 2
    # every slice read once, whether it ran on the device or came back raw
    assert report.counters.slices_scanned == report.counters.slices_total == partition.slices
    assert report.counters.rows_read == partition.rows
    assert report.counters.slices_executed == partition.slices - 2


def test_never_samples_on_the_host_and_ships_every_row(cluster, sampled):
    always = cluster.sample(sampled.qualified, EVERY)
    never = cluster.sample(sampled.qualified, EVERY, pushdown="never")
    assert _sorted(never.table).equals(_sorted(always.table))
    assert never.bytes_shipped > 4 * always.bytes_shipped  # the point of pushing it down
    assert all(r.mode == "scan" and r.counters.slices_executed == 0 for r in never.reports)


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_the_sample_does_not_depend_on_the_devices_decisions(cluster, sampled, data):
    entry = sampled
    forced = {}
    for p in entry.partitions:
        first = data.draw(st.integers(0, p.slices - 1))
        end = data.draw(st.integers(first, p.slices))
        forced[(entry.qualified, p.partition)] = [{"first": first, "end": end, "stage": "raw"}]
    result = cluster.sample(entry.qualified, EVERY, decisions=forced)
    assert _sorted(result.table).equals(_sorted(_expected(cluster, entry)))
    assert not any(d.stage is Skip.PRUNED for r in result.reports for d in r.decisions)
