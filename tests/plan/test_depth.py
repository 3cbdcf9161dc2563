"""Plans of any depth: a 64-way join (about 250 levels of Substrait, where DataFusion's decoder
stops at 100) is planned, cut, and run in parts, and answers as DuckDB does."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest

from quarry.plan import decompose, depth, engine, tree

from .harness import assert_same_rows, execute

TABLES = 64
ROWS = 10


def _tables() -> dict[str, pa.Table]:
    """t1..t64, each row k of t_i joining row k of t_i+1 (a_i = b_i+1), as in sqllogictest's
    select5.test."""
    return {
        f"t{i}": pa.table(
            {
                f"a{i}": list(range(ROWS)),
                f"b{i}": list(range(ROWS)),
                f"x{i}": [f"table t{i} row {k}" for k in range(ROWS)],
            }
        )
        for i in range(1, TABLES + 1)
    }


def _join(tables: int) -> str:
    names = [f"t{i}" for i in range(1, tables + 1)]
    conditions = [f"a{i} = b{i + 1}" for i in range(1, tables)]
    return (
        f"SELECT x1, x{tables}, count(*) AS n FROM {', '.join(reversed(names))} "
        f"WHERE a1 < 5 AND {' AND '.join(conditions)} GROUP BY x1, x{tables}"
    )


@pytest.mark.slow
@pytest.mark.parametrize("pushdown", ["always", "never"])
def test_a_64_way_join_plans_is_cut_and_answers(pushdown):
    tables = _tables()
    sql = _join(TABLES)
    decomposition = decompose(
        sql, {f"slt/{n}": t.schema for n, t in tables.items()}, pushdown=pushdown
    )
    assert len(decomposition.fragments) == TABLES
    assert depth.height(tree.parse_plan(decomposition.super_plan)) > depth.DECODE_DEPTH_MAX
    answer = execute(decomposition, {f"slt/{n}": t for n, t in tables.items()})
    connection = duckdb.connect()
    for name, table in tables.items():
        connection.register(name, table)
    expected = connection.execute(sql).fetch_arrow_table()
    assert expected.num_rows == 5
    assert_same_rows(answer, expected, ordered=False, context=pushdown)


def test_a_deep_plan_is_consumed_in_parts_each_within_the_decoders_bound():
    tables = _tables()
    ctx = engine.session()
    for name, table in list(tables.items())[:48]:
        engine.register_batches(ctx, name, table.schema, table.to_batches())
    plan = engine.produce(ctx, ctx.sql(_join(48)))
    assert depth.height(plan) > depth.DECODE_DEPTH_MAX
    parts: list[int] = []

    def register(part):
        parts.append(depth.height(part))
        return engine._typed_read(f"__quarry_part_test_{len(parts)}", pa.schema([]))

    depth.split(tree.copy_plan(plan), register)
    assert len(parts) >= 2 and max(parts) <= depth.DECODE_DEPTH_MAX, parts
    before = set(ctx.catalog().schema().names())
    answer = engine.consume(ctx, plan).to_arrow_table()
    assert set(ctx.catalog().schema().names()) == before  # the parts' views let go of
    assert sorted(answer.column("n").to_pylist()) == [1] * 5
