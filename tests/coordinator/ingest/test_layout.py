"""Ingest's layout rules (``coordinator/ingest/layout.py``), without a cluster: how many
partitions a table gets, and how many rows travel together and share a slice."""

from __future__ import annotations

import pyarrow as pa
import pytest

from quarry import settings
from quarry.coordinator.ingest import layout

MIB = 1 << 20


def _first(rows: int = 1_000) -> pa.RecordBatch:
    return pa.record_batch({"k": pa.array(range(rows), pa.int64())})  # 8 bytes a row


def _rows(mib: float) -> int:
    return int(mib * MIB) // 8


@pytest.fixture
def default_size(monkeypatch):
    monkeypatch.delenv(settings.PARTITION_MIB_MIN.name, raising=False)  # conftest sets 0
    return settings.PARTITION_MIB_MIN.default


def test_a_table_under_the_partition_size_is_one_partition(default_size):
    assert layout.partitions_for(_first(), _rows(default_size) - 1, drives=4) == 1
    assert layout.partitions_for(_first(), _rows(2 * default_size) - 1, drives=4) == 1


def test_each_partition_holds_at_least_the_partition_size_up_to_one_a_drive(default_size):
    assert layout.partitions_for(_first(), _rows(2 * default_size), drives=4) == 2
    assert layout.partitions_for(_first(), _rows(3.5 * default_size), drives=4) == 3
    assert layout.partitions_for(_first(), _rows(100 * default_size), drives=4) == 4
    assert layout.partitions_for(_first(), None, drives=4) == 4  # a stream of unknown length


def test_the_partition_size_is_a_setting_and_zero_deals_a_partition_a_row_group(monkeypatch):
    three_groups = 3 * layout.ROW_GROUP_BYTES // 8
    monkeypatch.setenv(settings.PARTITION_MIB_MIN.name, "0")
    assert layout.partitions_for(_first(), three_groups, drives=4) == 3
    assert layout.partitions_for(_first(), 100, drives=4) == 1
    monkeypatch.setenv(settings.PARTITION_MIB_MIN.name, "1")
    assert layout.partitions_for(_first(), three_groups, drives=4) == 3
    monkeypatch.setenv(settings.PARTITION_MIB_MIN.name, "4")
    assert layout.partitions_for(_first(), three_groups, drives=4) == 1


def test_contiguous_groups_are_one_slice_and_slices_one_size():
    first = _first()
    slice_rows = layout.contiguous_slices(first, kv_bytes_max=4 * MIB)
    assert slice_rows == layout.slice_rows_for(pa.Table.from_batches([first]), 4 * MIB)
    assert layout.group_rows_for(first, 10 * slice_rows, 4, slice_rows) == slice_rows
    # groups of about 1 MiB otherwise: a 4 MiB slice strings several together
    assert layout.group_rows_for(first, 10 * slice_rows, 4) == layout.ROW_GROUP_BYTES // 8
    # a table smaller than a slice a partition: one group (one run) each
    assert layout.group_rows_for(first, slice_rows, 4, slice_rows) == -(-slice_rows // 4)
    assert layout.contiguous_slices(None, 4 * MIB) is None


def test_slices_in_blocks_are_refused_with_erasure_coding():
    """Parity is coded over the host's encoding of whole slices: a dataset that asks for blocks
    is told so before anything is sent (``cluster`` is never reached)."""
    from quarry.coordinator.ingest.atomic import ingest
    from quarry.errors import InvalidOption
    from quarry.store.codec import BLOCK_BYTES_HINT

    table = pa.table({"a": [1, 2, 3]})
    with pytest.raises(InvalidOption, match="drop the store.block_bytes hint"):
        ingest(None, table, "t/x", hints={BLOCK_BYTES_HINT: 1 << 18}, redundancy="ec:2+1")
