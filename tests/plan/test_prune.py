"""Zone-map pruning is conservative: it never drops a slice that could hold a matching row."""

from __future__ import annotations

import datetime
import decimal
import json

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from quarry.plan import RULES, decompose, slice_may_match, slice_must_match
from quarry.plan.prune import decode_value
from quarry.plan.rules.prune_slices import prune_slices
from quarry.store.zonemap import zone_map as stored_zone_map

from .harness import assert_same_rows, execute, zone_map

ZONE = {
    "a": {"min": 10, "max": 20, "null_count": 0, "rows": 100},
    "s": {"min": "banana", "max": "cherry", "null_count": 5, "rows": 100},
    "d": {
        "min": datetime.date(2020, 1, 1),
        "max": datetime.date(2020, 12, 31),
        "null_count": 100,
        "rows": 100,
    },
    "p": {
        "min": decimal.Decimal("1.50"),
        "max": decimal.Decimal("9.99"),
        "null_count": 0,
        "rows": 100,
    },
    "f": {"min": -1.0, "max": 1.0, "null_count": 0, "rows": 100},
}


def p(column: str, op: str, value=None, type_tag: str = "int") -> dict:
    predicate = {"column": column, "op": op}
    if value is not None:
        predicate.update(value=value, type=type_tag)
    return predicate


def test_ranges() -> None:
    assert slice_may_match([p("a", "=", 15)], ZONE)
    assert not slice_may_match([p("a", "=", 21)], ZONE)
    assert not slice_may_match([p("a", "<", 10)], ZONE)
    assert slice_may_match([p("a", "<=", 10)], ZONE)
    assert not slice_may_match([p("a", ">", 20)], ZONE)
    assert slice_may_match([p("a", ">=", 20)], ZONE)
    assert slice_may_match([p("a", "!=", 10)], ZONE)
    assert not slice_may_match([p("a", "!=", 5)], {"a": {"min": 5, "max": 5}})
    assert not slice_may_match([p("s", ">", "cherry", "str")], ZONE)
    assert slice_may_match([p("s", "<", "blueberry", "str")], ZONE)
    assert not slice_may_match([p("p", ">", "9.99", "decimal")], ZONE)
    assert slice_may_match([p("p", "<", "1.51", "decimal")], ZONE)


def test_every_conjunct_must_be_satisfiable() -> None:
    assert not slice_may_match([p("a", ">", 11), p("a", "<", 5)], ZONE)
    assert slice_may_match([], ZONE)


def test_nulls() -> None:
    assert not slice_may_match([p("a", "is_null")], ZONE)
    assert slice_may_match([p("s", "is_null")], ZONE)
    assert not slice_may_match([p("d", "is_not_null")], ZONE)  # all rows null
    # A comparison is never true on NULL: an all-null slice cannot match it.
    assert not slice_may_match([p("d", "<", "2021-01-01", "date")], ZONE)


def test_conservative_when_unsure() -> None:
    assert slice_may_match([p("missing", "=", 1)], ZONE)
    assert slice_may_match([p("a", "=", 1)], {"a": {"min": None, "max": None}})
    assert slice_may_match([p("a", "=", "x", "str")], ZONE)  # does not compare
    assert slice_may_match([p("a", "like", "x", "str")], ZONE)  # unknown operator
    # Floats: NaN is above every number in DataFusion and absent from min/max.
    assert slice_may_match([p("f", ">", 5.0, "float")], ZONE)
    assert slice_may_match([p("f", "!=", 1.0, "float")], {"f": {"min": 1.0, "max": 1.0}})
    assert not slice_may_match([p("f", "<", -5.0, "float")], ZONE)


def test_a_float_column_without_nan_prunes_from_above() -> None:
    """A zone map that counted its NaNs and found none bounds every row by its max: a clustered
    float column (Kinetic Pipe's ke) prunes ``ke > X`` and stays conservative otherwise."""
    counted = {"f": {"min": 0.5, "max": 2.0, "null_count": 0, "rows": 10, "nan_count": 0}}
    assert not slice_may_match([p("f", ">", 5.0, "float")], counted)
    assert not slice_may_match([p("f", ">=", 2.5, "float")], counted)
    assert slice_may_match([p("f", ">", 1.0, "float")], counted)
    assert slice_may_match([p("f", ">", float("nan"), "float")], counted)
    with_nan = {"f": {**counted["f"], "nan_count": 1}}
    assert slice_may_match([p("f", ">", 5.0, "float")], with_nan)


def test_predicates_are_plain_json(small) -> None:
    sql = (
        "SELECT id FROM t WHERE d >= DATE '2020-06-01' AND p < 10.5 AND s = 'apple' "
        "AND 3 < i AND x IS NOT NULL AND i * 2 < 100"
    )
    (fragment,) = decompose(sql, small.schemas).fragments
    decoded = json.loads(json.dumps(fragment.predicates))
    assert decoded == fragment.predicates
    by_column = {predicate["column"]: predicate for predicate in decoded}
    assert by_column["d"] == {"column": "d", "op": ">=", "value": "2020-06-01", "type": "date"}
    assert decode_value(by_column["d"]) == datetime.date(2020, 6, 1)
    assert decode_value(by_column["p"]) == decimal.Decimal("10.50")
    assert by_column["i"]["op"] == ">"  # literal on the left: flipped
    assert by_column["x"] == {"column": "x", "op": "is_not_null"}
    assert len(decoded) == 5  # i * 2 < 100 is not a simple conjunct


def test_prune_slices_is_the_rule_that_gives_devices_their_predicates(small) -> None:
    """Without it a fragment has no zone-map predicates, so no slice is skipped or run
    unfiltered; the answer is the same either way."""
    sql = "SELECT sum(x) AS total FROM t WHERE i > 3 AND k < 5"
    (fragment,) = decompose(sql, small.schemas).fragments
    assert [p["column"] for p in fragment.predicates] == ["i", "k"] and fragment.unfiltered
    assert RULES[-1] is prune_slices
    without = decompose(sql, small.schemas, rules=RULES[:-1])
    (bare,) = without.fragments
    assert bare.predicates == [] and bare.unfiltered == b""
    assert (bare.pushed, bare.device_filter) == (fragment.pushed, fragment.device_filter)
    assert "prune_slices" not in [step.rule for step in without.fired]
    for decomposition in (decompose(sql, small.schemas), without):
        assert_same_rows(execute(decomposition, small.data), small.expected(sql), ordered=False)


OPS = ("=", "!=", "<", "<=", ">", ">=")
PYTHON_OPS = {
    "=": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.one_of(st.none(), st.integers(-20, 20)), min_size=1, max_size=20),
    op=st.sampled_from((*OPS, "is_null", "is_not_null")),
    literal=st.integers(-25, 25),
)
def test_never_prunes_a_slice_that_matches(values, op: str, literal: int) -> None:
    table = pa.table({"a": pa.array(values, pa.int64())})
    if op in ("is_null", "is_not_null"):
        predicate = p("a", op)
        matches = any((v is None) == (op == "is_null") for v in values)
    else:
        predicate = p("a", op, literal)
        matches = any(v is not None and PYTHON_OPS[op](v, literal) for v in values)
    if matches:
        assert slice_may_match([predicate], zone_map(table, ["a"]))


# ---- every row passes: the device may drop the filter --------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(
        st.one_of(st.none(), st.just(float("nan")), st.floats(-20, 20)), min_size=1, max_size=20
    ),
    op=st.sampled_from((*OPS, "is_null", "is_not_null")),
    literal=st.floats(-25, 25),
)
def test_must_match_only_when_every_row_passes(values, op: str, literal: float) -> None:
    """Claimed only for a slice every row of which passes (NULL never does; NaN is left out)."""
    batch = pa.record_batch({"f": pa.array(values, pa.float64())})
    predicate = p("f", op) if op in ("is_null", "is_not_null") else p("f", op, literal, "float")
    if not slice_must_match([predicate], stored_zone_map(batch)):
        return
    if op == "is_null":
        assert all(v is None for v in values)
    elif op == "is_not_null":
        assert all(v is not None for v in values)
    else:
        assert all(v is not None and v == v and PYTHON_OPS[op](v, literal) for v in values)


def test_must_match_when_the_bounds_say_so() -> None:
    assert slice_must_match([p("a", ">", 5), p("a", "<=", 20)], ZONE)
    assert slice_must_match([p("a", "!=", 21), p("p", ">=", "1.50", "decimal")], ZONE)
    assert not slice_must_match([p("a", ">", 10)], ZONE)  # the min itself fails
    assert not slice_must_match([p("s", ">", "a", "str")], ZONE)  # 5 NULLs never pass
    assert not slice_must_match([p("f", "<", 5.0, "float")], ZONE)  # NaN not counted
    nan_free = {"f": {**ZONE["f"], "nan_count": 0}}
    assert slice_must_match([p("f", "<", 5.0, "float")], nan_free)
    assert not slice_must_match([], ZONE)  # no filter to drop
    assert not slice_must_match([p("missing", ">", 1)], ZONE)


def test_a_filter_of_zone_map_predicates_only_has_an_unfiltered_stage(small) -> None:
    def unfiltered(sql: str) -> bytes:
        (fragment,) = decompose(sql, small.schemas).fragments
        return fragment.unfiltered

    assert unfiltered("SELECT sum(i) FROM t WHERE i > 3 AND x IS NOT NULL")
    assert not unfiltered("SELECT sum(i) FROM t WHERE i > 3 AND i * 2 < 100")
    assert not unfiltered("SELECT sum(i) FROM t")
