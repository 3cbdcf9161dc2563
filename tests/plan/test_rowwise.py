"""Row-by-row super-plans: filters and projections over one fragment run on the rows as they
arrive, group by group, with the same answer as DuckDB."""

from __future__ import annotations

from collections.abc import Iterator

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from quarry.plan import decompose, run_stage, run_super
from quarry.plan.rowwise import coalesced, rowwise_fragment

from .harness import assert_same_rows

ROWS = 2_000_000  # 48 MB: three groups of 16 MiB
BATCH_ROWS = 50_000


@pytest.fixture(scope="module")
def table() -> pa.Table:
    rng = np.random.default_rng(5)
    return pa.table(
        {
            "id": np.arange(ROWS, dtype=np.int64),
            "ke": rng.lognormal(0.0, 1.0, ROWS),
            "x": rng.uniform(0.0, 100.0, ROWS),
        }
    )


def _plan(table: pa.Table, sql: str, pushdown: str):
    return decompose(sql, {"test/t": table.schema}, pushdown=pushdown)


@pytest.mark.parametrize(
    ("sql", "pushdown", "rowwise"),
    [
        ("SELECT id, ke * 2 AS k FROM t WHERE ke > 3", "never", True),
        ("SELECT id FROM t WHERE ke > 3 AND x < 50", "never", True),
        ("SELECT id, ke FROM t WHERE ke > 3", "always", True),  # and passes through
        ("SELECT count(*) AS n FROM t WHERE ke > 3", "never", False),
        ("SELECT id, ke FROM t ORDER BY ke LIMIT 5", "never", False),
        ("SELECT id, sum(ke) OVER (ORDER BY id) AS s FROM t", "never", False),
    ],
)
def test_only_filters_and_projections_run_row_by_row(table, sql, pushdown, rowwise):
    decomposition = _plan(table, sql, pushdown)
    assert (rowwise_fragment(decomposition) is not None) == rowwise
    text = decomposition.explain()
    if rowwise:  # a plain read of the fragment passes through; anything else goes row by row
        assert "runs row by row" in text or "pass-through" in text


@pytest.mark.slow
def test_the_answer_streams_before_the_input_ends_and_equals_duckdb(table):
    sql = "SELECT id, ke * 2 AS k FROM t WHERE ke > 3"
    decomposition = _plan(table, sql, "never")
    (fragment,) = decomposition.fragments
    consumed = [0]

    def arriving() -> Iterator[pa.RecordBatch]:
        for batch in table.to_batches(max_chunksize=BATCH_ROWS):
            consumed[0] += 1
            yield from run_stage(fragment.stages["full"], table.schema, [batch])

    reader = run_super(decomposition, {fragment.name: arriving()})
    first = reader.read_next_batch()
    assert first.num_rows > 0
    batches_total = -(-ROWS // BATCH_ROWS)
    assert consumed[0] < batches_total  # the first rows came out while input still arrived
    rest = reader.read_all()
    result = pa.Table.from_batches([first, *rest.to_batches()], schema=reader.schema)
    connection = duckdb.connect()
    connection.register("t", table)
    assert_same_rows(result, connection.execute(sql).fetch_arrow_table(), ordered=False)


def test_small_batches_are_joined_in_order_and_large_ones_pass_uncopied() -> None:
    small = [pa.record_batch({"k": list(range(i * 3, i * 3 + 3))}) for i in range(10)]
    large = pa.record_batch({"k": list(range(100, 150))})
    empty = pa.record_batch({"k": pa.array([], pa.int64())})
    out = coalesced([*small[:5], empty, large, *small[5:]], rows_max=8)
    assert [b.num_rows for b in out] == [6, 6, 3, 50, 6, 6, 3]
    assert out[3] is large  # not copied
    rows = [v for b in out for v in b.column(0).to_pylist()]
    assert rows == [*range(15), *range(100, 150), *range(15, 30)]
    # batches whose types differ stay as they were
    narrow = pa.record_batch({"k": pa.array([1, 2], pa.int32())})
    assert len(coalesced([small[1], narrow], rows_max=8)) == 2
