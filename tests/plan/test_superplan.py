"""complete and run_super: the host's side."""

from __future__ import annotations

import pyarrow as pa
import pytest

from quarry.plan import complete, decompose, run_stage, run_super
from quarry.plan.passthrough import passthrough_fragment

from .harness import assert_same_rows

QUERIES = (
    "SELECT k, count(*) AS n, avg(p) AS a, stddev(x) AS sd FROM t WHERE i > 0 GROUP BY k",
    "SELECT id, x FROM t WHERE s LIKE 'b%' AND x IS NOT NULL ORDER BY x DESC, id LIMIT 7",
    "SELECT count(*) AS n FROM t WHERE d < DATE '2020-05-01'",
)


@pytest.mark.parametrize("sql", QUERIES)
def test_completion_in_small_groups_gives_the_same_answer(small, sql: str) -> None:
    decomposition = decompose(sql, small.schemas)
    (fragment,) = decomposition.fragments
    slices = small.table.to_batches(max_chunksize=100)  # whole slices: a superset of columns
    expected = small.expected(sql)
    for group_bytes_max in (1, 10_000, 10**9):
        output = list(complete(fragment, slices, group_bytes_max=group_bytes_max))
        actual = run_super(decomposition, {fragment.name: output}).read_all()
        assert_same_rows(
            actual,
            expected,
            ordered="ORDER BY" in sql,
            float_absolute=1e-9,
            context=f"groups of {group_bytes_max} bytes",
        )


def test_mixed_stage_outputs_union(small) -> None:
    sql = QUERIES[0]
    decomposition = decompose(sql, small.schemas)
    (fragment,) = decomposition.fragments
    slices = small.table.to_batches(max_chunksize=250)
    done = [
        b for s in slices[0::3] for b in run_stage(fragment.stages["full"], small.table.schema, [s])
    ]
    filtered = [
        b
        for s in slices[1::3]
        for b in run_stage(fragment.stages["filter"], small.table.schema, [s])
    ]
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


PASSTHROUGH = (
    "SELECT * FROM t WHERE i > 0",
    "SELECT x, id FROM t WHERE s LIKE 'b%'",
    "SELECT id AS ident, x * 2 AS twice FROM t WHERE x IS NOT NULL",
)
NOT_PASSTHROUGH = (
    "SELECT * FROM t WHERE i > 0 LIMIT 5",
    "SELECT id FROM t ORDER BY id",
    "SELECT count(*) AS n FROM t",
    "SELECT DISTINCT k FROM t",
)


@pytest.mark.parametrize("sql", PASSTHROUGH)
def test_a_plain_read_streams_its_fragment_straight_out(small, sql: str) -> None:
    decomposition = decompose(sql, small.schemas)
    (fragment,) = decomposition.fragments
    assert passthrough_fragment(decomposition) is fragment
    assert "pass-through" in decomposition.explain()
    assert decomposition.to_json()["super_plan_passthrough"] == fragment.name
    outputs = [
        b
        for s in small.table.to_batches(max_chunksize=100)
        for b in run_stage(fragment.stages["full"], small.table.schema, [s])
    ]
    assert_same_rows(
        run_super(decomposition, {fragment.name: outputs}).read_all(),
        small.expected(sql),
        ordered=False,
        float_absolute=1e-9,
    )

    def first_then_fail():
        yield outputs[0]
        raise RuntimeError("a device died after its first batch")

    # Nothing is held back: the first batch reaches the reader before the stream goes on.
    reader = run_super(decomposition, {fragment.name: first_then_fail()})
    assert reader.read_next_batch().num_rows == outputs[0].num_rows
    with pytest.raises(RuntimeError, match="after its first batch"):
        reader.read_next_batch()


@pytest.mark.parametrize("sql", NOT_PASSTHROUGH)
def test_anything_above_the_read_runs_on_the_host(small, sql: str) -> None:
    decomposition = decompose(sql, small.schemas)
    assert passthrough_fragment(decomposition) is None
    assert decomposition.to_json()["super_plan_passthrough"] is None


@pytest.mark.parametrize("sql", QUERIES[:2])
def test_a_slower_host_holds_on_after_every_batch_and_answers_the_same(small, sql: str) -> None:
    """A host profile's compute factor reaches the super-plan: DataFusion runs on its cores and
    every batch it yields is followed by the stretch of that batch's work."""
    from quarry.plan.superplan import HostPace

    decomposition = decompose(sql, small.schemas)
    (fragment,) = decomposition.fragments
    output = list(complete(fragment, small.table.to_batches(max_chunksize=100)))
    stretched: list[float] = []
    reader = run_super(decomposition, {fragment.name: output}, pace=HostPace(1, stretched.append))
    batches = list(reader)
    assert len(stretched) >= len([b for b in batches if b.num_rows]) >= 1
    assert all(seconds >= 0 for seconds in stretched)
    actual = pa.Table.from_batches(batches, schema=reader.schema)
    assert_same_rows(actual, small.expected(sql), ordered="ORDER BY" in sql, float_absolute=1e-9)


def test_a_small_super_plan_runs_in_one_partition_and_a_large_or_spilled_one_on_every_core(
    tmp_path,
) -> None:
    from quarry.plan.spool import SpooledFragment
    from quarry.plan.superplan import ONE_PARTITION_ROWS_MAX, engine_partitions

    schema = pa.schema([("k", pa.int64())])
    small = [SpooledFragment("a", schema, rows_in_memory=10), SpooledFragment("b", schema)]
    assert engine_partitions(small, 4) == 1
    many = [SpooledFragment("a", schema, rows_in_memory=ONE_PARTITION_ROWS_MAX + 1)]
    assert engine_partitions(many, 4) == 4
    spilled = [SpooledFragment("a", schema, directory=tmp_path, rows_on_disk=1)]
    assert engine_partitions(spilled, 4) == 4
