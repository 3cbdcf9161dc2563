"""build_side: a super-plan's hash joins build on the input with fewer delivered rows, and the
answer is the one the plan gave before it was turned."""

from __future__ import annotations

import re

import duckdb
import pyarrow as pa
import pytest

from quarry.plan import engine
from quarry.plan.rules import build_side

FACT_ROWS = 3000


@pytest.fixture(scope="module")
def tables() -> dict[str, pa.Table]:
    keys = [i % 50 if i % 97 else None for i in range(FACT_ROWS)]
    fact = pa.table({"k": keys, "v": [f"v{i % 13}" for i in range(FACT_ROWS)]})
    small = pa.table({"sk": [1, 5, 7, None, 5, 60], "w": ["a", "b", "c", "d", "e", "f"]})
    tiny = pa.table({"wk": ["a", "e"], "n": [10, 20]})
    return {"fact": fact, "small": small, "tiny": tiny}


def _session(tables: dict[str, pa.Table]):
    ctx = engine.session(2, swap_joins=False)
    for name, table in tables.items():
        engine.register_batches(ctx, name, table.schema, table.to_batches(max_chunksize=500), 2)
    return ctx


STAR = "SELECT w, n, count(v) AS c FROM fact JOIN small ON k = sk JOIN tiny ON w = wk"
QUERIES = [
    ("SELECT * FROM fact JOIN small ON k = sk", 1),
    ("SELECT v, w, k FROM fact LEFT JOIN small ON k = sk", 1),
    ("SELECT * FROM fact FULL JOIN small ON k = sk AND v <> w", 1),
    ("SELECT * FROM fact WHERE k IN (SELECT sk FROM small)", 1),
    ("SELECT * FROM fact WHERE NOT EXISTS (SELECT 1 FROM small WHERE sk = k)", 1),
    (f"{STAR} GROUP BY w, n", 2),
    ("SELECT * FROM (SELECT * FROM fact ORDER BY v, k LIMIT 40) JOIN small ON k = sk", 1),
    ("SELECT * FROM (SELECT * FROM fact ORDER BY v, k LIMIT 4) JOIN small ON k = sk", 0),
    ("SELECT * FROM small RIGHT JOIN fact ON k = sk", 0),  # the small side builds already
]


@pytest.mark.parametrize(("sql", "turned"), QUERIES)
def test_a_turned_join_answers_as_before(tables, sql: str, turned: int) -> None:
    ctx = _session(tables)
    plan = engine.produce(ctx, ctx.sql(sql))
    rows = {name: table.num_rows for name, table in tables.items()}
    assert build_side.smaller_builds(plan, rows) == turned
    answer = engine.consume(ctx, plan).to_arrow_table()
    connection = duckdb.connect()
    for name, table in tables.items():
        connection.register(name, table)
    expected = connection.execute(sql).fetch_arrow_table()
    assert answer.column_names == expected.column_names
    assert sorted(map(repr, answer.to_pylist())) == sorted(map(repr, expected.to_pylist()))


def test_every_join_builds_on_the_fewer_rows(tables) -> None:
    """As written, the plan builds its upper join on the lower one's output (hundreds of the
    fact's rows); turned, every hash join builds on a dimension's few rows."""
    sql = QUERIES[5][0]
    ctx = _session(tables)
    plan = engine.produce(ctx, ctx.sql(sql))
    assert max(_build_rows(ctx, plan)) > 100
    build_side.smaller_builds(plan, {name: table.num_rows for name, table in tables.items()})
    assert max(_build_rows(ctx, plan)) <= tables["small"].num_rows


def test_a_plan_with_a_join_not_reckoned_is_left_whole(tables) -> None:
    """The fact's rows unknown, or a join over a grouped aggregate: no join is turned (None),
    DataFusion then chooses them all."""
    ctx = _session(tables)
    plan = engine.produce(ctx, ctx.sql(QUERIES[0][0]))
    before = plan.SerializeToString()
    assert build_side.smaller_builds(plan, {"small": 6}) is None
    assert plan.SerializeToString() == before
    sql = (
        "SELECT * FROM fact JOIN small ON k = sk "
        "JOIN (SELECT wk, sum(n) AS t FROM tiny GROUP BY wk) g ON w = g.wk"
    )
    plan = engine.produce(ctx, ctx.sql(sql))
    rows = {name: table.num_rows for name, table in tables.items()}
    assert build_side.smaller_builds(plan, rows) is None


def _build_rows(ctx, plan) -> list[int]:
    ctx.register_view("turned", engine.consume(ctx, plan))
    try:
        shown = "\n".join(
            row
            for batch in ctx.sql("EXPLAIN ANALYZE SELECT * FROM turned").collect()
            for row in batch.column(1).to_pylist()
        )
    finally:
        ctx.deregister_table("turned")
    return [int(n) for n in re.findall(r"build_input_rows=(\d+)", shown)]
