"""split_alike_by_join_keys: alike fragments are read each on its own when a join's keys would
cut their reads apart and would not cut the one shared fragment.

A join's keys cut a fragment (``join_filters``: the devices drop rows whose key the other side
lacks) only when the cut is right for every read of it, and the cut of one read may be wrong for
another. Q21's l1 is cut by the suppliers of one nation (4% of them) and its l3 by l1's order
keys; read once, neither was, and Q21 shipped every row of both (1.6 GB at SF 10, past its
super-plan's memory). A shared fragment that some pair cuts stays shared (Q2's partsupp, both
reads cut by part's keys): cutting its reads apart would scan it twice for cuts that only make
it wait.

Which fragments a join's keys cut depends on the catalog (rows per dataset, the share a filter
keeps of a sampled slice), so the coordinator finds them and hands the rule that finding
(``cut_by``); the rule decides the rewrite. It runs before ``read_once``, which reads the alike
groups this leaves once (``coordinator.query.planning.shared_rules``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import replace
from typing import TypeVar

from quarry.plan.rules import Rule
from quarry.plan.rules.read_once import Alike, read_each_once

D = TypeVar("D", bound=Alike)
NAME = "split_alike_by_join_keys"


def split_alike_by_join_keys(cut_by: Callable[[D], Collection[str]]) -> Rule[D]:
    """The rule, for ``cut_by``: the fragments of a decomposition that a join's keys cut."""

    def apply(decomposition: D) -> tuple[D, bool]:
        if not decomposition.alike:
            return decomposition, False
        cut = cut_by(read_each_once(decomposition))
        uncut = [group for group in decomposition.alike if group[0] not in cut]
        if not uncut:
            return decomposition, False
        apart = set(cut_by(decomposition))
        split = [group for group in uncut if apart & set(group)]
        if not split:
            return decomposition, False
        alike = tuple(group for group in decomposition.alike if group not in split)
        return replace(decomposition, alike=alike), True  # type: ignore[type-var]

    return Rule(NAME, apply)
