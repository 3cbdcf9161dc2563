"""push_limit: LIMIT and ORDER BY ... LIMIT as a per-slice-range limit or top-k on the devices.

Every slice range keeps at most offset + count rows (the first ones, or the top ones by the
sort); the super-plan keeps its own limit (and sort) and picks the final rows from the union.
A limit caps the number of rows, so nothing above it may move down: the fragment closes.
"""

from __future__ import annotations

from substrait import algebra_pb2

from quarry.plan import expressions, tree
from quarry.plan.cut import Cut, FragmentDraft
from quarry.plan.rules import Rule, rewrite_sites


def _push_limits(cut: Cut) -> tuple[Cut, bool]:
    limited = rewrite_sites(cut, "fetch", _push_limit)
    return cut, _push_top_k(cut) or limited


push_limit = Rule("push_limit", _push_limits)


def _row_count_max(fetch: algebra_pb2.FetchRel) -> int | None:
    """offset + count, when both are literal; None when there is no count (offset only)."""
    if not fetch.HasField("count_expr"):
        return None
    count = expressions.literal_int(fetch.count_expr)
    offset = expressions.literal_int(fetch.offset_expr) if fetch.HasField("offset_expr") else 0
    if count is None or offset is None or count < 0:
        return None
    return offset + count


def _limited(fragment_rel: algebra_pb2.Rel, rows_max: int) -> algebra_pb2.Rel:
    rel = algebra_pb2.Rel()
    rel.fetch.input.CopyFrom(fragment_rel)
    rel.fetch.count_expr.literal.i64 = rows_max
    return rel


def _push_limit(cut: Cut, rel: algebra_pb2.Rel, fragment: FragmentDraft) -> bool:
    rows_max = _row_count_max(rel.fetch)
    if rows_max is None or not fragment.capabilities.limit:
        return False
    fragment.rel = _limited(fragment.rel, rows_max)
    fragment.push("limit")
    fragment.open = False
    return True


def _push_top_k(cut: Cut) -> bool:
    changed = False
    for rel in _fetch_rels(cut):
        sort = rel.fetch.input
        fragment = cut.fragment_of(sort.sort.input)
        rows_max = _row_count_max(rel.fetch)
        if fragment is None or rows_max is None or not fragment.capabilities.limit:
            continue
        sorted_rel = algebra_pb2.Rel()
        sorted_rel.sort.CopyFrom(sort.sort)
        sorted_rel.sort.input.CopyFrom(fragment.rel)
        fragment.rel = _limited(sorted_rel, rows_max)
        fragment.push("top_k")
        fragment.open = False
        changed = True
    return changed


def _fetch_rels(cut: Cut) -> list[algebra_pb2.Rel]:
    return [
        rel
        for rel in tree.iter_rels(cut.plan)
        if tree.kind(rel) == "fetch" and tree.kind(rel.fetch.input) == "sort"
    ]
