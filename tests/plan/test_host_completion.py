"""The host's completion of rows handed back: a sub-plan that is only its read hands them on
as they are, without an engine run, and with the same rows as the engine's."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from quarry.coordinator.query.fragments import _host_unit
from quarry.device.units.substrait import SubstraitUnit
from quarry.plan import decompose, keys
from quarry.plan import stage as stage_module
from quarry.protocol.stage import Stage


def completed(small, sql: str, engine: bool, key_sets=(), shuffled: bool = False) -> pa.Table:
    (fragment,) = decompose(sql, small.schemas).fragments
    unit = _host_unit("test", "t", fragment, fragment.stages, key_sets)
    if engine:
        unit.__dict__["_reads_only"] = False  # the cached answer, overridden: the engine's path
    names = list(fragment.raw_schema.names)
    if shuffled:  # slices as stored: every column, in the store's order
        names = list(small.table.column_names)[::-1]
    batches = small.table.select(names).to_batches(max_chunksize=700)
    out = list(unit.complete(Stage.RAW, batches))
    return pa.Table.from_batches(out, schema=fragment.output_schema)


@pytest.mark.parametrize("shuffled", [False, True])
def test_a_read_only_sub_plan_hands_the_rows_on_without_the_engine(small, monkeypatch, shuffled):
    sql = "SELECT id, x, s, d, p FROM t ORDER BY id"  # stored order; the sort stays on the host
    (fragment,) = decompose(sql, small.schemas).fragments
    assert fragment.stages[Stage.FULL] == fragment.stages[Stage.RAW]
    expected = completed(small, sql, engine=True, shuffled=shuffled)

    def no_engine(*args, **kwargs):
        raise AssertionError("the engine ran a sub-plan that only reads")

    monkeypatch.setattr(stage_module, "run_stage", no_engine)
    monkeypatch.setattr("quarry.plan.superplan.run_stage", no_engine)
    assert completed(small, sql, engine=False, shuffled=shuffled).equals(expected)
    assert expected.num_rows == small.table.num_rows


def test_a_key_set_cuts_the_rows_handed_on_as_the_engine_path_does(small):
    sql = "SELECT id, k FROM t ORDER BY id"
    wanted = keys.encode(pa.array(np.arange(0, 3000, 7), pa.int64()))
    via_engine = completed(small, sql, engine=True, key_sets=[(0, wanted)])
    handed_on = completed(small, sql, engine=False, key_sets=[(0, wanted)])
    assert handed_on.equals(via_engine)
    assert handed_on.num_rows == len(range(0, 3000, 7))


def test_a_sub_plan_that_filters_still_runs_the_engine(small):
    (fragment,) = decompose("SELECT id FROM t WHERE i > 0", small.schemas).fragments
    unit = _host_unit("test", "t", fragment, fragment.stages, ())
    assert isinstance(unit, SubstraitUnit) and not unit._reads_only


def executed(small, sql: str, engine: bool, key_sets=()) -> pa.Table:
    """The device's path: a chunk's rows (key-cut, as a device cuts them) through the unit."""
    (fragment,) = decompose(sql, small.schemas).fragments
    unit = _host_unit("test", "t", fragment, fragment.stages, key_sets)
    if engine:
        unit.__dict__["_reads_only"] = False
    batches = small.table.to_batches(max_chunksize=700)
    out = unit._executed(fragment.stages[Stage.FULL], small.table.schema, batches)
    return pa.Table.from_batches(out, schema=fragment.output_schema)


def test_a_device_hands_a_read_only_sub_plans_rows_on_without_the_engine(small, monkeypatch):
    """On a device as on the host: the rows a chunk's key cuts keep are the output of a
    sub-plan that only reads, the same rows as the engine's run over them."""
    sql = "SELECT id, k FROM t ORDER BY id"
    wanted = keys.encode(pa.array(np.arange(0, 3000, 7), pa.int64()))
    expected = executed(small, sql, engine=True, key_sets=[(0, wanted)])

    def no_engine(*args, **kwargs):
        raise AssertionError("the engine ran a sub-plan that only reads")

    monkeypatch.setattr("quarry.device.units.substrait.run_stage", no_engine)
    assert executed(small, sql, engine=False, key_sets=[(0, wanted)]).equals(expected)
    assert expected.num_rows == len(range(0, 3000, 7))
