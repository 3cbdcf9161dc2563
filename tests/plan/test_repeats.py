"""repeats: which fragments' repeated rows change nothing the query answers, and the drop of
adjacent repeats a device makes of them."""

from __future__ import annotations

import decimal

import pyarrow as pa
import pytest

from quarry.plan import decompose
from quarry.plan.repeats import repeat_blind
from quarry.plan.rowwise import adjacent_once

SCHEMAS = {
    "d/a": pa.schema([("k", pa.int64()), ("v", pa.int64())]),
    "d/b": pa.schema([("k", pa.int64()), ("w", pa.int64())]),
}


@pytest.mark.parametrize(
    "sql, blind",
    [
        ("SELECT DISTINCT a.v FROM d.a a JOIN d.b b ON a.k = b.k", {"d/a", "d/b"}),
        ("SELECT a.v FROM d.a a WHERE EXISTS (SELECT 1 FROM d.b b WHERE b.k = a.k)", {"d/b"}),
        ("SELECT a.v FROM d.a a WHERE a.k NOT IN (SELECT k FROM d.b WHERE w > 3)", {"d/b"}),
        ("SELECT v FROM d.a INTERSECT SELECT w FROM d.b", {"d/a", "d/b"}),
        ("SELECT a.v, max(b.w) FROM d.a a JOIN d.b b ON a.k = b.k GROUP BY a.v", {"d/a", "d/b"}),
        # a count, a sum under the semi join, a limit: every repeat counts
        ("SELECT a.v, count(*) FROM d.a a JOIN d.b b ON a.k = b.k GROUP BY a.v", set()),
        (
            "SELECT a.v FROM d.a a WHERE a.k IN (SELECT k FROM d.b GROUP BY k HAVING sum(w) > 3)",
            set(),
        ),
        ("SELECT DISTINCT v FROM (SELECT v FROM d.a ORDER BY v LIMIT 5) t", set()),
        ("SELECT v FROM d.a UNION ALL SELECT w FROM d.b", set()),
    ],
)
def test_repeats_change_nothing_below_a_distinct_or_on_a_semi_joins_filtering_side(
    sql: str, blind: set[str]
) -> None:
    decomposition = decompose(sql, SCHEMAS, "always")
    datasets = {f.name: f.dataset for f in decomposition.fragments}
    found = repeat_blind(decomposition.super_plan)
    assert {datasets[name] for name in found if name in datasets} == blind


def test_a_row_equal_to_the_one_before_is_dropped() -> None:
    """Rows of one ticket lie together: each (customer, day, price) once per run of them;
    nulls are values here; a batch with a column of no fixed width is left as it is."""
    price = [decimal.Decimal(x) for x in ("1.50", "1.50", "1.50", "2.50", "2.50", "2.50", "1.50")]
    batch = pa.record_batch(
        {
            "customer": pa.array([7, 7, 8, 8, None, None, 7], pa.int64()),
            "day": pa.array([1, 1, 1, 1, 2, 2, 1], pa.int32()),
            "price": pa.array(price, pa.decimal128(7, 2)),
        }
    )
    once = adjacent_once(batch)
    assert once.to_pydict() == {
        "customer": [7, 8, 8, None, 7],
        "day": [1, 1, 1, 2, 1],
        "price": [price[0], price[2], price[3], price[4], price[6]],
    }
    assert adjacent_once(batch.slice(4, 2)).num_rows == 1  # an offset into the buffers
    text = pa.record_batch({"name": ["a", "a"], "n": [1, 1]})
    assert adjacent_once(text).num_rows == 2
