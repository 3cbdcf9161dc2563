"""What EXPLAIN VERBOSE shows after each rule that fired: the super-plan and every fragment, as an
indented tree of Substrait relations, one line each.

The same rendering serves the three phases (the query's plan before the cut, the cut, the
finished decomposition), so two rules' snapshots read side by side. It is Substrait's tree, not
DataFusion's: a cut in progress reads fragments that have no types yet, which DataFusion cannot
plan; fields are shown by name over a read of known columns and by position (``#3``) elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from google.protobuf.message import Message
from substrait import algebra_pb2, plan_pb2

from quarry.plan import expressions, tree
from quarry.plan.cut import Cut

LINE_CHARS_MAX = 240  # a long IN list or CASE is cut there: the tree is what matters
INDENT = "  "


@dataclass(frozen=True)
class FragmentSnapshot:
    """One fragment as a rule left it: bytes and tuples, since the next rule changes the draft
    in place."""

    name: str
    dataset: str
    pushed: tuple[str, ...]
    notes: tuple[str, ...] = ()
    predicates: tuple[dict, ...] = ()  # zone-map predicates (``prune_slices``)
    # the filter stage's conjuncts and those only the host checks, once
    # ``split_predicate_by_capability`` chose them (None before): a draft's as Expression
    # bytes, rendered when asked; a finished fragment's as the text it already holds
    device_filter: tuple[bytes | str, ...] | None = None
    host_filter: tuple[bytes | str, ...] = ()
    rel: bytes = b""  # a draft's relation: its functions are declared by the super-plan
    plan: bytes = b""  # or a finished fragment's whole sub-plan, with its own declarations


@dataclass(frozen=True)
class CutSnapshot:
    """The plan (before the cut) or super-plan, its fragments, and which are alike, as bytes."""

    plan: bytes
    fragments: tuple[FragmentSnapshot, ...] = ()
    alike: tuple[tuple[str, ...], ...] = ()
    title: str = "super-plan"

    def render(self) -> str:
        super_plan = tree.parse_plan(self.plan)
        names = tree.function_names(super_plan)
        lines = [f"{self.title}:"]
        for relation in super_plan.relations:
            root = relation.root.input if relation.HasField("root") else relation.rel
            lines += render_rel(root, names, 1)
        for fragment in self.fragments:
            lines += _render_fragment(fragment, names)
        for group in self.alike:
            lines.append(f"alike: {', '.join(group)}")
        return "\n".join(lines)


def plan_snapshot(plan: plan_pb2.Plan) -> CutSnapshot:
    return CutSnapshot(plan.SerializeToString(), title="plan")


def cut_snapshot(cut: Cut) -> CutSnapshot:
    fragments = tuple(
        FragmentSnapshot(
            name=draft.name,
            dataset=draft.dataset,
            pushed=tuple(draft.pushed),
            notes=tuple(draft.notes),
            predicates=tuple(draft.predicates),
            device_filter=None
            if draft.device_conjuncts is None
            else tuple(c.SerializeToString() for c in draft.device_conjuncts),
            host_filter=tuple(c.SerializeToString() for c in draft.host_conjuncts),
            rel=draft.rel.SerializeToString(),
        )
        for draft in cut.fragments
    )
    return CutSnapshot(cut.plan.SerializeToString(), fragments)


def _render_fragment(fragment: FragmentSnapshot, super_names: Mapping[int, str]) -> list[str]:
    if fragment.plan:
        plan = tree.parse_plan(fragment.plan)
        rel, names = tree.root_rel(plan), tree.function_names(plan)
    else:
        rel, names = algebra_pb2.Rel(), super_names
        rel.ParseFromString(fragment.rel)
    pushed = ", ".join(fragment.pushed) or "nothing"
    lines = [f"{fragment.name} <- {fragment.dataset}: pushed {pushed}"]
    lines += render_rel(rel, names, 1)
    fields = _read_fields(rel)
    if fragment.device_filter is not None:
        shown = " AND ".join(_conjunct(c, names, fields) for c in fragment.device_filter)
        lines.append(_clipped(f"{INDENT}filter stage: {shown or 'none'}"))
    if fragment.host_filter:
        shown = " AND ".join(_conjunct(c, names, fields) for c in fragment.host_filter)
        lines.append(_clipped(f"{INDENT}host re-checks: {shown}"))
    if fragment.predicates:
        shown = " AND ".join(_predicate(p) for p in fragment.predicates)
        lines.append(_clipped(f"{INDENT}zone-map predicates: {shown}"))
    lines += [_clipped(f"{INDENT}note: {note}") for note in fragment.notes]
    return lines


def _read_fields(rel: algebra_pb2.Rel) -> list[str] | None:
    """The columns a fragment's one read reads, by which its raw conjuncts name fields."""
    reads = [r for r in tree.iter_rels(rel) if tree.kind(r) == "read"]
    if len(reads) != 1 or not reads[0].read.base_schema.names:
        return None
    return tree.read_field_names(reads[0].read)


def _conjunct(conjunct: bytes | str, names: Mapping[int, str], fields: Sequence[str] | None) -> str:
    if isinstance(conjunct, str):
        return conjunct
    expression = algebra_pb2.Expression()
    expression.ParseFromString(conjunct)
    return expressions.render(expression, names, fields)


def _predicate(predicate: Mapping) -> str:
    if predicate.get("op") in ("is_null", "is_not_null"):
        return f"{predicate['column']} {predicate['op'].replace('_', ' ').upper()}"
    return f"{predicate['column']} {predicate['op']} {predicate.get('value')!r}"


def render_rel(rel: algebra_pb2.Rel, names: Mapping[int, str], depth: int) -> list[str]:
    """``rel`` and everything below it, one line per relation; a subquery's relations below
    the relation whose expression holds it."""
    assert depth < tree.WALK_DEPTH_MAX, "Substrait tree deeper than protobuf allows"
    lines = [_clipped(INDENT * depth + _describe(rel, names))]
    inputs, subqueries = _below(tree.body(rel))
    for child in inputs:
        lines += render_rel(child, names, depth + 1)
    for child in subqueries:
        lines.append(INDENT * (depth + 1) + "subquery:")
        lines += render_rel(child, names, depth + 2)
    return lines


def _below(body: Message) -> tuple[list[algebra_pb2.Rel], list[algebra_pb2.Rel]]:
    """A relation's inputs, and the roots of the subqueries in its expressions."""
    inputs: list[algebra_pb2.Rel] = []
    stack: list[Message] = []
    for child in tree.children(body):
        (inputs if isinstance(child, algebra_pb2.Rel) else stack).append(child)
    subqueries: list[algebra_pb2.Rel] = []
    while stack:
        message = stack.pop()
        if isinstance(message, algebra_pb2.Rel):
            subqueries.append(message)
        else:
            stack.extend(reversed(list(tree.children(message))))
    return inputs, subqueries


def _describe(rel: algebra_pb2.Rel, names: Mapping[int, str]) -> str:
    kind = tree.kind(rel)
    fields = _input_fields(rel)
    if kind == "read":
        return _describe_read(rel.read)
    if kind == "filter":
        return f"filter {expressions.render(rel.filter.condition, names, fields)}"
    if kind == "project":
        shown = ", ".join(expressions.render(e, names, fields) for e in rel.project.expressions)
        return f"project {shown}".rstrip()
    if kind == "aggregate":
        return _describe_aggregate(rel.aggregate, names, fields)
    if kind == "sort":
        return f"sort {_sorts(rel.sort.sorts, names, fields)}"
    if kind == "fetch":
        return _describe_fetch(rel.fetch, names)
    if kind == "join":
        return _describe_join(rel.join, names)
    return kind


def _describe_join(join: algebra_pb2.JoinRel, names: Mapping[int, str]) -> str:
    join_type = algebra_pb2.JoinRel.JoinType.Name(join.type).removeprefix("JOIN_TYPE_").lower()
    if not join.HasField("expression"):
        return f"join {join_type}"
    return f"join {join_type} on {expressions.render(join.expression, names)}"


def _input_fields(rel: algebra_pb2.Rel) -> Sequence[str] | None:
    """Field names a relation's expressions read, when its input is a read of known columns."""
    below = tree.single_input(rel)
    if below is None or tree.kind(below) != "read" or not below.read.base_schema.names:
        return None
    read_fields = tree.read_field_names(below.read)
    return [read_fields[i] for i in tree.read_output_fields(below.read)]


def _describe_read(read: algebra_pb2.ReadRel) -> str:
    if read.HasField("named_table"):
        table = "/".join(read.named_table.names)
    else:
        table = f"({read.WhichOneof('read_type') or 'rows'})"
    if not read.base_schema.names:
        return f"read {table}"
    fields = tree.read_field_names(read)
    shown = [fields[i] for i in tree.read_output_fields(read)]
    return f"read {table} [{', '.join(shown)}]"


def _describe_aggregate(
    aggregate: algebra_pb2.AggregateRel, names: Mapping[int, str], fields: Sequence[str] | None
) -> str:
    keys = [expressions.render(e, names, fields) for e in aggregate.grouping_expressions]
    measures = []
    for measure in aggregate.measures:
        function = measure.measure
        arguments = ", ".join(
            expressions.render(a.value, names, fields) for a in function.arguments
        )
        distinct = (
            "DISTINCT "
            if function.invocation == algebra_pb2.AggregateFunction.AGGREGATION_INVOCATION_DISTINCT
            else ""
        )
        measures.append(f"{names.get(function.function_reference, '?')}({distinct}{arguments})")
    by = f" by {', '.join(keys)}" if keys else ""
    return f"aggregate{by}: {', '.join(measures)}".rstrip(": ")


def _sorts(
    sorts: Sequence[algebra_pb2.SortField], names: Mapping[int, str], fields: Sequence[str] | None
) -> str:
    shown = []
    for sort in sorts:
        direction = algebra_pb2.SortField.SortDirection.Name(sort.direction)
        direction = direction.removeprefix("SORT_DIRECTION_").replace("_", " ").lower()
        shown.append(f"{expressions.render(sort.expr, names, fields)} {direction}")
    return ", ".join(shown)


def _describe_fetch(fetch: algebra_pb2.FetchRel, names: Mapping[int, str]) -> str:
    parts = []
    if fetch.HasField("offset_expr"):
        parts.append(f"offset {expressions.render(fetch.offset_expr, names)}")
    if fetch.HasField("count_expr"):
        parts.append(f"count {expressions.render(fetch.count_expr, names)}")
    return " ".join(["fetch", *parts])


def _clipped(line: str) -> str:
    return line if len(line) <= LINE_CHARS_MAX else line[: LINE_CHARS_MAX - 1] + "…"
