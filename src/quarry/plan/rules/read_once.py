"""read_once: alike fragments are read once. Two reads of a dataset the same way (Q21 reads
lineitem thrice, l1 and l3 alike) ship one fragment, and the super-plan reads its output for
both: the devices scan and ship it once.

A rule over the finished decomposition (``decompose.DECOMPOSITION_RULES``): which fragments are
alike is only known once each is built (``finalize`` groups those whose dataset and three stages
are the same bytes, ``Decomposition.alike``). Every group left in ``alike`` is read once; a rule
before it may take groups out (``split_alike_by_join_keys``: a join's keys cut their reads
apart). Decompositions are shared by the plan cache, so this builds a new one and never changes
the one given.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol, TypeVar

from quarry.plan import tree
from quarry.plan.rules import Rule

SHAPES_KEPT_MAX = 256  # super-plans whose reads were renamed, kept


class Named(Protocol):
    name: str


class Alike(Protocol):
    """What read_once reads of a ``decompose.Decomposition`` (which imports the rules)."""

    super_plan: bytes
    fragments: Sequence[Named]
    alike: tuple[tuple[str, ...], ...]


D = TypeVar("D", bound=Alike)


def read_each_once(decomposition: D) -> D:
    """The decomposition with every fragment of an alike group read as the group's first, and
    the others gone; the same object when no group is left."""
    if not decomposition.alike:
        return decomposition
    renames = {name: group[0] for group in decomposition.alike for name in group[1:]}
    return replace(
        decomposition,  # type: ignore[type-var]
        super_plan=_renamed(decomposition.super_plan, tuple(sorted(renames.items()))),
        fragments=[f for f in decomposition.fragments if f.name not in renames],
        alike=(),
    )


def _read_once(decomposition: D) -> tuple[D, bool]:
    shared = read_each_once(decomposition)
    return shared, shared is not decomposition


read_once = Rule("read_once", _read_once)


@functools.lru_cache(maxsize=SHAPES_KEPT_MAX)
def _renamed(super_plan: bytes, renames: tuple[tuple[str, str], ...]) -> bytes:
    plan, to = tree.parse_plan(super_plan), dict(renames)
    for rel in tree.iter_rels(plan):
        names = tree.named_table(rel)
        if names is not None and len(names) == 1 and names[0] in to:
            tree.set_named_table(rel, [to[names[0]]])
    return plan.SerializeToString()
