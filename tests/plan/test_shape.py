"""A sub-plan's shape: the same for queries that differ only in their constants."""

from __future__ import annotations

import pyarrow as pa

from quarry.plan import decompose
from quarry.plan.shape import shape_of

SCHEMA = pa.schema([("id", pa.int64()), ("ke", pa.float64()), ("name", pa.string())])


def _shape(sql: str) -> str:
    (fragment,) = decompose(sql, {"d/t": SCHEMA}, "always").fragments
    return shape_of(fragment.stages["filter"], fragment.stages["full"])


def test_constants_do_not_change_a_shape_and_the_rest_does():
    one = _shape("SELECT sum(ke) AS s FROM d.t WHERE ke > 2.0 AND id < 10")
    assert one == _shape("SELECT sum(ke) AS s FROM d.t WHERE ke > 3.5 AND id < 99")
    assert one != _shape("SELECT sum(ke) AS s FROM d.t WHERE ke > 2.0 AND id > 10")  # operator
    assert one != _shape("SELECT max(ke) AS s FROM d.t WHERE ke > 2.0 AND id < 10")  # aggregate
    # a constant's kind is part of the shape
    assert _shape("SELECT count(*) FROM d.t WHERE name = 'a'") == _shape(
        "SELECT count(*) FROM d.t WHERE name = 'b'"
    )
    assert shape_of(b"not a plan") != shape_of(b"not a plan either")
