"""Plans of any depth: a Substrait plan too deep for DataFusion's decoder runs in parts.

Substrait nests a plan as protobuf messages, and both decoders quarry's plans meet stop at 100
levels: DataFusion's (prost's recursion limit, compiled in) and Python's (upb's default). A join
nests four levels a table (a join, its wrapper, the projection DataFusion puts above it and its
wrapper), so SQLite's sqllogictest ``select5.test`` joins of 20 tables and more (up to 64, about
250 levels) could not be read back. Python's bound is lifted once (``tree.allow_deep_parsing``:
upb's switch for oversize messages also lifts its depth bound). DataFusion's is not ours to
change, so a plan that is too deep for it is consumed in parts (``split``): every relation
whose subtree would take its part past ``PART_DEPTH_MAX`` levels gives its tallest inputs to
parts of their own, each consumed alone and registered as a view, and read in their place
(``engine.consume``). DataFusion's analyzer inlines a view's plan where it is read
(``InlineTableScan``), so what runs is the plan the query was planned as; only its bytes
travel in parts.

A part is cut only where nothing inside it refers to a relation outside it (a correlated
subquery's outer reference): such a subtree is kept whole with its parent.
"""

from __future__ import annotations

from collections.abc import Callable

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from substrait import algebra_pb2, plan_pb2

from quarry.plan import tree

# prost's recursion limit (DataFusion 55): a message nested deeper is refused whole
DECODE_DEPTH_MAX = 100
# A part's own levels, the plan's and root's wrappers and the reads of its own parts included:
# a margin under the decoder's bound for the levels around a relation (Plan, PlanRel, RelRoot).
PART_DEPTH_MAX = 80
# Relations' inputs, by the oneof and field that holds them (expressions' subqueries are left
# with the expression: they may refer to the rows around them).
_INPUT_FIELDS = ("input", "left", "right", "inputs")

Register = Callable[[plan_pb2.Plan], algebra_pb2.Rel]


def too_deep(error: BaseException) -> bool:
    """Whether DataFusion refused a plan for its depth."""
    return "recursion limit reached" in str(error)


def height(message: Message, known: dict[int, int] | None = None) -> int:
    """The levels of nested messages ``message`` spans, itself included; ``known`` holds the
    heights of sub-messages already measured, by identity (their objects kept alive)."""
    if known and id(message) in known:
        return known[id(message)]
    below = [height(child, known) for child in tree.children(message)]
    return 1 + max(below, default=0)


def split(plan: plan_pb2.Plan, register: Register) -> plan_pb2.Plan:
    """``plan`` (changed in place) with subtrees handed to ``register`` as plans of their own,
    innermost first, each replaced by the relation ``register`` returns (a read of it), until
    every part is at most ``PART_DEPTH_MAX`` levels tall."""
    _reduce(plan, tree.root_rel(plan), register)
    return plan


def _reduce(plan: plan_pb2.Plan, rel: algebra_pb2.Rel, register: Register) -> int:
    """Cut what must go under ``rel``; its height after. Each input is measured once, after
    its own cuts, so a plan is walked about once whatever its depth."""
    inputs = _inputs(rel)  # kept alive: their identities key ``known``
    known = {id(child): _reduce(plan, child, register) for child in inputs}
    own = height(rel, known)
    for child in sorted(inputs, key=lambda c: -known[id(c)]):
        if own <= PART_DEPTH_MAX:
            break
        if not _self_contained(child):
            continue
        tree.replace(child, register(tree.make_plan(plan, child)))
        known[id(child)] = height(child)
        own = height(rel, known)
    return own


def _inputs(rel: algebra_pb2.Rel) -> list[algebra_pb2.Rel]:
    body = tree.body(rel)
    found: list[algebra_pb2.Rel] = []
    for field, value in body.ListFields():
        if field.name not in _INPUT_FIELDS or field.type != FieldDescriptor.TYPE_MESSAGE:
            continue
        found.extend(value if field.is_repeated else [value])
    return [item for item in found if isinstance(item, algebra_pb2.Rel)]


def _self_contained(rel: algebra_pb2.Rel) -> bool:
    """No outer reference in ``rel`` reaches past it: every one sits in a subquery at least as
    many levels deep as it steps out."""
    return _reaches_out(rel, 0) is False


def _reaches_out(message: Message, subqueries: int) -> bool:
    if isinstance(message, algebra_pb2.Expression.FieldReference) and message.HasField(
        "outer_reference"
    ):
        return message.outer_reference.steps_out > subqueries
    if isinstance(message, algebra_pb2.Expression.Subquery):
        subqueries += 1
    return any(_reaches_out(child, subqueries) for child in tree.children(message))
