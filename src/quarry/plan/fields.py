"""fields: where a column of a Substrait relation comes from, one operator down at a time.

A field of a relation is followed to the input field it is a copy of: through a projection that
passes it on, a filter, a sort, a limit, an aggregate's grouping key, either side of a join.
``join_filters`` follows a join's key to the fragment read it comes from (the column a key set
may cut), and ``rules.inner_by_equality`` to the outer join whose null-supplying side it comes
from; ``rules.build_side`` counts a relation's columns (``width``).
"""

from __future__ import annotations

from collections.abc import Mapping

from substrait import algebra_pb2

from quarry.plan import expressions, tree

J = algebra_pb2.JoinRel
# the sides a filter on a column passes through unchanged, below a join
PASS_SIDES = {
    J.JOIN_TYPE_INNER: ("left", "right"),
    J.JOIN_TYPE_LEFT: ("left",),
    J.JOIN_TYPE_RIGHT: ("right",),
    J.JOIN_TYPE_LEFT_SEMI: ("left",),
    J.JOIN_TYPE_LEFT_ANTI: ("left",),
    J.JOIN_TYPE_RIGHT_SEMI: ("right",),
    J.JOIN_TYPE_RIGHT_ANTI: ("right",),
}
RIGHT_ONLY = (J.JOIN_TYPE_RIGHT_SEMI, J.JOIN_TYPE_RIGHT_ANTI)  # joins that output one side
LEFT_ONLY = (J.JOIN_TYPE_LEFT_SEMI, J.JOIN_TYPE_LEFT_ANTI)


def equalities(join: algebra_pb2.JoinRel, names: Mapping[int, str]) -> list[tuple[int, int]]:
    """The join's ``left.a = right.b`` conjuncts, as (a, b) column positions of each side."""
    left_width = width(join.left)
    if left_width is None or not join.HasField("expression"):
        return []
    found = []
    for part in expressions.conjuncts(join.expression, names):
        if expressions.function_name(part, names) != "equal":
            continue
        fields = [expressions.field_index(a) for a in expressions.arguments(part)]
        if len(fields) != 2 or None in fields:
            continue
        low, high = sorted(fields)  # type: ignore[type-var]
        if low < left_width <= high:
            found.append((low, high - left_width))
    return found


def unmapped(rel: algebra_pb2.Rel, index: int) -> int | None:
    """Field ``index`` of ``rel`` as the operator itself numbers it (before its emit)."""
    mapping = emit(rel)
    if mapping is None:
        return index
    return mapping[index] if index < len(mapping) else None


def step_down(rel: algebra_pb2.Rel, index: int, probe: bool) -> tuple[algebra_pb2.Rel, int] | None:
    """One operator down: the input, and its field, that field ``index`` of ``rel`` comes from
    unchanged (None: it does not, or not through a filter on it for a ``probe``)."""
    here = unmapped(rel, index)
    if here is None:
        return None
    kind = tree.kind(rel)
    if kind in ("filter", "sort") or (kind == "fetch" and not probe):
        return tree.single_input(rel), here  # type: ignore[return-value]
    if kind == "project":
        return _project(rel.project, here)
    if kind == "aggregate":
        return _aggregate(rel.aggregate, here)
    if kind == "join":
        return _join(rel.join, here, probe)
    return None


def _project(project: algebra_pb2.ProjectRel, index: int) -> tuple[algebra_pb2.Rel, int] | None:
    below = width(project.input)
    if below is None:
        return None
    if index < below:
        return project.input, index
    field = expressions.field_index(project.expressions[index - below])
    return None if field is None else (project.input, field)


def _aggregate(
    aggregate: algebra_pb2.AggregateRel, index: int
) -> tuple[algebra_pb2.Rel, int] | None:
    keys = grouping_keys(aggregate)
    if keys is None or index >= len(keys):
        return None
    field = expressions.field_index(keys[index])
    return None if field is None else (aggregate.input, field)


def _join(join: algebra_pb2.JoinRel, index: int, probe: bool) -> tuple[algebra_pb2.Rel, int] | None:
    left_width = width(join.left)
    if left_width is None:
        return None
    if join.type in RIGHT_ONLY:
        side, index = "right", index
    elif join.type in LEFT_ONLY or index < left_width:
        side = "left"
    else:
        side, index = "right", index - left_width
    if probe and side not in PASS_SIDES.get(join.type, ()):
        return None
    return (join.left if side == "left" else join.right), index


def width(rel: algebra_pb2.Rel) -> int | None:
    """How many columns ``rel`` outputs (None: an operator this module does not follow)."""
    mapping = emit(rel)
    if mapping is not None:
        return len(mapping)
    kind = tree.kind(rel)
    if kind == "read":
        return len(tree.read_output_fields(rel.read))
    if kind in ("filter", "sort", "fetch"):
        return width(tree.single_input(rel))  # type: ignore[arg-type]
    if kind == "set" and rel.set.inputs:
        return width(rel.set.inputs[0])
    if kind == "project":
        below = width(rel.project.input)
        return None if below is None else below + len(rel.project.expressions)
    if kind == "aggregate":
        keys = grouping_keys(rel.aggregate)
        return None if keys is None else len(keys) + len(rel.aggregate.measures)
    if kind == "join":
        return _join_width(rel.join)
    return None


def _join_width(join: algebra_pb2.JoinRel) -> int | None:
    left, right = width(join.left), width(join.right)
    if left is None or right is None:
        return None
    if join.type in LEFT_ONLY:
        return left
    if join.type in RIGHT_ONLY:
        return right
    if join.type in (J.JOIN_TYPE_LEFT_MARK, J.JOIN_TYPE_RIGHT_MARK):
        return None
    return left + right


def grouping_keys(aggregate: algebra_pb2.AggregateRel) -> list | None:
    """The grouping expressions, in output order; None for grouping sets."""
    if len(aggregate.groupings) > 1:
        return None
    if not aggregate.groupings:
        return []
    grouping = aggregate.groupings[0]
    return [aggregate.grouping_expressions[r] for r in grouping.expression_references]


def emit(rel: algebra_pb2.Rel) -> list[int] | None:
    common = getattr(tree.body(rel), "common", None)
    if common is None or not common.HasField("emit"):
        return None
    return list(common.emit.output_mapping)
