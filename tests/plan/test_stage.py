"""run_stage: binds a stage's one table to batches and runs it with DataFusion."""

from __future__ import annotations

import pyarrow as pa
import pytest

from quarry.plan import StageError, decompose, run_stage, tree
from quarry.plan.expressions import field_ref

SQL = "SELECT k, count(*) AS n, sum(x) AS s FROM t WHERE i > 0 GROUP BY k"


@pytest.fixture
def fragment(small):
    return decompose(SQL, small.schemas).fragments[0]


def test_each_stage_reads_one_named_table(fragment) -> None:
    for data in fragment.stages.values():
        plan = tree.parse_plan(data)
        tables = {tree.named_table(r) for r in tree.iter_rels(plan) if tree.kind(r) == "read"}
        assert tables == {("test", "t")}
        assert not [
            d for d in plan.extensions if d.extension_function.name.startswith("quarry_")
        ]  # host-only functions


def test_raw_and_filter_share_the_raw_schema(small, fragment) -> None:
    batches = small.table.to_batches(max_chunksize=500)
    raw = pa.Table.from_batches(
        list(run_stage(fragment.stages["raw"], small.table.schema, batches)),
        schema=fragment.raw_schema,
    )
    filtered = pa.Table.from_batches(
        list(run_stage(fragment.stages["filter"], small.table.schema, batches))
    )
    assert raw.schema == fragment.raw_schema == filtered.schema
    assert raw.num_rows == small.table.num_rows > filtered.num_rows
    # Idempotent: filtering filtered rows changes nothing.
    again = pa.Table.from_batches(
        list(run_stage(fragment.stages["filter"], filtered.schema, filtered.to_batches()))
    )
    assert again.num_rows == filtered.num_rows


def test_superset_columns_in_any_order_and_view_types(small, fragment) -> None:
    shuffled = small.table.select(["s", "p", "x", "id", "i", "k", "d"])
    viewed = shuffled.set_column(0, "s", shuffled.column("s").cast(pa.string_view()))
    full = pa.Table.from_batches(
        list(run_stage(fragment.stages["full"], viewed.schema, viewed.to_batches()))
    )
    reference = pa.Table.from_batches(
        list(run_stage(fragment.stages["full"], small.table.schema, small.table.to_batches()))
    )
    key = full.schema.names[0]
    assert full.schema == reference.schema
    assert full.sort_by(key).equals(reference.sort_by(key))


def test_zero_batches(small, fragment) -> None:
    assert list(run_stage(fragment.stages["raw"], small.table.schema, [])) == [] or all(
        b.num_rows == 0 for b in run_stage(fragment.stages["raw"], small.table.schema, [])
    )
    total = decompose("SELECT count(*) AS n, sum(x) AS s FROM t", small.schemas).fragments[0]
    rows = pa.Table.from_batches(list(run_stage(total.stages["full"], small.table.schema, [])))
    assert rows.num_rows == 1 and rows.column(0).to_pylist() == [0]


def test_undecodable_plans_name_the_operator(small, fragment) -> None:
    with pytest.raises(StageError) as raised:
        run_stage(b"\xff\x00 not substrait", small.table.schema, [])
    assert raised.value.operator == "plan"

    plan = tree.parse_plan(fragment.stages["filter"])
    condition = tree.root_rel(plan).filter.condition
    anchor = tree.declare_function(plan, "no_such_function")
    wrapped = condition.scalar_function.arguments[0].value
    wrapped.Clear()
    wrapped.scalar_function.function_reference = anchor
    wrapped.scalar_function.arguments.add().value.CopyFrom(field_ref(0))
    with pytest.raises(StageError) as raised:
        run_stage(plan.SerializeToString(), small.table.schema, small.table.to_batches())
    assert raised.value.operator == "filter (no_such_function)"
    assert "no_such_function" in str(raised.value)


def test_missing_column(small, fragment) -> None:
    with pytest.raises(StageError, match="column 'i'"):
        run_stage(fragment.stages["filter"], small.table.drop_columns(["i"]).schema, [])


def test_a_kept_session_takes_nothing_from_one_run_to_the_next(small, fragment) -> None:
    """Stages run on a session kept per thread: each run sees its own rows only."""
    stage = decompose("SELECT count(*) AS n, sum(x) AS s FROM t", small.schemas).fragments[0]
    full = stage.stages["full"]
    table = small.table
    whole = pa.Table.from_batches(list(run_stage(full, table.schema, table.to_batches())))
    part = pa.Table.from_batches(list(run_stage(full, table.schema, [table.to_batches()[0]])))
    empty = pa.Table.from_batches(list(run_stage(full, table.schema, [])))
    assert whole.column(0).to_pylist() == [table.num_rows]
    assert part.column(0).to_pylist() == [table.to_batches()[0].num_rows]
    assert empty.column(0).to_pylist() == [0]
    # two runs planned before either is read keep their own rows
    first = run_stage(full, table.schema, [table.to_batches()[0]])
    second = run_stage(full, table.schema, table.to_batches())
    assert pa.Table.from_batches(list(second)).column(0).to_pylist() == [table.num_rows]
    assert pa.Table.from_batches(list(first)).column(0).to_pylist() == [
        table.to_batches()[0].num_rows
    ]
