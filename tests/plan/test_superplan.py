"""complete and run_super: the host's side."""

from __future__ import annotations

import pyarrow as pa
import pytest

from quarry.plan import complete, decompose, run_stage, run_super

from .harness import assert_same_rows

QUERIES = ("SELECT k, count(*) AS n, avg(p) AS a, stddev(x) AS sd FROM t WHERE i > 0 GROUP BY k",
           "SELECT id, x FROM t WHERE s LIKE 'b%' AND x IS NOT NULL ORDER BY x DESC, id LIMIT 7",
           "SELECT count(*) AS n FROM t WHERE d < DATE '2020-05-01'")


@pytest.mark.parametrize("sql", QUERIES)
def test_completion_in_small_groups_gives_the_same_answer(small, sql: str) -> None:
    decomposition = decompose(sql, small.schemas)
    (fragment,) = decomposition.fragments
    slices = small.table.to_batches(max_chunksize=100)  # whole slices: a superset of columns
    expected = small.expected(sql)
    for group_bytes_max in (1, 10_000, 10**9):
        output = list(complete(fragment, slices, group_bytes_max=group_bytes_max))
        actual = run_super(decomposition, {fragment.name: output}).read_all()
        assert_same_rows(actual, expected, ordered="ORDER BY" in sql, float_absolute=1e-9,
                         context=f"groups of {group_bytes_max} bytes")


def test_mixed_stage_outputs_union(small) -> None:
    sql = QUERIES[0]
    decomposition = decompose(sql, small.schemas)
    (fragment,) = decomposition.fragments
    slices = small.table.to_batches(max_chunksize=250)
    done = [b for s in slices[0::3] for b in run_stage(fragment.stages["full"],
                                                        small.table.schema, [s])]
    filtered = [b for s in slices[1::3] for b in run_stage(fragment.stages["filter"],
                                                            small.table.schema, [s])]
    raw = list(slices[2::3])  # shipped untouched: whole slices
    outputs = done + list(complete(fragment, filtered)) + list(complete(fragment, raw))
    reader = run_super(decomposition, {fragment.name: outputs})
    assert isinstance(reader, pa.RecordBatchReader)
    assert reader.schema == decomposition.output_schema
    assert_same_rows(reader.read_all(), small.expected(sql), ordered=False, float_absolute=1e-9)


def test_missing_fragment_output(small) -> None:
    decomposition = decompose(QUERIES[0], small.schemas)
    with pytest.raises(ValueError, match="__quarry_fragment_0"):
        run_super(decomposition, {})
