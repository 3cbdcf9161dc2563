"""prune_slices: the zone-map predicates of each fragment, by which its devices skip the slices
that hold no row its filter passes, and run the sub-plan without its filter over the slices
every row of which passes.

The skipping itself cannot happen here: it needs each slice's zone map, which lives with the
slice on its device, so a device prunes at run time (``prune.slice_may_match`` and
``slice_must_match``, per slice range, before it reads). This rule is the planning half: which
conjuncts of the filter a zone map can judge (column op literal, IS [NOT] NULL), in the plain
form the device reads (``Fragment.predicates``). When they are the whole filter, ``finalize``
also builds the sub-plan without it (``Fragment.unfiltered``).

It runs last among the cut rules: its predicates are conjuncts of the filter on the rows as
stored (``raw_conjuncts``), which push_filter gathers and no later rule changes, and a device
judges them on its own, whatever its capabilities let it evaluate.
"""

from __future__ import annotations

from quarry.plan import expressions, tree
from quarry.plan.cut import Cut
from quarry.plan.rules import Rule


def _derive_predicates(cut: Cut) -> tuple[Cut, bool]:
    names = cut.function_names()
    changed = False
    for fragment in cut.fragments:
        fields = tree.read_field_names(fragment.read)
        predicates = [
            predicate
            for conjunct in fragment.raw_conjuncts
            if (predicate := expressions.simple_predicate(conjunct, names, fields)) is not None
        ]
        if predicates != fragment.predicates:
            fragment.predicates = predicates
            changed = True
    return cut, changed


prune_slices = Rule("prune_slices", _derive_predicates)
