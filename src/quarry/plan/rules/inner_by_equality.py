"""inner_by_equality: an outer join whose null-supplying side an inner join above compares with
``=`` is an inner join. A rule over the query's Substrait plan, before the cut
(``decompose.PLAN_RULES``), so the cut, the join keys and every device see it.

TPC-DS Q93 reads ``store_sales LEFT JOIN store_returns ON ... , reason WHERE sr_reason_sk =
r_reason_sk AND r_reason_desc = 'reason 28'``. A sale without a return has ``sr_reason_sk``
NULL, and ``=`` never holds for NULL: the inner join with reason drops every row the left join
added, so it is an inner join. DataFusion turns an outer join inner for a filter above it, not
for the condition of a join above (the filter has become one by then). As an outer join, no
key could cut either side (the preserved side is never cut): at SF 1 the host received all of
store sales, 149 MB. As an inner join, reason's keys cut store_returns and its keys cut the
sales.

The field compared is followed down unchanged, through projections, filters, sorts, the
grouping keys of an aggregate (a group whose key is NULL is dropped above just the same) and
either side of inner and outer joins, to the first outer join whose null-supplying side it
comes from. Not through a limit (it would take other rows), a set operation, a full, semi, anti
or mark join, nor a computed expression (``coalesce(sr_reason_sk, 0) = ...`` holds for NULL).
"""

from __future__ import annotations

from substrait import algebra_pb2, plan_pb2

from quarry.plan import tree
from quarry.plan.fields import equalities, step_down, unmapped, width
from quarry.plan.rules import Rule

J = algebra_pb2.JoinRel
NAME = "inner_by_equality"


def inner_joins_by_equality(plan: plan_pb2.Plan) -> int:
    """Turn, in place, each outer join an inner join's ``=`` above makes inner; how many."""
    names = tree.function_names(plan)
    turned = 0
    for rel in list(tree.iter_rels(plan)):
        if tree.kind(rel) != "join" or rel.join.type != J.JOIN_TYPE_INNER:
            continue
        for left, right in equalities(rel.join, names):
            for side, field in ((rel.join.left, left), (rel.join.right, right)):
                outer = _null_supplier(side, field)
                if outer is not None:
                    outer.type = J.JOIN_TYPE_INNER
                    turned += 1
    return turned


def _null_supplier(rel: algebra_pb2.Rel, index: int) -> algebra_pb2.JoinRel | None:
    """The first outer join below whose null-supplying side field ``index`` of ``rel`` comes
    from unchanged (None: there is none, or the way down passes something a NULL may not)."""
    while True:
        kind = tree.kind(rel)
        if kind == "fetch":
            return None
        if kind == "join":
            here, join = unmapped(rel, index), rel.join
            left_width = width(join.left)
            if here is None or left_width is None:
                return None
            if join.type not in (J.JOIN_TYPE_INNER, J.JOIN_TYPE_LEFT, J.JOIN_TYPE_RIGHT):
                return None
            on_right = here >= left_width
            if join.type == (J.JOIN_TYPE_LEFT if on_right else J.JOIN_TYPE_RIGHT):
                return join
        below = step_down(rel, index, probe=False)
        if below is None:
            return None
        rel, index = below


def _apply(plan: plan_pb2.Plan) -> tuple[plan_pb2.Plan, bool]:
    return plan, inner_joins_by_equality(plan) > 0


inner_by_equality = Rule(NAME, _apply)
