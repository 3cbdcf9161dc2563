"""build_side: each hash join of the super-plan builds on the input with fewer rows, counted in
the rows its fragments actually delivered. A rule over the super-plan at run time, once every
fragment is in (``superplan``), not over the cut: only then are the counts known.

DataFusion builds a hash join's table from its left input and leaves the choice to statistics.
Over the spooled fragments it knows each table's row count, but no column's distinct values or
range, so it estimates a join's output as tiny (TPC-DS Q99: catalog_sales' 288,000 rows joined
to five warehouses, "about 5 rows") and the joins above it then build on the fact table and
probe with the dimension: 288,000 rows hashed three times to look up 366 dates, 20 ship modes
and 6 call centres, 80 of the super-plan's 95 ms. The other way round, each join hashes the few
rows and streams the many through: 34 ms.

Here a join's rows are reckoned from its inputs' (a fragment's or a computed table's delivered
rows; a filter, projection or sort as many as below; an aggregate with no grouping one; a join
the larger input, as a key-to-key join of a fact and a dimension keeps; a union the sum), and a
join whose left input is reckoned larger than its right is turned round: inputs swapped, its
condition's references moved along, the output put back in its order by the join's emit, so
nothing above it changes; a left join becomes a right one, a semi or anti join keeps the same
side under its mirrored name; one whose condition holds a subquery is left as it came. The
session then keeps DataFusion from turning the joins back (``engine.session`` without
``swap_joins``). A plan with a join over an input that cannot be reckoned (a grouped
aggregate's output) is left whole, to DataFusion's own choices (``smaller_builds``).
"""

from __future__ import annotations

from collections.abc import Mapping

from substrait import algebra_pb2, plan_pb2

from quarry.plan import expressions, tree
from quarry.plan.fields import width

Expression = algebra_pb2.Expression
J = algebra_pb2.JoinRel

# Each join type and what it becomes with its inputs swapped; a type missing is left alone
# (mark joins: their extra column's place depends on the side).
MIRRORED = {
    J.JOIN_TYPE_INNER: J.JOIN_TYPE_INNER,
    J.JOIN_TYPE_OUTER: J.JOIN_TYPE_OUTER,
    J.JOIN_TYPE_LEFT: J.JOIN_TYPE_RIGHT,
    J.JOIN_TYPE_RIGHT: J.JOIN_TYPE_LEFT,
    J.JOIN_TYPE_LEFT_SEMI: J.JOIN_TYPE_RIGHT_SEMI,
    J.JOIN_TYPE_RIGHT_SEMI: J.JOIN_TYPE_LEFT_SEMI,
    J.JOIN_TYPE_LEFT_ANTI: J.JOIN_TYPE_RIGHT_ANTI,
    J.JOIN_TYPE_RIGHT_ANTI: J.JOIN_TYPE_LEFT_ANTI,
}
ONE_SIDE = frozenset(
    {J.JOIN_TYPE_LEFT_SEMI, J.JOIN_TYPE_RIGHT_SEMI, J.JOIN_TYPE_LEFT_ANTI, J.JOIN_TYPE_RIGHT_ANTI}
)


def smaller_builds(plan: plan_pb2.Plan, rows: Mapping[str, int]) -> int | None:
    """Turn round, in place, each join of ``plan`` whose left input is reckoned to hold more rows
    than its right; ``rows`` are the delivered rows of the tables its reads name. How many
    joins were turned; None, and the plan left as it is, when some join's inputs cannot both be
    reckoned (a grouped aggregate's output: DataFusion then chooses every join's build side,
    as a plan half chosen here and half left as written ran slower than either: TPC-DS Q14,
    its joins over INTERSECTed aggregates, 530 against 690 ms). Joins inside a subquery
    expression are not looked at (the walk follows relations' inputs only: a super-plan's
    subqueries are already joins)."""
    roots = [r.root.input if r.HasField("root") else r.rel for r in plan.relations]
    judging = _Walk(rows, turn=False)
    for root in roots:
        judging.rows_of(root)
    if judging.unjudged:
        return None
    turning = _Walk(rows, turn=True)
    for root in roots:
        turning.rows_of(root)
    return turning.turned


class _Walk:
    """One pass, inputs before the relations above them: each relation's reckoned rows, and
    with ``turn`` each join turned once its inputs are reckoned (turning copies them, so a join
    is turned only after everything below it is done); else how many joins were not judged."""

    def __init__(self, rows: Mapping[str, int], turn: bool):
        self.rows = rows
        self.turn = turn
        self.turned = 0
        self.unjudged = 0

    def rows_of(self, rel: algebra_pb2.Rel) -> int | None:
        """The rows ``rel`` is reckoned to output (None: not reckoned)."""
        kind = tree.kind(rel)
        if kind == "read":
            name = tree.named_table(rel)
            return None if name is None else self.rows.get(".".join(name))
        if kind == "join":
            left, right = self.rows_of(rel.join.left), self.rows_of(rel.join.right)
            if left is None or right is None:
                self.unjudged += 1
                return None
            if self.turn:
                self.turned += _turn(rel.join, left, right)
            return max(left, right)
        if kind == "set":
            counts = [self.rows_of(part) for part in rel.set.inputs]
            return None if None in counts else sum(counts)  # type: ignore[arg-type]
        if kind == "cross":
            left, right = self.rows_of(rel.cross.left), self.rows_of(rel.cross.right)
            return None if left is None or right is None else left * right
        below = tree.single_input(rel)
        if below is None and "input" in tree.body(rel).DESCRIPTOR.fields_by_name:
            below = tree.body(rel).input  # a window, an expand: joins below are turned too
        counted = None if below is None else self.rows_of(below)
        if kind in ("filter", "project", "sort"):
            return counted
        if kind == "fetch":
            count = expressions.literal_int(rel.fetch.count_expr)
            return counted if count is None or counted is None else min(counted, count)
        if kind == "aggregate":
            grouped = rel.aggregate.groupings or rel.aggregate.grouping_expressions
            return None if grouped else 1
        return None


def _turn(join: algebra_pb2.JoinRel, left_rows: int, right_rows: int) -> bool:
    if left_rows <= right_rows:
        return False
    if join.type not in MIRRORED or _has_subquery(join):
        return False
    left_width, right_width = width(join.left), width(join.right)
    if left_width is None or right_width is None:
        return False

    def moved(index: int) -> int:
        return index + right_width if index < left_width else index - left_width

    for condition in (join.expression, join.post_join_filter):
        _move_fields(condition, moved)
    if join.type not in ONE_SIDE:
        emit = join.common.emit
        order = list(emit.output_mapping) or list(range(left_width + right_width))
        del emit.output_mapping[:]
        emit.output_mapping.extend(moved(index) for index in order)
    left = algebra_pb2.Rel()
    left.CopyFrom(join.left)
    join.left.CopyFrom(join.right)
    join.right.CopyFrom(left)
    join.type = MIRRORED[join.type]
    return True


def _has_subquery(join: algebra_pb2.JoinRel) -> bool:
    return any(
        isinstance(item, Expression) and item.WhichOneof("rex_type") == "subquery"
        for condition in (join.expression, join.post_join_filter)
        for item in tree.iter_messages(condition)
    )


def _move_fields(condition: Expression, moved) -> None:
    for item in tree.iter_messages(condition):
        if isinstance(item, Expression.FieldReference) and item.HasField("root_reference"):
            field = item.direct_reference.struct_field
            field.field = moved(field.field)
