"""holistic: aggregates that need all of a group's rows at once (count distinct, median).

No partial state of a slice range can be merged into their answer, so the aggregate stays on the
host and only what is safe below it (filters, projections: the earlier rules) runs on devices.
One more thing is safe when every measure ignores duplicates (count/sum/avg DISTINCT, min, max,
bool_and, bool_or, approx_distinct): removing duplicate (group, argument) rows. The fragment
then ends in a DISTINCT over the grouping keys and the measures' arguments, which is often far
smaller than the rows it replaces; the host aggregate reads those columns instead.
"""

from __future__ import annotations

from substrait import algebra_pb2

from quarry.plan import expressions, tree
from quarry.plan.cut import Cut, FragmentDraft
from quarry.plan.rules import Rule, rewrite_sites
from quarry.plan.rules.split_aggregate import group_count, plan_measure

_DISTINCT = algebra_pb2.AggregateFunction.AGGREGATION_INVOCATION_DISTINCT
HOLISTIC_FUNCTIONS = frozenset(
    {
        "median",
        "approx_median",
        "approx_percentile_cont",
        "approx_percentile_cont_with_weight",
        "percentile_cont",
        "approx_distinct",
        "mode",
    }
)
DUPLICATE_INSENSITIVE = frozenset({"min", "max", "bool_and", "bool_or", "approx_distinct"})
DUPLICATE_INSENSITIVE_WHEN_DISTINCT = frozenset({"count", "sum", "avg"})


def _holistic(cut: Cut) -> tuple[Cut, bool]:
    return cut, rewrite_sites(cut, "aggregate", _handle)


holistic = Rule("holistic", _holistic)


def holistic_measures(cut: Cut, aggregate: algebra_pb2.AggregateRel) -> list[str]:
    names = cut.function_names()
    found: list[str] = []
    for measure in aggregate.measures:
        function = measure.measure
        name = names.get(function.function_reference, "?")
        if name in HOLISTIC_FUNCTIONS:
            found.append(name)
        elif function.invocation == _DISTINCT and plan_measure(cut, measure) is None:
            found.append(f"{name}(DISTINCT)")
    return found


def _duplicate_insensitive(cut: Cut, measure: algebra_pb2.AggregateRel.Measure) -> bool:
    function = measure.measure
    name = cut.function_names().get(function.function_reference)
    if measure.HasField("filter") or function.sorts:
        return False  # the filter needs columns the DISTINCT would drop; order needs rows
    if name in DUPLICATE_INSENSITIVE:
        return True
    return name in DUPLICATE_INSENSITIVE_WHEN_DISTINCT and function.invocation == _DISTINCT


def _handle(cut: Cut, rel: algebra_pb2.Rel, fragment: FragmentDraft) -> bool:
    aggregate = rel.aggregate
    found = holistic_measures(cut, aggregate)
    if not found:
        return False  # nothing holistic: split_aggregate's case
    groups = group_count(aggregate)
    if (
        groups is not None
        and fragment.capabilities.aggregate
        and all(_duplicate_insensitive(cut, m) for m in aggregate.measures)
        and _push_distinct(cut, rel, fragment, groups)
    ):
        fragment.notes.append(f"{', '.join(found)} on the host over distinct rows")
    else:
        fragment.notes.append(f"{', '.join(found)} on the host: holistic")
    fragment.open = False
    return True


def _push_distinct(cut: Cut, rel: algebra_pb2.Rel, fragment: FragmentDraft, groups: int) -> bool:
    aggregate = rel.aggregate
    keys = [algebra_pb2.Expression() for _ in range(groups)]
    for key, expression in zip(keys, aggregate.grouping_expressions):
        key.CopyFrom(expression)
    # Each argument that reads the input becomes a key, unless it already is one.
    positions: list[list[int | None]] = []
    for measure in aggregate.measures:
        measure_positions: list[int | None] = []
        for argument in measure.measure.arguments:
            value = argument.value
            if not expressions.referenced_fields(value):
                measure_positions.append(None)  # a literal or constant: stays as it is
                continue
            match = next(
                (i for i, key in enumerate(keys) if expressions.structurally_equal(key, value)),
                None,
            )
            if match is None:
                keys.append(algebra_pb2.Expression())
                keys[-1].CopyFrom(value)
                match = len(keys) - 1
            measure_positions.append(match)
        positions.append(measure_positions)
    if not keys:
        return False

    distinct = algebra_pb2.Rel()
    distinct.aggregate.input.CopyFrom(fragment.rel)
    distinct.aggregate.grouping_expressions.extend(keys)
    distinct.aggregate.groupings.add().expression_references.extend(range(len(keys)))
    fragment.rel = distinct
    fragment.width = len(keys)
    fragment.push("distinct")

    for index in range(groups):
        aggregate.grouping_expressions[index].CopyFrom(expressions.field_ref(index))
    for measure, measure_positions in zip(aggregate.measures, positions):
        for argument, position in zip(measure.measure.arguments, measure_positions):
            if position is not None:
                argument.value.CopyFrom(expressions.field_ref(position))
    assert tree.kind(rel.aggregate.input) == "read", "the aggregate still reads the fragment"
    return True
