"""repeats: the fragments whose repeated rows change nothing the query answers, so their devices
may drop them before shipping (``SubstraitArgs.distinct``).

A row that comes twice out of a fragment reaches the answer twice only through operators that
count: a sum, a count, a LIMIT, the rows of the result themselves. Below a ``DISTINCT`` (an
aggregate with only grouping keys, or whose every measure is ``min``, ``max`` or a ``DISTINCT``
one), or on the filtering side of a semi or anti join (``EXISTS``, ``IN``: only whether a match
exists), a repeat changes nothing, through projections, filters, sorts and joins on the way.
TPC-H Q4 asks whether an order has a late line; its lineitem fragment shipped every late line's
order key, up to seven to an order, stored together: dropped on the device, each order's key
ships once (2.3 to 1.6 MB). TPC-DS Q38 and Q87 intersect the distinct (customer, day) of a
year's sales: a ticket's ten items are one row each.

Dropping repeats is an optimization that never changes the answer (whatever a device drops or
keeps, the operator above drops or ignores): a device drops each row equal to the one before it
(``rowwise.adjacent_once``), the host completes pushed-back ranges without dropping any, and a
fragment read anywhere else where repeats count (a subquery's read, a second read of a shared
fragment) is not marked at all.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterator, Mapping

from substrait import algebra_pb2

from quarry.plan import tree

SHAPES_KEPT_MAX = 256  # super-plans judged, kept
J = algebra_pb2.JoinRel
A = algebra_pb2.AggregateFunction
# joins whose right (left) input only filters the other: its repeats change nothing
_RIGHT_FILTERS = (J.JOIN_TYPE_LEFT_SEMI, J.JOIN_TYPE_LEFT_ANTI, J.JOIN_TYPE_LEFT_MARK)
_LEFT_FILTERS = (J.JOIN_TYPE_RIGHT_SEMI, J.JOIN_TYPE_RIGHT_ANTI, J.JOIN_TYPE_RIGHT_MARK)
_PASSING = ("project", "filter", "sort", "cross")  # a repeat in, a repeat out: no more
_BLIND_MEASURES = frozenset({"min", "max"})


@functools.lru_cache(maxsize=SHAPES_KEPT_MAX)
def repeat_blind(super_plan: bytes) -> frozenset[str]:
    """The fragments (by the names the super-plan reads them by) every read of which is where
    a repeated row changes nothing."""
    plan = tree.parse_plan(super_plan)
    names = tree.function_names(plan)
    blind: dict[str, bool] = {}
    walked: Counter[str] = Counter()
    for rel, under in _walk(tree.root_rel(plan), False, names):
        table = tree.named_table(rel)
        if table is not None and len(table) == 1:
            blind[table[0]] = blind.get(table[0], True) and under
            walked[table[0]] += 1
    # a read in a subquery of an expression is not walked, nor judged: its fragment is not
    reads = Counter(t[0] for rel in tree.iter_rels(plan) if (t := tree.named_table(rel)))
    return frozenset(name for name, yes in blind.items() if yes and walked[name] == reads[name])


def _walk(
    rel: algebra_pb2.Rel, blind: bool, names: Mapping[int, str]
) -> Iterator[tuple[algebra_pb2.Rel, bool]]:
    """Each relation down the inputs from ``rel``, with whether its repeats change nothing."""
    stack = [(rel, blind)]
    while stack:
        here, under = stack.pop()
        yield here, under
        stack.extend(_inputs(here, under, names))


def _inputs(
    rel: algebra_pb2.Rel, blind: bool, names: Mapping[int, str]
) -> list[tuple[algebra_pb2.Rel, bool]]:
    kind = tree.kind(rel)
    if kind in _PASSING:
        return [(child, blind) for child in _rel_inputs(rel)]
    if kind == "aggregate":  # its input's repeats count in its sums, wherever it is
        return [(rel.aggregate.input, _distinct(rel.aggregate, names))]
    if kind == "join":
        join = rel.join
        return [
            (join.left, blind or join.type in _LEFT_FILTERS),
            (join.right, blind or join.type in _RIGHT_FILTERS),
        ]
    if kind == "set":
        union = rel.set.op in (
            algebra_pb2.SetRel.SET_OP_UNION_ALL,
            algebra_pb2.SetRel.SET_OP_UNION_DISTINCT,
        )
        distinct = rel.set.op == algebra_pb2.SetRel.SET_OP_UNION_DISTINCT
        return [(child, (blind and union) or distinct) for child in rel.set.inputs]
    return [(child, False) for child in _rel_inputs(rel)]  # a limit, a window, anything else


def _rel_inputs(rel: algebra_pb2.Rel) -> list[algebra_pb2.Rel]:
    kind = tree.kind(rel)
    if kind in ("join", "cross"):
        body = tree.body(rel)
        return [body.left, body.right]
    if kind == "set":
        return list(rel.set.inputs)
    below = tree.single_input(rel)
    return [] if below is None else [below]


def _distinct(aggregate: algebra_pb2.AggregateRel, names: Mapping[int, str]) -> bool:
    """Whether the aggregate's output is the same over its input's distinct rows."""
    return all(
        measure.measure.invocation == A.AGGREGATION_INVOCATION_DISTINCT
        or names.get(measure.measure.function_reference) in _BLIND_MEASURES
        for measure in aggregate.measures
    )
