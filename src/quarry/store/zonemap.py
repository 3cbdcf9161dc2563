"""Zone maps: per slice, per column min / max / null count (and NaN count for floats), for
pruning slices on the device. A float column's max says nothing of its NaNs (DataFusion orders
NaN above every number), so ``ke > X`` prunes a slice only when its zone map counted no NaN.

Numeric columns also keep their sum (a small materialized aggregate, Moerkotte, VLDB 1998): with
rows, null count, min and max it answers ``count``, ``sum``, ``min`` and ``max`` over a slice
every row of which passes the query's filter without reading it (``quarry.plan.statistics``).
An integer sum is kept only when it cannot overflow 64 bits, a float sum only when it is finite
and the slice holds no NaN."""

from __future__ import annotations

import datetime
import decimal
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# A dataset with many columns (a wide expression matrix) gets zone maps for the first columns only:
# the metadata slice must stay small enough to read on every query.
ZONE_MAP_COLUMNS_MAX = 256
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def _orderable(type_: pa.DataType) -> bool:
    return (
        pa.types.is_integer(type_)
        or pa.types.is_floating(type_)
        or pa.types.is_decimal(type_)
        or pa.types.is_string(type_)
        or pa.types.is_large_string(type_)
        or pa.types.is_date(type_)
        or pa.types.is_timestamp(type_)
        or pa.types.is_boolean(type_)
    )


def zone_map(batch: pa.RecordBatch) -> dict[str, dict[str, Any]]:
    entries: dict[str, dict[str, Any]] = {}
    for index, field in enumerate(batch.schema):
        if index >= ZONE_MAP_COLUMNS_MAX:
            break
        column = batch.column(index)
        entry: dict[str, Any] = {"null_count": column.null_count, "rows": len(column)}
        if _orderable(field.type) and column.null_count < len(column):
            bounds = pc.min_max(column)
            entry["min"] = bounds["min"].as_py()
            entry["max"] = bounds["max"].as_py()
            if isinstance(entry["min"], float) and entry["min"] != entry["min"]:
                del entry["min"], entry["max"]  # NaN bounds prune nothing safely
        if pa.types.is_floating(field.type):
            entry["nan_count"] = pc.sum(pc.is_nan(column)).as_py() or 0
        total = _sum(column, entry)
        if total is not None:
            entry["sum"] = total
        entries[field.name] = entry
    return entries


def _sum(column: pa.Array, entry: dict[str, Any]) -> int | float | None:
    """The column's sum when it is exact to keep (None: not kept; an all-null column has
    nothing to add)."""
    if "min" not in entry:
        return None
    if pa.types.is_floating(column.type):
        # inf - inf and overflow depend on the order of the additions: read such a slice
        total = pc.sum(column).as_py() if entry["nan_count"] == 0 else None
        return total if total is not None and math.isfinite(total) else None
    if pa.types.is_signed_integer(column.type):
        bound = max(abs(entry["min"]), abs(entry["max"])) * (len(column) - column.null_count)
        return pc.sum(column).as_py() if bound < 1 << 63 else None
    return None


def to_json_value(value: Any) -> Any:
    """Tag the scalars JSON cannot carry, so the device reads back the same Python type."""
    if isinstance(value, datetime.datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, datetime.date):
        return {"$date": value.isoformat()}
    if isinstance(value, decimal.Decimal):
        return {"$decimal": str(value)}
    if isinstance(value, bytes):
        return {"$bytes": value.hex()}
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return {"$float": repr(value)}
    return value


def from_json_value(value: Any) -> Any:
    if isinstance(value, dict) and len(value) == 1:
        ((tag, raw),) = value.items()
        if tag == "$datetime":
            return datetime.datetime.fromisoformat(raw)
        if tag == "$date":
            return datetime.date.fromisoformat(raw)
        if tag == "$decimal":
            return decimal.Decimal(raw)
        if tag == "$bytes":
            return bytes.fromhex(raw)
        if tag == "$float":
            return float(raw)
    return value


def zone_map_to_json(entries: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        column: {key: to_json_value(value) for key, value in entry.items()}
        for column, entry in entries.items()
    }


def zone_map_from_json(entries: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        column: {key: from_json_value(value) for key, value in entry.items()}
        for column, entry in entries.items()
    }


@dataclass(frozen=True)
class IntegerBounds:
    """One column's zone maps over a partition's slices, as arrays (a slice per entry): for
    judging every slice at once against a join's keys (``keys.KeyCut.may_hold_each``), where
    a request judged each slice's map in turn (a few microseconds each, 55 slices a TPC-DS
    fact partition, every request)."""

    known: np.ndarray  # bool: integer min and max recorded
    low: np.ndarray  # int64: the min where known (clamped to 64 bits), 0 elsewhere
    high: np.ndarray  # int64: the max where known (clamped to 64 bits), 0 elsewhere
    empty: np.ndarray  # bool: every row null there
    mapped: np.ndarray  # bool: the slice has a zone map of the column at all


def integer_bounds(maps: Sequence[Mapping[str, Any] | None]) -> IntegerBounds:
    """``maps``: one column's zone map of each slice (None where there is none)."""
    count = len(maps)
    known, empty, mapped = (np.zeros(count, np.bool_) for _ in range(3))
    low, high = np.zeros(count, np.int64), np.zeros(count, np.int64)
    for n, stats in enumerate(maps):
        if not stats:
            continue
        mapped[n] = True
        rows, nulls = stats.get("rows"), stats.get("null_count")
        empty[n] = rows is not None and nulls is not None and nulls >= rows
        least, most = stats.get("min"), stats.get("max")
        if isinstance(least, int) and isinstance(most, int):
            known[n], low[n], high[n] = True, _clamped(least), _clamped(most)
    return IntegerBounds(known, low, high, empty, mapped)


def _clamped(value: int) -> int:
    """Within 64 bits: a bound past them says the same of 64-bit keys as the nearest end."""
    return min(max(value, INT64_MIN), INT64_MAX)
