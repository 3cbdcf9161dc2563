"""The work counters, declared once: the wire, the device's tally, the host's report and
EXPLAIN ANALYZE's rows all take their fields from ``WorkCounters``, so a counter added there
shows in every one of them (and none keeps a list of its own)."""

from __future__ import annotations

from dataclasses import fields

import pytest

from quarry.coordinator.dispatch.report import (
    DeviceRow,
    LevelRow,
    WorkReport,
    per_device,
    per_level,
)
from quarry.device.loop import Counters
from quarry.protocol.counters import COUNTERS, WorkCounters
from quarry.protocol.work import LevelReport, PartitionReport, WorkMetrics

# every counter a different value, so a counter dropped or crossed with another shows
EACH = WorkCounters(**{name: index + 1 for index, name in enumerate(COUNTERS)})


def _doubled(counted: WorkCounters) -> WorkCounters:
    return WorkCounters(**{name: 2 * getattr(counted, name) for name in COUNTERS})


def test_counters_add_up_and_none_is_zero():
    assert WorkCounters().plus(EACH) == EACH
    assert WorkCounters.sum([EACH, EACH]) == _doubled(EACH)
    assert WorkCounters.sum([]) == WorkCounters()
    assert all(getattr(WorkCounters(), name) == 0 for name in COUNTERS)


@pytest.mark.parametrize("holder", [WorkMetrics, Counters, WorkReport, DeviceRow, LevelRow])
def test_no_holder_declares_a_counter_of_its_own(holder):
    """Each holds the one declaration instead of fields of the same names."""
    names = {f.name for f in fields(holder)}
    assert not names & set(COUNTERS), holder
    assert any(f.type in ("WorkCounters", WorkCounters) for f in fields(holder)), holder


def test_every_counter_crosses_the_wire():
    metrics = WorkMetrics(EACH, wall_s=1.5)
    assert WorkMetrics.from_json(metrics.to_json()) == metrics
    assert {name: metrics.flat_json()[name] for name in COUNTERS} == EACH.to_json()
    with pytest.raises(ValueError, match=r"WorkMetrics\.counters\.rows_read"):
        WorkMetrics.from_json({"counters": {"rows_read": -1}})


def test_the_device_tally_counts_every_counter():
    tally = Counters()
    tally.count(**{name: getattr(EACH, name) for name in COUNTERS})
    other = Counters(EACH)
    tally.add(other)
    frozen = tally.frozen(cpu_s=0.25, wall_s=1.0)
    assert frozen.counters == WorkCounters(
        **{**_doubled(EACH).to_json(), "device_cpu_s": 0.25}  # the CPU is the request's share
    )


def _report(device: str, partition: int, counted: WorkCounters) -> WorkReport:
    report = WorkReport(device, "fragment", partition, "subplan")
    report.add_device(PartitionReport(partition, (), WorkMetrics(counted)), None)
    return report


def test_the_report_and_explains_rows_show_every_counter():
    """A partition's row, a device's sum and a level's sum each carry every counter."""
    reports = [_report("dev0", 0, EACH), _report("dev0", 1, EACH), _report("dev1", 2, EACH)]
    assert reports[0].counters == EACH
    row = reports[0].to_json()
    assert {name: row[name] for name in COUNTERS} == EACH.to_json()
    dev0, dev1 = per_device(reports)
    assert (dev0.device, dev0.partitions, dev0.counters) == ("dev0", 2, _doubled(EACH))
    shown = dev0.to_json()
    assert {name: shown[name] for name in COUNTERS} == _doubled(EACH).to_json()
    assert dev1.counters == EACH

    server = WorkReport("s0", "fragment", 0, "subplan")
    below = LevelReport("s0d0", (), WorkMetrics(EACH), above="s0")
    server.add_device(PartitionReport(0, (), WorkMetrics(EACH), below=(below, below)), None)
    levels = per_level([server], {"s0"})
    assert levels is not None
    (drive,) = levels.drives
    assert (drive.device, drive.above, drive.server) == ("s0d0", "s0", False)
    assert drive.counters == _doubled(EACH)
    shown = levels.to_json()["drives"][0]
    assert {name: shown[name] for name in COUNTERS} == _doubled(EACH).to_json()
    # the partition's row shows the level below flat, as EXPLAIN ANALYZE always has
    (level,) = server.to_json()["below"][:1]
    assert {name: level["metrics"][name] for name in COUNTERS} == EACH.to_json()
