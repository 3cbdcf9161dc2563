"""semi_join_down: a semi or anti join whose condition reads, of its left input, only columns of
one side of an inner join below moves onto that side. A rule over the query's Substrait plan,
before the cut (``decompose.PLAN_RULES``).

``d_date IN (SELECT d_date FROM date_dim WHERE d_week_seq IN (...))`` (TPC-DS Q83; Q33, Q56 and
Q60 with ``i_item_id IN (SELECT ...)``) becomes a semi join, and DataFusion leaves it above the
joins of its query: over returns joined to items and dates. Whether a row passes it depends on
that row's ``d_date`` alone, a column of the dates, so it filters the dates as well before the
join as after it, for the same rows: ``(A join B) semi C = A join (B semi C)`` when the semi
join's condition reads of ``A join B`` only columns of ``B`` (an anti join, even a null-aware
one, alike: what it keeps of a row of ``B`` depends on that row and on ``C`` alone). The host
then joins the returns to the dates of those weeks alone, not to every date before dropping
most of what that made (SF 1: 82 -> 58 ms). The dates' keys do not cut the returns through
the host's filter (``join_filters``): such pairs are chosen before every other, and TPC-DS Q95's
web sales then waited for 42,000 returned orders' keys instead of a fortnight of dates'.

Only a filter of a table by a subquery over that same table moves, and only onto that table's
read: a subquery over other tables (TPC-H Q18's orders ``IN`` the keys a ``HAVING`` over lineitem
leaves, Q16's and Q20's suppliers) stays above the join, where its keys cut both sides of the
join through its equality (moved, TPC-H SF 1 Q18 shipped 185 MB instead of 41). The columns are
followed down through projections that pass them on and through filters, to an inner join; not
through anything else (a limit, an aggregate, an outer join: the rows below are not the rows
above). The semi join's own output is its left input's columns, so the relations
above see the same fields; it moves only when it has no output mapping nor post-join filter of
its own, and when its condition reads no subquery.
"""

from __future__ import annotations

from google.protobuf.message import Message
from substrait import algebra_pb2, plan_pb2

from quarry.plan import expressions, tree
from quarry.plan.fields import emit, step_down, unmapped, width
from quarry.plan.rules import Rule

J = algebra_pb2.JoinRel
NAME = "semi_join_down"
SEMI_ANTI = (J.JOIN_TYPE_LEFT_SEMI, J.JOIN_TYPE_LEFT_ANTI)
MOVES_MAX = 256


def semi_joins_down(plan: plan_pb2.Plan) -> int:
    """Move, in place, each semi or anti join down onto the table read it filters, past as
    many inner joins as lie between; how many moved (at most ``MOVES_MAX``)."""
    moved = 0
    while moved < MOVES_MAX and any(_moved_down(rel) for rel in tree.iter_rels(plan)):
        moved += 1  # a move copies relations: the walk starts again on the plan as it is
    return moved


def _moved_down(rel: algebra_pb2.Rel) -> bool:
    if tree.kind(rel) != "join" or rel.join.type not in SEMI_ANTI:
        return False
    join = rel.join
    if emit(rel) is not None or join.HasField("post_join_filter") or _has_subquery(join):
        return False
    left_width, right_width = width(join.left), width(join.right)
    if left_width is None or right_width is None:
        return False
    reads = expressions.referenced_fields(join.expression)
    lefts = sorted(f for f in reads if f < left_width)
    found = _side_below(join.left, lefts) if lefts else None
    if found is None:
        return False
    side, mapping = found
    while (deeper := _side_below(side, sorted(set(mapping.values())))) is not None:
        side, mapping = deeper[0], {f: deeper[1][at] for f, at in mapping.items()}
    side_width = width(side)
    if side_width is None or not _same_table(side, join.right):
        return False
    moved = algebra_pb2.Rel()
    moved.join.CopyFrom(join)
    moved.join.left.CopyFrom(side)
    shift = side_width - left_width
    _remap(moved.join.expression, lambda f: mapping[f] if f < left_width else f + shift)
    side.CopyFrom(moved)  # the side, semi-joined: the same columns as before
    tree.replace(rel, join.left)  # the semi join's place: its input, the side below changed
    return True


def _side_below(rel: algebra_pb2.Rel, fields: list[int]) -> tuple[algebra_pb2.Rel, dict] | None:
    """The input of the first inner join below that every one of ``fields`` of ``rel`` comes
    from unchanged, through projections and filters, and where each is in it (None: none)."""
    mapping = {f: f for f in fields}
    while tree.kind(rel) in ("project", "filter"):
        below = None
        for field, at in mapping.items():
            step = step_down(rel, at, probe=False)
            if step is None:
                return None
            below, mapping[field] = step
        assert below is not None
        rel = below
    if tree.kind(rel) != "join" or rel.join.type != J.JOIN_TYPE_INNER:
        return None
    left_width = width(rel.join.left)
    inside = {field: unmapped(rel, at) for field, at in mapping.items()}
    if left_width is None or any(at is None for at in inside.values()):
        return None
    if all(at < left_width for at in inside.values()):  # type: ignore[operator]
        return rel.join.left, inside
    if all(at >= left_width for at in inside.values()):  # type: ignore[operator]
        return rel.join.right, {f: at - left_width for f, at in inside.items()}  # type: ignore[operator]
    return None


def _same_table(side: algebra_pb2.Rel, right: algebra_pb2.Rel) -> bool:
    """Whether ``side`` reads one table (through filters and projections) and everything the
    semi join compares with reads that table too: a filter of a table by a subquery over
    itself (Q83's dates of some weeks, Q33's items of some ids). A subquery over other tables
    (TPC-H Q18's orders ``IN`` the keys a ``HAVING`` over lineitem leaves) stays above the
    join: there its keys cut both sides of the join by its equality, below only one."""
    own = [r for r in tree.iter_rels(side)]
    if any(tree.kind(r) not in ("read", "filter", "project") for r in own):
        return False
    tables = {tree.named_table(r) for r in own if tree.kind(r) == "read"}
    theirs = {tree.named_table(r) for r in tree.iter_rels(right) if tree.kind(r) == "read"}
    return len(tables) == 1 and None not in tables and theirs == tables


def _has_subquery(join: algebra_pb2.JoinRel) -> bool:
    return any(
        isinstance(m, algebra_pb2.Expression) and m.WhichOneof("rex_type") == "subquery"
        for m in tree.iter_messages(join.expression)
    )


def _remap(message: Message, new_index) -> None:
    """Each plain field reference of the expression (at its own level) to ``new_index(it)``."""
    if isinstance(message, algebra_pb2.Expression):
        index = expressions.field_index(message)
        if index is not None:
            message.selection.direct_reference.struct_field.field = new_index(index)
            return
    for child in tree.children(message):
        _remap(child, new_index)


def _apply(plan: plan_pb2.Plan) -> tuple[plan_pb2.Plan, bool]:
    return plan, semi_joins_down(plan) > 0


semi_join_down = Rule(NAME, _apply)
