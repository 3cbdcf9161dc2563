"""push_filter: move a filter's row-local conjuncts from the super-plan into the fragment below.

Conjuncts holding a subquery, a correlated (outer) reference or a nondeterministic function stay
on the host: a device sees one dataset's rows only, and a stage may be evaluated twice (the
filter stage on the device, the full stage again on the host) so it must be idempotent.
"""

from __future__ import annotations

from substrait import algebra_pb2

from quarry.plan import expressions, tree
from quarry.plan.cut import Cut, FragmentDraft, placeholder
from quarry.plan.rules import Rule, rewrite_sites


def _push_filter(cut: Cut) -> tuple[Cut, bool]:
    return cut, rewrite_sites(cut, "filter", _absorb_filter)


push_filter = Rule("push_filter", _push_filter)


def _absorb_filter(cut: Cut, rel: algebra_pb2.Rel, fragment: FragmentDraft) -> bool:
    filter_rel = rel.filter
    if filter_rel.HasField("common") and filter_rel.common.HasField("emit"):
        return False  # an emit remaps fields; DataFusion never writes one on a filter
    names = cut.function_names()
    parts = expressions.conjuncts(filter_rel.condition, names)
    pushable = [part for part in parts if expressions.is_row_local(part, names)]
    kept = [part for part in parts if not expressions.is_row_local(part, names)]
    if not pushable:
        return False
    moved = algebra_pb2.Rel()
    moved.filter.input.CopyFrom(fragment.rel)
    moved.filter.condition.CopyFrom(expressions.conjoin(pushable, cut.plan))
    fragment.rel = moved
    if fragment.raw_level:
        fragment.raw_conjuncts.extend(pushable)
    fragment.push("filter")
    if kept:
        filter_rel.condition.CopyFrom(expressions.conjoin(kept, cut.plan))
    else:
        tree.replace(rel, placeholder(fragment.name))
    return True
