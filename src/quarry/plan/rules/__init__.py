"""Decomposition rules: each module holds one named rewrite, a `Rule` (DataFusion's
`OptimizerRule`: a `name` and `apply` returning the new subject and whether it changed).

Rules come in three ordered lists, one per phase of `decompose` (``decompose.PLAN_RULES``,
``RULES``, ``DECOMPOSITION_RULES``), and `optimizer.optimize` runs a list: it copies its input
once, hands each rule that copy, records the rules that fired, and bounds every fixpoint. A rule
may therefore change the subject it is given in place; it says whether it did, so the loop knows
when a fixpoint has settled without comparing plans.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from substrait import algebra_pb2

from quarry.plan import tree
from quarry.plan.cut import Cut, FragmentDraft

Subject = TypeVar("Subject")
SiteRewrite = Callable[[Cut, algebra_pb2.Rel, FragmentDraft], bool]


@dataclass(frozen=True)
class Rule(Generic[Subject]):
    """A named rewrite; ``apply`` may change its argument (the optimizer's own copy) in place,
    and returns the result and whether anything changed."""

    name: str  # the module's name, as EXPLAIN VERBOSE shows it
    apply: Callable[[Subject], tuple[Subject, bool]]


@dataclass(frozen=True)
class Fixpoint(Generic[Subject]):
    """Rules applied in turn, round after round, until a whole round changes nothing: for
    rewrites that expose work for each other (a filter moved down uncovers a projection)."""

    name: str
    rules: tuple[Rule[Subject], ...]
    rounds_max: int


class RuleDidNotSettle(AssertionError):
    """A rule (or a fixpoint of rules) kept changing the cut past its bound: a bug in the rule,
    named in the message, not in the query."""


def rewrite_sites(cut: Cut, rel_kind: str, rewrite: SiteRewrite) -> bool:
    """Apply `rewrite` to each `rel_kind` relation above an open fragment until none changes;
    whether any did. The cut is changed in place.

    `rewrite` returns whether it changed the cut. After a change the tree is walked again from
    the top, because a rewrite may replace relations the walk was holding.
    """
    # Each change moves or closes at least one operator, so there are at most as many changes
    # as relations; the bound turns a rule that never settles into an error naming it.
    changes_max = sum(1 for _ in tree.iter_rels(cut.plan)) + len(cut.fragments) + 1
    changed = False
    for _ in range(changes_max):
        if not any(rewrite(cut, rel, fragment) for rel, fragment in list(cut.sites(rel_kind))):
            return changed
        changed = True
    raise RuleDidNotSettle(f"{rel_kind} relations still changed after {changes_max} rewrites")
