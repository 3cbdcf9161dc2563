"""push_projection: move a projection from the super-plan into the fragment below.

The read itself was already narrowed to the needed columns when the cut began (that is the raw
stage); this rule moves computed columns down too, so a device ships results of expressions
instead of their inputs. A device that cannot compute expressions (`scan_filter`) takes only
projections that select columns.
"""

from __future__ import annotations

from substrait import algebra_pb2

from quarry.plan import expressions, tree
from quarry.plan.cut import Cut, FragmentDraft, placeholder
from quarry.plan.rules import Rule, rewrite_sites


def _push_projection(cut: Cut) -> tuple[Cut, bool]:
    return cut, rewrite_sites(cut, "project", _absorb_projection)


push_projection = Rule("push_projection", _push_projection)


def _absorb_projection(cut: Cut, rel: algebra_pb2.Rel, fragment: FragmentDraft) -> bool:
    project = rel.project
    names = cut.function_names()
    if not all(expressions.is_row_local(e, names) for e in project.expressions):
        return False
    computes = any(expressions.field_index(e) is None for e in project.expressions)
    if computes and not fragment.capabilities.project_expressions:
        return False
    if project.HasField("common") and project.common.HasField("emit"):
        width = len(project.common.emit.output_mapping)
    else:
        width = fragment.width + len(project.expressions)
    moved = algebra_pb2.Rel()
    moved.project.CopyFrom(project)
    moved.project.input.CopyFrom(fragment.rel)
    fragment.rel = moved
    fragment.width = width
    # Filters above a projection see its output, not the raw columns.
    fragment.raw_level = False
    fragment.push("projection")
    tree.replace(rel, placeholder(fragment.name))
    return True
