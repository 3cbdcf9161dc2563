"""restrict_filter_stage: a sub-plan's filter stage cut down to what a drive evaluates.

A storage server receives the host's stages, planned for the server (which runs anything). A
drive behind it may be a scan engine that compares stored fields and constants only (POLARDB
§3.1.1). Skytether §4 lets each level decompose again for the level below: the server keeps
the conjuncts of the filter stage the drive supports, sends the drive that filter as its whole
work, and completes what comes back with the full stage, which re-checks the complete condition
(so a conjunct left out costs rows shipped, never a wrong answer). A stage the drive runs whole
(``runs_whole_stage``: comparisons it evaluates, columns selected) needs neither: the drive
ships its output, the server passes it on, and nothing is checked twice.
"""

from __future__ import annotations

from quarry.plan import expressions, tree
from quarry.plan.capabilities import Capabilities


def restrict_filter_stage(stage: bytes, capabilities: Capabilities) -> bytes:
    """``stage`` (scan, or scan + filter) with only the conjuncts ``capabilities`` evaluate;
    a plain scan when none is left. Unchanged when every conjunct is supported."""
    plan = tree.parse_plan(stage)
    rel = tree.root_rel(plan)
    if tree.kind(rel) != "filter":
        return stage
    names = tree.function_names(plan)
    parts = expressions.conjuncts(rel.filter.condition, names)
    kept = [part for part in parts if capabilities.supports_predicate(part, names)]
    if len(kept) == len(parts):
        return stage
    if kept:
        rel.filter.condition.CopyFrom(expressions.conjoin(kept, plan))
    else:
        rel.CopyFrom(tree.copy_rel(rel.filter.input))
    return plan.SerializeToString()


def runs_whole_stage(stage: bytes, capabilities: Capabilities) -> bool:
    """Whether a device with ``capabilities`` runs all of ``stage`` itself."""
    plan = tree.parse_plan(stage)
    return capabilities.runs_whole(tree.root_rel(plan), tree.function_names(plan))
