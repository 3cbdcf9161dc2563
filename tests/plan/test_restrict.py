"""restrict_filter_stage: a storage server's filter stage for a scan-engine drive."""

from __future__ import annotations

import duckdb
import pyarrow as pa

from quarry.plan import decompose, run_stage
from quarry.plan.capabilities import Capabilities
from quarry.plan.restrict import restrict_filter_stage, runs_whole_stage
from quarry.protocol.stage import Stage


def _rows(small, stage: bytes, raw_schema: pa.Schema) -> int:
    table = small.table.select(raw_schema.names)
    return sum(b.num_rows for b in run_stage(stage, raw_schema, table.to_batches()))


def _count(small, where: str) -> int:
    con = duckdb.connect()
    con.register("t", small.table)
    return con.execute(f"SELECT count(*) FROM t WHERE {where}").fetchone()[0]


def test_a_scan_engine_keeps_the_comparisons_and_drops_the_pattern(small) -> None:
    sql = "SELECT id FROM t WHERE s LIKE 'b%' AND x > 0"
    (fragment,) = decompose(sql, small.schemas).fragments
    stage = fragment.stages[Stage.FILTER]
    assert _rows(small, stage, fragment.raw_schema) == _count(small, "s LIKE 'b%' AND x > 0")
    restricted = restrict_filter_stage(stage, Capabilities.scan_filter())
    assert restricted != stage
    assert _rows(small, restricted, fragment.raw_schema) == _count(small, "x > 0")


def test_nothing_supported_leaves_a_plain_scan_and_all_supported_leaves_it_alone(small) -> None:
    (fragment,) = decompose("SELECT id FROM t WHERE s LIKE 'b%'", small.schemas).fragments
    stage = fragment.stages[Stage.FILTER]
    scan = restrict_filter_stage(stage, Capabilities.scan_filter())
    assert _rows(small, scan, fragment.raw_schema) == small.table.num_rows
    assert restrict_filter_stage(stage, Capabilities.full()) == stage
    (plain,) = decompose("SELECT id FROM t WHERE x > 0", small.schemas).fragments
    only = plain.stages[Stage.FILTER]
    assert restrict_filter_stage(only, Capabilities.scan_filter()) == only


def test_a_scan_engine_runs_comparisons_and_selected_columns_whole(small) -> None:
    scan_engine = Capabilities.scan_filter()
    whole = {
        "SELECT id FROM t WHERE x > 0 AND id < 50": True,
        "SELECT id, x FROM t": True,
        "SELECT id FROM t WHERE s LIKE 'b%'": False,  # a pattern: the server re-checks
        "SELECT x + 1 AS y FROM t WHERE x > 0": False,  # a computed column
    }
    for sql, expected in whole.items():
        (fragment,) = decompose(sql, small.schemas).fragments
        stage = fragment.stages[Stage.FULL]
        assert runs_whole_stage(stage, scan_engine) is expected, sql
        assert runs_whole_stage(stage, Capabilities.full())
