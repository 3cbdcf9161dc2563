"""read_once: alike fragments are read once. Two reads of a dataset the same way (Q21 reads
lineitem thrice, l1 and l3 alike) ship one fragment, and the super-plan reads its output for
both: the devices scan and ship it once.

A rule over the finished decomposition (``decompose.DECOMPOSITION_RULES``): which fragments are
alike is only known once each is built (``finalize`` groups those whose dataset and three stages
are the same bytes, ``Decomposition.alike``). Every group left in ``alike`` is read once; a rule
before it may take groups out (``split_alike_by_join_keys``: a join's keys cut their reads
apart). Decompositions are shared by the plan cache, so this builds a new one and never changes
the one given.

DataFusion must take the renamed super-plan back: a fragment read twice under nested joins is
qualified apart by its consumer as "left" and "right", and over three joins "left" names two
columns of one name (``SELECT * FROM a, b, c, b``: DataFusion issue 15439). Such reads keep
fragments of their own.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol, TypeVar

import pyarrow as pa

from quarry.plan import engine, merge, tree
from quarry.plan.rules import Rule

SHAPES_KEPT_MAX = 256  # super-plans whose reads were renamed, kept


class Named(Protocol):
    name: str
    output_schema: pa.Schema


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
    super_plan = _renamed(decomposition.super_plan, tuple(sorted(renames.items())))
    fragments = [f for f in decomposition.fragments if f.name not in renames]
    if not _consumable(super_plan, tuple((f.name, f.output_schema) for f in fragments)):
        return decomposition
    return replace(
        decomposition,  # type: ignore[type-var]
        super_plan=super_plan,
        fragments=fragments,
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


@functools.lru_cache(maxsize=SHAPES_KEPT_MAX)
def _consumable(super_plan: bytes, schemas: tuple[tuple[str, pa.Schema], ...]) -> bool:
    """Whether DataFusion takes the super-plan back over empty fragment tables."""
    plan = tree.parse_plan(super_plan)
    ctx = engine.session()
    merge.register_merge_functions(ctx, tree.function_names(plan).values())
    for name, schema in schemas:
        engine.register_batches(ctx, name, schema, [])
    try:
        engine.consume(ctx, plan)
    except Exception:  # DataFusion raises Exception itself; any failure means not shared
        return False
    return True
