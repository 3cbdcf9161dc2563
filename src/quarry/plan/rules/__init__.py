"""Decomposition rules: each module holds one rewrite of a `Cut`, a function `Cut -> Cut`.

`decompose.RULES` lists them in the order they run. A rule never mutates its argument; it
returns a new cut in which some operators have moved from the super-plan into fragments.
"""

from __future__ import annotations

from collections.abc import Callable

from substrait import algebra_pb2

from quarry.plan import tree
from quarry.plan.cut import Cut, FragmentDraft

Rule = Callable[[Cut], Cut]
SiteRewrite = Callable[[Cut, algebra_pb2.Rel, FragmentDraft], bool]


def rewrite_sites(cut: Cut, rel_kind: str, rewrite: SiteRewrite) -> Cut:
    """Apply `rewrite` to each `rel_kind` relation above an open fragment until none changes.

    `rewrite` returns whether it changed the cut. After a change the tree is walked again from
    the top, because a rewrite may replace relations the walk was holding.
    """
    cut = cut.copy()
    # Each change moves or closes at least one operator, so there are at most as many changes
    # as relations; the bound turns a rule that never settles into a failed assertion.
    changes_max = sum(1 for _ in tree.iter_rels(cut.plan)) + len(cut.fragments) + 1
    for _ in range(changes_max):
        if not any(rewrite(cut, rel, fragment) for rel, fragment in list(cut.sites(rel_kind))):
            return cut
    raise AssertionError(f"rule on {rel_kind} relations did not settle")
