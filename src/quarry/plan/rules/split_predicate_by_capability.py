"""split_predicate_by_capability: which filter conjuncts a device evaluates, and in what order.

POLARDB §3.1.1: a drive supports a subset of conditions, so the host extracts the supported
conjuncts for the drive and always re-checks the complete condition on what comes back. Here the
`filter` stage holds the supported conjuncts and the `full` stage the complete filter, which the
host runs when it completes a fragment.

POLARDB §3.1.3: conditions are reordered to streamline evaluation. A conjunct that rejects many
rows for little work goes first: conjuncts are sorted by (selectivity - 1) / cost, the classic
rank for ordering independent filters (Hellerstein & Stonebraker), ties broken by the earliest
column, the order in which a scan engine parses a row. The `full` stage's filter of the rows as
stored takes the same order: it is the one devices run most. DataFusion evaluates each conjunct
of an AND over the rows the ones before it left once those are a fifth or fewer, so the order
is most of a filter's cost (TPC-H Q12's lineitem, one engine run over SF 1: 184 ms in the
order written, 98 ms with the receipt date's upper bound first and the shipping mode last).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from substrait import algebra_pb2

from quarry.plan import expressions, tree
from quarry.plan.cut import Cut, FragmentDraft
from quarry.plan.rules import Rule

# Textbook default selectivities (System R) when the caller has no estimate.
_SELECTIVITY_DEFAULT = {
    "equal": 0.1,
    "not_equal": 0.9,
    "lt": 1 / 3,
    "lte": 1 / 3,
    "gt": 1 / 3,
    "gte": 1 / 3,
    "is_null": 0.1,
    "is_not_null": 0.9,
    "like": 0.25,
    "ilike": 0.25,
}
_SELECTIVITY_UNKNOWN = 0.5
# Relative evaluation costs: comparing fixed-width values is the unit; strings cost more
# because they are compared byte by byte, pattern matching more again.
_COST_FUNCTION = {"like": 8.0, "ilike": 10.0, "regexp_like": 20.0, "regexp_match": 20.0}
_COST_STRING_COMPARISON = 3.0
_SELECTIVITY_MIN, _SELECTIVITY_MAX = 0.0, 1.0


def _split_predicates(cut: Cut) -> tuple[Cut, bool]:
    """Changed when some fragment has conjuncts on its scan: it now says which the filter stage
    holds, and in what order."""
    names = cut.function_names()
    changed = False
    for fragment in cut.fragments:
        if not fragment.raw_conjuncts:
            continue
        changed = True
        ordered = order_conjuncts(cut, fragment, fragment.raw_conjuncts)
        supported = [fragment.capabilities.supports_predicate(c, names) for c in ordered]
        fragment.device_conjuncts = [c for c, ok in zip(ordered, supported) if ok]
        fragment.host_conjuncts = [c for c, ok in zip(ordered, supported) if not ok]
        _order_row_filter(cut, fragment, ordered)
        if fragment.host_conjuncts:
            fragment.notes.append(
                f"{len(fragment.host_conjuncts)} of {len(fragment.raw_conjuncts)} filter "
                f"conjuncts are beyond {fragment.capabilities.name} devices: host re-checks"
            )
    return cut, changed


split_predicate_by_capability = Rule("split_predicate_by_capability", _split_predicates)


def _order_row_filter(
    cut: Cut, fragment: FragmentDraft, ordered: Sequence[algebra_pb2.Expression]
) -> None:
    """The filters right above the fragment's read made one filter of ``ordered``, when they
    hold exactly its conjuncts (push_filter stacks one filter per filter it absorbs)."""
    chain: list[algebra_pb2.Rel] = []
    node: algebra_pb2.Rel | None = fragment.rel
    while node is not None and tree.kind(node) != "read":
        chain = [*chain, node] if tree.kind(node) == "filter" else []
        node = tree.single_input(node)
    if node is None or not chain:
        return
    names = cut.function_names()
    held = [c for f in chain for c in expressions.conjuncts(f.filter.condition, names)]
    if sorted(map(_key, held)) != sorted(map(_key, ordered)):
        return
    chain[0].filter.input.CopyFrom(node)
    chain[0].filter.condition.CopyFrom(expressions.conjoin(list(ordered), cut.plan))


def _key(conjunct: algebra_pb2.Expression) -> bytes:
    return conjunct.SerializeToString(deterministic=True)


def describe(cut: Cut, fragment: FragmentDraft, conjunct: algebra_pb2.Expression) -> dict:
    """The plain description a selectivity estimator receives, and the conjunct as a stage of
    its own (a filter over the dataset's read, Substrait bytes) for one that counts rows."""
    names = cut.function_names()
    fields = raw_field_names(fragment)
    return {
        "dataset": fragment.dataset,
        "sql": expressions.render(conjunct, names, fields),
        "columns": sorted(fields[i] for i in expressions.referenced_fields(conjunct)),
        "predicate": expressions.simple_predicate(conjunct, names, fields),
        "stage": _filter_stage(cut, fragment, conjunct),
    }


def _filter_stage(cut: Cut, fragment: FragmentDraft, conjunct: algebra_pb2.Expression) -> bytes:
    rel = algebra_pb2.Rel()
    rel.filter.input.read.CopyFrom(fragment.read)
    rel.filter.condition.CopyFrom(conjunct)
    return tree.make_plan(cut.plan, rel, raw_field_names(fragment)).SerializeToString()


def raw_field_names(fragment: FragmentDraft) -> list[str]:
    return tree.read_field_names(fragment.read)


def order_conjuncts(
    cut: Cut, fragment: FragmentDraft, conjuncts: Sequence[algebra_pb2.Expression]
) -> list[algebra_pb2.Expression]:
    names = cut.function_names()
    ranked = []
    for position, conjunct in enumerate(conjuncts):
        estimate = None
        if cut.selectivity is not None and len(conjuncts) > 1:
            estimate = cut.selectivity(describe(cut, fragment, conjunct))
        selectivity = estimate if estimate is not None else default_selectivity(conjunct, names)
        selectivity = min(max(selectivity, _SELECTIVITY_MIN), _SELECTIVITY_MAX)
        cost = evaluation_cost(conjunct, names, fragment)
        fields = expressions.referenced_fields(conjunct)
        first_field = min(fields) if fields else -1
        ranked.append(((selectivity - 1.0) / cost, first_field, position, conjunct))
    ranked.sort(key=lambda item: item[:3])
    return [item[3] for item in ranked]


def default_selectivity(conjunct: algebra_pb2.Expression, names: Mapping[int, str]) -> float:
    name = expressions.function_name(conjunct, names)
    parts = expressions.arguments(conjunct) if name else []
    if name == "and":
        product = 1.0
        for part in parts:
            product *= default_selectivity(part, names)
        return product
    if name == "or":
        miss = 1.0
        for part in parts:
            miss *= 1.0 - default_selectivity(part, names)
        return 1.0 - miss
    if name == "not" and len(parts) == 1:
        return 1.0 - default_selectivity(parts[0], names)
    return _SELECTIVITY_DEFAULT.get(name or "", _SELECTIVITY_UNKNOWN)


def evaluation_cost(
    conjunct: algebra_pb2.Expression, names: Mapping[int, str], fragment: FragmentDraft
) -> float:
    """Relative cost of evaluating the conjunct on one row (at least 1)."""
    string_fields = _string_fields(fragment)
    cost = 0.0
    stack = [conjunct]
    while stack:
        expression = stack.pop()
        name = expressions.function_name(expression, names)
        if name is None:
            continue
        parts = expressions.arguments(expression)
        if name in _COST_FUNCTION:
            cost += _COST_FUNCTION[name]
        elif any(expressions.field_index(p) in string_fields for p in parts):
            cost += _COST_STRING_COMPARISON
        else:
            cost += 1.0
        stack.extend(parts)
    return max(cost, 1.0)


def _string_fields(fragment: FragmentDraft) -> set[int]:
    types = fragment.read.base_schema.struct.types
    return {
        i
        for i, t in enumerate(types)
        if t.WhichOneof("kind") in ("string", "varchar", "fixed_char", "binary")
    }
