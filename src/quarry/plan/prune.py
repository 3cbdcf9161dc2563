"""Zone-map pruning: may a slice hold a row that passes the fragment's filter? And must every
row of it pass (``slice_must_match``: the device then runs the sub-plan without its filter)?

`Fragment.predicates` lists the filter's simple conjuncts (column op literal, IS [NOT] NULL) in a
JSON-serializable form; a zone map gives, per column, min, max, null_count and rows of a slice.
Pruning is conservative: when in doubt (missing statistics, values that do not compare, floats
that may hide NaN), the slice may match.
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Callable, Mapping, Sequence

# Floats: DataFusion orders NaN above every number (NaN > x is true) while zone-map min/max
# skip NaN, so a slice's max says nothing about rows matching >, >= or != unless its zone map
# counted its NaNs and found none.
_NAN_MAY_MATCH = (">", ">=", "!=")


def decode_value(predicate: Mapping) -> object:
    """The predicate's literal as a Python scalar comparable with zone-map values."""
    value, type_tag = predicate.get("value"), predicate.get("type")
    if type_tag == "date":
        return datetime.date.fromisoformat(value)
    if type_tag == "timestamp":
        return datetime.datetime.fromisoformat(value)
    if type_tag == "decimal":
        return decimal.Decimal(value)
    return value


def slice_may_match(predicates: Sequence[Mapping], zone_map: Mapping[str, Mapping]) -> bool:
    """False only when some conjunct can match no row of the slice."""
    return all(
        _may_match(predicate, zone_map.get(predicate.get("column"))) for predicate in predicates
    )


def _may_match(predicate: Mapping, stats: Mapping | None) -> bool:
    if not stats:
        return True
    op = predicate.get("op")
    rows, nulls = stats.get("rows"), stats.get("null_count")
    all_null = rows is not None and nulls is not None and nulls >= rows
    if op == "is_null":
        return nulls is None or nulls > 0
    if op == "is_not_null":
        return not all_null
    if all_null:
        return False  # a comparison with NULL is never true
    low, high = stats.get("min"), stats.get("max")
    if low is None or high is None or "value" not in predicate:
        return True
    value = decode_value(predicate)
    floats = any(isinstance(x, float) for x in (low, high, value))
    nan_free = stats.get("nan_count") == 0  # counted, and none: max bounds every row
    if floats and any(x != x for x in (low, high, value)):
        return True
    if floats and op in _NAN_MAY_MATCH and not nan_free:
        return True
    try:
        return _range_may_match(op, low, high, value)
    except TypeError:
        return True  # values of types that do not compare: keep the slice


def _range_may_match(op: str, low: object, high: object, value: object) -> bool:
    may = _RANGES.get(op)
    return True if may is None else may[0](low, high, value)


def _range_must_match(op: str, low: object, high: object, value: object) -> bool:
    must = _RANGES.get(op)
    return False if must is None else must[1](low, high, value)


# Per operator, for a column whose values lie in [low, high]: may some row pass `column op
# value`, and must every row pass it. The two questions side by side, so they stay consistent.
_RANGES: dict[str, tuple[Callable[..., bool], Callable[..., bool]]] = {
    "=": (lambda lo, hi, v: lo <= v <= hi, lambda lo, hi, v: lo == hi == v),
    "!=": (lambda lo, hi, v: not (lo == hi == v), lambda lo, hi, v: v < lo or v > hi),
    "<": (lambda lo, hi, v: lo < v, lambda lo, hi, v: hi < v),
    "<=": (lambda lo, hi, v: lo <= v, lambda lo, hi, v: hi <= v),
    ">": (lambda lo, hi, v: hi > v, lambda lo, hi, v: lo > v),
    ">=": (lambda lo, hi, v: hi >= v, lambda lo, hi, v: lo >= v),
}


def slice_must_match(predicates: Sequence[Mapping], zone_map: Mapping[str, Mapping]) -> bool:
    """True only when every row of the slice passes every conjunct: its zone map counted no
    NULL (a comparison with NULL is never true) and no NaN in the columns compared, and their
    bounds lie on the passing side. In doubt, False."""
    return bool(predicates) and all(
        _must_match(predicate, zone_map.get(predicate.get("column"))) for predicate in predicates
    )


def _must_match(predicate: Mapping, stats: Mapping | None) -> bool:
    if not stats:
        return False
    op, nulls = predicate.get("op"), stats.get("null_count")
    if op == "is_not_null":
        return nulls == 0
    if op == "is_null":
        rows = stats.get("rows")
        return rows is not None and nulls is not None and nulls >= rows
    low, high = stats.get("min"), stats.get("max")
    if nulls != 0 or low is None or high is None or "value" not in predicate:
        return False
    value = decode_value(predicate)
    floats = any(isinstance(x, float) for x in (low, high, value))
    if floats and (stats.get("nan_count") != 0 or value != value):
        return False  # NaN compares its own way: only a slice counted free of it
    try:
        return _range_must_match(op, low, high, value)
    except TypeError:
        return False
