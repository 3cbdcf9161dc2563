"""split_aggregate: partial aggregation (with GROUP BY) per slice range, the final on the host.

Aggregates split by their algebra:

| aggregate | on each slice range | on the host |
| --- | --- | --- |
| count | count | coalesce(sum, 0) |
| sum, min, max, bool_and, bool_or | the same | the same |
| avg | sum, count | sum / count (decimals: truncated like DataFusion, `merge.py`) |
| var, stddev (samp, pop) | n, mean, population variance | Chan's pairwise merge (`merge.py`) |

The host part is planned by DataFusion itself, over the fragment's table, and cast back to the
types of the original aggregate, so every operator above it sees exactly what it saw before.
Holistic aggregates (count distinct, median) are left alone here; see `holistic.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
from datafusion import DataFrame, Expr, col, lit
from datafusion import functions as F
from substrait import algebra_pb2, type_pb2

from quarry.plan import engine, merge, tree
from quarry.plan.cut import Cut, FragmentDraft
from quarry.plan.rules import Rule, rewrite_sites

DISTRIBUTIVE = ("count", "sum", "min", "max", "bool_and", "bool_or")
# DataFusion's names -> the merge kind of `merge.py`.
MOMENTS = {
    "var": "var_samp",
    "var_samp": "var_samp",
    "var_pop": "var_pop",
    "stddev": "stddev_samp",
    "stddev_samp": "stddev_samp",
    "stddev_pop": "stddev_pop",
}
# DISTINCT does not change these, so they split even when written with DISTINCT.
DISTINCT_INSENSITIVE = ("min", "max", "bool_and", "bool_or")

_DISTINCT = algebra_pb2.AggregateFunction.AGGREGATION_INVOCATION_DISTINCT
_FINAL_FUNCTIONS = {
    "sum": F.sum,
    "min": F.min,
    "max": F.max,
    "bool_and": F.bool_and,
    "bool_or": F.bool_or,
}


@dataclass
class MeasureSplit:
    kind: str  # "count", "sum", ..., "avg", or a moment kind
    partials: list[algebra_pb2.AggregateRel.Measure]


def _split_aggregates(cut: Cut) -> tuple[Cut, bool]:
    return cut, rewrite_sites(cut, "aggregate", _split)


split_aggregate = Rule("split_aggregate", _split_aggregates)


def group_count(aggregate: algebra_pb2.AggregateRel) -> int | None:
    """Number of grouping columns for a single grouping set in output order, else None."""
    count = len(aggregate.grouping_expressions)
    if len(aggregate.groupings) > 1:
        return None  # GROUPING SETS / ROLLUP add a grouping-id column: left to the host
    if aggregate.groupings and list(aggregate.groupings[0].expression_references) != list(
        range(count)
    ):
        return None
    if not aggregate.groupings and count:
        return None
    return count


def plan_measure(cut: Cut, measure: algebra_pb2.AggregateRel.Measure) -> MeasureSplit | None:
    """How one measure splits, or None when it does not (holistic, ordered, unknown)."""
    function = measure.measure
    name = cut.function_names().get(function.function_reference)
    if function.sorts or name is None:
        return None
    if function.invocation == _DISTINCT and name not in DISTINCT_INSENSITIVE:
        return None
    if name in DISTRIBUTIVE:
        return MeasureSplit(name, [_retargeted(cut, measure, name)])
    if name == "avg" and len(function.arguments) == 1:
        return MeasureSplit(
            "avg", [_retargeted(cut, measure, "sum"), _retargeted(cut, measure, "count")]
        )
    if name in MOMENTS and len(function.arguments) == 1:
        partials = [
            _retargeted(cut, measure, partial, as_float64=True)
            for partial in ("count", "avg", "var_pop")
        ]
        return MeasureSplit(MOMENTS[name], partials)
    return None


def _retargeted(
    cut: Cut,
    measure: algebra_pb2.AggregateRel.Measure,
    function_name: str,
    as_float64: bool = False,
) -> algebra_pb2.AggregateRel.Measure:
    partial = algebra_pb2.AggregateRel.Measure()
    partial.CopyFrom(measure)  # keeps arguments and any FILTER (WHERE ...) of the measure
    partial.measure.function_reference = tree.declare_function(cut.plan, function_name)
    partial.measure.ClearField("output_type")
    if as_float64:
        for argument in partial.measure.arguments:
            cast = algebra_pb2.Expression()
            cast.cast.type.fp64.nullability = type_pb2.Type.NULLABILITY_NULLABLE
            cast.cast.input.CopyFrom(argument.value)
            cast.cast.failure_behavior = (
                algebra_pb2.Expression.Cast.FAILURE_BEHAVIOR_THROW_EXCEPTION
            )
            argument.value.CopyFrom(cast)
    return partial


def shared_partials(
    splits: list[MeasureSplit],
) -> tuple[list[algebra_pb2.AggregateRel.Measure], list[list[int]]]:
    """Distinct partial measures, and per split the positions of its partials among them.

    Partial measures that coincide (Q1's sum(l_quantity) and avg(l_quantity)'s sum) are
    computed and shipped once.
    """
    unique: list[algebra_pb2.AggregateRel.Measure] = []
    keys: list[bytes] = []
    positions: list[list[int]] = []
    for split in splits:
        split_positions = []
        for measure in split.partials:
            key = measure.SerializeToString(deterministic=True)
            if key not in keys:
                keys.append(key)
                unique.append(measure)
            split_positions.append(keys.index(key))
        positions.append(split_positions)
    return unique, positions


def _split(cut: Cut, rel: algebra_pb2.Rel, fragment: FragmentDraft) -> bool:
    aggregate = rel.aggregate
    groups = group_count(aggregate)
    if groups is None or not fragment.capabilities.aggregate:
        return False
    if aggregate.HasField("common") and aggregate.common.HasField("emit"):
        return False
    splits = [plan_measure(cut, measure) for measure in aggregate.measures]
    if any(split is None for split in splits):
        return False

    unsplit = tree.copy_rel(rel)
    unsplit.aggregate.input.CopyFrom(fragment.rel)
    original = cut.rel_schema(unsplit)
    assert len(original) == groups + len(splits), "aggregate output is groups then measures"

    unique, positions = shared_partials(splits)
    partial = tree.copy_rel(rel)
    partial.aggregate.input.CopyFrom(fragment.rel)
    del partial.aggregate.measures[:]
    partial.aggregate.measures.extend(unique)
    fragment.rel = partial
    partial_schema = cut.fragment_schema(fragment)
    assert len(partial_schema) == groups + len(unique), "partial output: groups then measures"
    partial_names = [f"g{i}" for i in range(groups)] + [f"p{i}" for i in range(len(unique))]
    partial_schema = pa.schema(
        [
            pa.field(name, field.type, field.nullable)
            for name, field in zip(partial_names, partial_schema)
        ]
    )
    cut.register_fragment_table(fragment, partial_schema)
    fragment.width = len(partial_schema)  # what the host's final aggregate reads

    final = _final_frame(cut, fragment, groups, splits, positions, partial_schema, original)
    final_plan = engine.produce(cut.ctx, final)
    merge.register_merge_functions(cut.ctx, tree.function_names(final_plan).values())
    final_rel = tree.import_rel(cut.plan, final_plan, tree.root_rel(final_plan))
    final_schema = cut.rel_schema(final_rel)
    assert final_schema.types == original.types, (
        f"final aggregate types {final_schema.types} differ from the original {original.types}"
    )
    tree.replace(rel, final_rel)
    fragment.push("partial_aggregate")
    fragment.open = False
    return True


def _final_frame(
    cut: Cut,
    fragment: FragmentDraft,
    groups: int,
    splits: list[MeasureSplit],
    positions: list[list[int]],
    partial_schema: pa.Schema,
    original: pa.Schema,
) -> DataFrame:
    """The host's half, planned by DataFusion over the fragment's table."""
    group_columns = [col(f"g{i}") for i in range(groups)]
    aggregates: list[Expr] = []
    finals: list[Expr] = []
    for index, (split, split_positions) in enumerate(zip(splits, positions)):
        inputs = [f"p{position}" for position in split_positions]
        output_type = original.field(groups + index).type
        alias = f"a{index}"
        if split.kind == "count":
            aggregates.append(F.sum(col(inputs[0])).alias(alias))
            final = F.coalesce(col(alias), lit(0))  # no rows at all: count is 0, not NULL
        elif split.kind in _FINAL_FUNCTIONS:
            aggregates.append(_FINAL_FUNCTIONS[split.kind](col(inputs[0])).alias(alias))
            final = col(alias)
        elif split.kind == "avg":
            aggregates.append(F.sum(col(inputs[0])).alias(f"{alias}_sum"))
            aggregates.append(F.sum(col(inputs[1])).alias(f"{alias}_count"))
            final = _average(
                cut,
                col(f"{alias}_sum"),
                col(f"{alias}_count"),
                partial_schema.field(inputs[0]).type,
                output_type,
            )
        else:
            function = merge.moment_udaf(split.kind)
            aggregates.append(function(*(col(name) for name in inputs)).alias(alias))
            final = col(alias)
        finals.append(final.cast(output_type).alias(f"m{index}"))
    frame = cut.ctx.table(fragment.name).aggregate(group_columns, aggregates)
    return frame.select(*group_columns, *finals)


def _average(
    cut: Cut, total: Expr, count: Expr, sum_type: pa.DataType, output_type: pa.DataType
) -> Expr:
    if pa.types.is_decimal(output_type) and pa.types.is_decimal(sum_type):
        function = merge.avg_decimal_udf(sum_type.scale, output_type.precision, output_type.scale)
        return function(total.cast(pa.decimal128(38, sum_type.scale)), count)
    return total.cast(pa.float64()) / count.cast(pa.float64())
