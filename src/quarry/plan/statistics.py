"""Answers from slice statistics: a sub-plan that is only ``count``, ``sum``, ``min`` and ``max``
over the rows as stored needs no read of a slice every row of which passes its filter.

Zone maps keep each slice's rows, null count, min, max, NaN count and (numeric columns) sum
(``quarry.store.zonemap``): a small materialized aggregate per slice (Moerkotte, VLDB 1998).
When a fragment's sub-plan without its row filter (``Fragment.unfiltered``, or the whole
sub-plan when it has none) is one aggregate without groups directly over the read, each of its
outputs names one statistic (``answerable``, on the host). A device then answers a run of
slices whose zone maps say every row passes by adding up their statistics (``answer``): one
partial row, as the sub-plan would have computed it, and nothing read.

Conservative like pruning: a statistic missing from any slice (an older store, a float column
with NaNs, an integer sum that could overflow) or a value that does not fit the output type
means the device reads the slices as before. Float sums add up in another order than the
engine's, as they do whenever a device's chunks differ: equal within rounding.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from substrait import algebra_pb2

from quarry.plan import tree
from quarry.plan.rules.split_aggregate import group_count
from quarry.protocol.message import Message, bounded

STATISTICS_MAX = 256
FUNCTIONS = ("rows", "count", "sum", "min", "max")
_DISTINCT = algebra_pb2.AggregateFunction.AGGREGATION_INVOCATION_DISTINCT


@dataclass(frozen=True)
class SliceStatistic(Message):
    """One output column of a sub-plan, as a statistic of the slices: ``rows`` (``count(*)``),
    or ``count``, ``sum``, ``min`` or ``max`` of ``column``."""

    function: str = bounded(chars_max=8)
    column: str = bounded(chars_max=1024, default="")

    def __post_init__(self) -> None:
        assert self.function in FUNCTIONS, f"no slice statistic {self.function!r}"


def answerable(rel: algebra_pb2.Rel, functions: Mapping[int, str]) -> tuple[SliceStatistic, ...]:
    """The statistics that are ``rel``'s output, column by column; () when it is anything but
    one aggregate without groups of plain columns directly over an unfiltered read."""
    if tree.kind(rel) != "aggregate" or rel.aggregate.common.HasField("emit"):
        return ()
    aggregate = rel.aggregate
    if group_count(aggregate) != 0:
        return ()
    columns = _read_columns(aggregate.input)
    if columns is None or not aggregate.measures:
        return ()
    statistics = [_statistic(m, functions, columns) for m in aggregate.measures]
    if any(s is None for s in statistics) or len(statistics) > STATISTICS_MAX:
        return ()
    return tuple(statistics)


def _read_columns(rel: algebra_pb2.Rel) -> list[str] | None:
    """The stored columns a plain read outputs, in order, through projections that only pick
    columns (``count(*)``: none); None for anything else."""
    if tree.kind(rel) == "project":
        below = _read_columns(rel.project.input)
        if below is None:
            return None
        # a project's output: its input's columns, then its expressions (here: columns only)
        out = below + [_column(e, below) for e in rel.project.expressions]
        if not rel.project.common.HasField("emit"):
            return None if None in out else out
        mapping = list(rel.project.common.emit.output_mapping)
        picked = [out[i] if i < len(out) else None for i in mapping]
        return None if None in picked else picked
    if tree.kind(rel) != "read":
        return None
    read = rel.read
    if read.HasField("filter") or read.HasField("best_effort_filter"):
        return None
    if read.common.HasField("emit"):
        return None
    if any(t.WhichOneof("kind") == "struct" for t in read.base_schema.struct.types):
        return None
    names = tree.read_field_names(read)
    return [names[index] for index in tree.read_output_fields(read)]


def _statistic(
    measure: algebra_pb2.AggregateRel.Measure, functions: Mapping[int, str], columns: list[str]
) -> SliceStatistic | None:
    function = measure.measure
    name = functions.get(function.function_reference)
    if measure.HasField("filter") or function.sorts or len(function.arguments) != 1:
        return None
    if name not in ("count", "sum", "min", "max"):
        return None
    if function.invocation == _DISTINCT and name not in ("min", "max"):
        return None
    value = function.arguments[0].value
    if name == "count" and value.HasField("literal") and not value.literal.HasField("null"):
        return SliceStatistic("rows")
    column = _column(value, columns)
    return None if column is None else SliceStatistic(name, column)


def _column(value: algebra_pb2.Expression, columns: list[str]) -> str | None:
    if not value.HasField("selection"):
        return None
    selection = value.selection
    if not selection.HasField("root_reference") or not selection.HasField("direct_reference"):
        return None
    field = selection.direct_reference.struct_field
    if field.HasField("child") or field.field >= len(columns):
        return None
    return columns[field.field]


# ---- on the device ------------------------------------------------------------------------------


class _Missing(Exception):
    """A slice lacks a statistic the answer needs."""


def answer(
    statistics: Sequence[SliceStatistic],
    slices: Sequence[tuple[int, Mapping[str, Mapping[str, Any]]]],
    schema: pa.Schema,
) -> pa.RecordBatch | None:
    """The sub-plan's one output row over ``slices`` (each: its rows and its zone map), every
    row of which passes the filter; None when their statistics cannot say it exactly."""
    if len(statistics) != len(schema) or not slices:
        return None
    try:
        values = [_value(statistic, slices) for statistic in statistics]
        arrays = [pa.array([v], type=f.type) for v, f in zip(values, schema, strict=True)]
    except (_Missing, pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
        return None
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _value(
    statistic: SliceStatistic, slices: Sequence[tuple[int, Mapping[str, Mapping[str, Any]]]]
) -> Any:
    if statistic.function == "rows":
        return sum(rows for rows, _ in slices)
    entries = [_entry(zone_map, statistic.column) for _, zone_map in slices]
    if statistic.function == "count":
        return sum(entry["rows"] - entry["null_count"] for entry in entries)
    # Each slice with a value to add: an all-null slice has none (sum, min and max skip nulls,
    # and are null when no row has a value).
    valued = [entry for entry in entries if entry["null_count"] < entry["rows"]]
    if not valued:
        return None
    if statistic.function == "sum":
        return sum(_needed(entry, "sum") for entry in valued)
    if any(entry.get("nan_count") for entry in valued):
        raise _Missing  # the engine orders NaN above every number; the bounds skip it
    bounds = [_needed(entry, statistic.function) for entry in valued]
    return min(bounds) if statistic.function == "min" else max(bounds)


def _entry(zone_map: Mapping[str, Mapping[str, Any]], column: str) -> Mapping[str, Any]:
    entry = zone_map.get(column)
    if entry is None or "rows" not in entry or "null_count" not in entry:
        raise _Missing
    return entry


def _needed(entry: Mapping[str, Any], key: str) -> Any:
    if entry.get(key) is None:
        raise _Missing
    return entry[key]
