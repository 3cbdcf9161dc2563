"""How many data partitions an erasure-coded ingest makes, and where they go: every partition
a query reads costs its device a run of its own, so a table that fills every device keeps at
most one data partition on each (a healthy query then costs what replicas 1 costs:
bench/redundancy.py)."""

from __future__ import annotations

from collections import Counter

import pytest

from quarry.coordinator.ingest.atomic import _place_stripes, _striped_count
from quarry.coordinator.membership.placement import Domain
from quarry.store import parity


def _data_per_device(text: str, devices: int) -> tuple[int, Counter]:
    code = parity.parse(text)
    assert code is not None
    count = _striped_count(code, devices, devices, devices)
    domains = {f"dev{i}": Domain(f"host{i}") for i in range(devices)}
    stripes, placement = _place_stripes(code, "t/p", 0, count, parity.PARITY_FIRST, domains)
    held = Counter(placement[str(p)][0] for group in stripes for p in group.data)
    return count, held


@pytest.mark.parametrize(
    ("text", "devices", "partitions"),
    [
        ("ec:4+2", 8, 8),  # K divides the devices: one on each
        ("ec:4+2", 10, 8),  # was 20, two on every device
        ("ec:4+2", 6, 4),  # was 12, two each
        ("ec:8+2", 10, 8),  # was 16, two on six devices
        ("ec:2+1", 4, 4),
    ],
)
def test_a_table_that_fills_every_device_keeps_at_most_one_data_partition_on_each(
    text, devices, partitions
):
    count, held = _data_per_device(text, devices)
    assert count == partitions
    assert max(held.values()) == 1 and sum(held.values()) == partitions


def test_a_smaller_table_or_more_partitions_asked_for_get_whole_groups():
    code = parity.Code(4, 2)
    assert _striped_count(code, 3, 10, 10) == 4  # rounded up: a table of three row groups
    assert _striped_count(code, 20, 10, 10) == 20  # two on every device, as asked
    assert _striped_count(code, 12, 8, 8) == 16  # 12 asked: whole rounds of eight devices
