"""common_parts: a part of a super-plan that occurs more than once is run once.

SQL repeats work that DataFusion does not share: a CTE read three times (TPC-DS Q47's ``v1``,
itself, its lag and its lead) is planned, and run, three times, its join and aggregate and
window each time over the same fragment outputs; a ``ROLLUP`` is a union of one aggregate per
level, each over the same join (Q36: three times the join of 530,000 store sales). DuckDB
materializes a CTE once. Here the super-plan's parts that occur more than once (the same
relation, byte for byte, over the same fragments or over fragments that ship the same rows)
and do real work (a join, an aggregate, a window, a set) run once, before the super-plan, and
each occurrence reads their output instead (``computed``'s way: a typed read of a table).

The answer is the same: a part's output is a function of its inputs, which are the same rows
(fragments that read one dataset with the same stages; a fragment a join's keys cut ships fewer
rows, so it is never taken for another). A part that would hold more than ``rows_bytes_max``
once collected, that refers to a relation outside it (an outer reference), that calls a
function whose answer changes from call to call, or that DataFusion does not take on its own
is left where it is; so is everything when nothing occurs twice.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterable, Mapping
from typing import Any

import pyarrow as pa
from substrait import algebra_pb2

from quarry.plan import engine, tree
from quarry.plan.decompose import typed_read

COMMON_PREFIX = "__quarry_common_"
PARTS_MAX = 8  # parts run once per super-plan, largest first
WORK_RELS = frozenset(
    ("join", "cross", "hash_join", "merge_join", "nested_loop_join", "aggregate", "set", "window")
)
VOLATILE_FUNCTIONS = ("random", "uuid", "now", "current_", "nextval")
SHAPES_KEPT_MAX = 256


def run_once(
    ctx: Any,
    super_plan: bytes,
    same: Mapping[str, str],
    rows_bytes_max: int,
    partitions: int = 1,
) -> tuple[bytes, dict[str, pa.Table]]:
    """The super-plan with each common part read from a table of its output, run on ``ctx``
    (which holds the fragments' outputs), and those tables by name, registered on ``ctx``;
    together they hold at most ``rows_bytes_max``. ``same``: fragments whose output is
    another's, to the one they are taken for (``same_outputs``)."""
    if not _has_common(super_plan, tuple(sorted(same.items()))):
        return super_plan, {}
    plan = tree.parse_plan(super_plan)
    tables: dict[str, pa.Table] = {}
    refused: set[bytes] = set()
    for _ in range(PARTS_MAX):
        part = _largest_common(plan, same, refused)
        if part is None:
            break
        key, occurrences = part
        table = _collected(ctx, plan, occurrences[0], rows_bytes_max)
        if table is None:
            refused.add(key)
            continue
        rows_bytes_max -= table.nbytes  # every part's rows together
        name = f"{COMMON_PREFIX}{len(tables)}"
        engine.register_batches(ctx, name, table.schema, table.to_batches(), partitions)
        read = typed_read(name, table.schema)
        for rel in occurrences:
            tree.replace(rel, read)
        tables[name] = table
    if not tables:
        return super_plan, {}
    changed = plan.SerializeToString()
    if _types(ctx, changed) != _types(ctx, super_plan):  # never an answer of other types
        for name in tables:
            ctx.deregister_table(name)
        return super_plan, {}
    return changed, tables


def same_outputs(fragments: Iterable[Any], cut: Collection[str]) -> dict[str, str]:
    """Per fragment, the one whose output it is (``run_once``'s ``same``): fragments that read
    one dataset with the same stages into the same schema ship the same rows, unless a join's
    keys cut one (``cut``); each is taken for the first of its kind."""
    first: dict[tuple, str] = {}
    same: dict[str, str] = {}
    for fragment in fragments:
        if fragment.name in cut:
            continue
        stages = tuple(sorted((str(stage), data) for stage, data in fragment.stages.items()))
        key = (fragment.dataset, stages, fragment.output_schema)
        taken = first.setdefault(key, fragment.name)
        if taken != fragment.name:
            same[fragment.name] = taken
    return same


@functools.lru_cache(maxsize=SHAPES_KEPT_MAX)
def _has_common(super_plan: bytes, same: tuple[tuple[str, str], ...]) -> bool:
    """Whether any part worth running once occurs twice (most super-plans: none; worked out
    once per plan)."""
    return _largest_common(tree.parse_plan(super_plan), dict(same), set()) is not None


def _largest_common(
    plan: Any, same: Mapping[str, str], refused: Collection[bytes]
) -> tuple[bytes, list[algebra_pb2.Rel]] | None:
    """The part that does work (a join, an aggregate, a set under it), occurs more than once
    and runs on its own, whose runs once save the most (relations in it times its occurrences
    after the first), with its occurrences; None if there is none."""
    found: dict[bytes, list[algebra_pb2.Rel]] = {}
    sizes: dict[bytes, int] = {}
    for rel in tree.iter_rels(tree.root_rel(plan)):
        if tree.kind(rel) == "read":
            continue
        key, size, works = _canonical(rel, same)
        if works and key not in refused:
            found.setdefault(key, []).append(rel)
            sizes[key] = size
    candidates = {key: _outermost(rels) for key, rels in found.items() if len(rels) > 1}
    for key in sorted(candidates, key=lambda k: (-sizes[k] * (len(candidates[k]) - 1), -sizes[k])):
        occurrences = candidates[key]
        ordered = tree.kind(occurrences[0]) == "sort"  # its order would not survive the table
        if len(occurrences) > 1 and not ordered and _standalone(occurrences[0], plan):
            return key, occurrences
    return None


def _canonical(rel: algebra_pb2.Rel, same: Mapping[str, str]) -> tuple[bytes, int, bool]:
    """The relation's bytes with every fragment read named as the one it is taken for, how
    many relations it holds, and whether any of them does work."""
    copy = tree.copy_rel(rel)
    size, works = 0, False
    for inner in tree.iter_rels(copy):
        size += 1
        works = works or tree.kind(inner) in WORK_RELS
        names = tree.named_table(inner)
        if names is not None and len(names) == 1 and names[0] in same:
            tree.set_named_table(inner, [same[names[0]]])
    return copy.SerializeToString(deterministic=True), size, works


def _outermost(rels: list[algebra_pb2.Rel]) -> list[algebra_pb2.Rel]:
    """Occurrences not inside another (a part nested in itself: only the outer one)."""
    inner = {id(r) for rel in rels for r in tree.iter_rels(rel) if r is not rel}
    return [rel for rel in rels if id(rel) not in inner]


def _standalone(rel: algebra_pb2.Rel, plan: Any) -> bool:
    """Whether the part runs on its own: no reference to a relation outside it, nothing whose
    answer changes from one call to the next."""
    for message in tree.iter_messages(rel):
        if isinstance(message, algebra_pb2.Expression.FieldReference) and message.HasField(
            "outer_reference"
        ):
            return False
    names = tree.function_names(plan)
    called = {names.get(anchor, "") for anchor in tree.used_function_anchors(rel)}
    return not any(name.startswith(VOLATILE_FUNCTIONS) for name in called)


def _collected(ctx: Any, plan: Any, rel: algebra_pb2.Rel, rows_bytes_max: int) -> pa.Table | None:
    """The part's output, whole; None if DataFusion does not take it on its own, it holds a
    nested type, or it grows past ``rows_bytes_max`` (its occurrences then run as they were,
    each a stream)."""
    part = tree.make_plan(plan, tree.copy_rel(rel))
    try:
        frame = engine.consume(ctx, part)
        schema = frame.schema()
        if any(pa.types.is_nested(f.type) for f in schema):
            return None
        named = pa.schema([pa.field(f"c{i}", f.type, f.nullable) for i, f in enumerate(schema)])
        batches, held = [], 0
        for batch in frame.execute_stream():
            rows = batch.to_pyarrow()
            held += rows.nbytes
            if held > rows_bytes_max:
                return None
            batches.append(pa.RecordBatch.from_arrays(rows.columns, schema=named))
    except Exception:  # DataFusion raises plain Exceptions: the part runs where it was
        return None
    return pa.Table.from_batches(batches, schema=named)


def _types(ctx: Any, plan: bytes) -> list[pa.DataType]:
    try:
        return engine.consume(ctx, plan).schema().types
    except Exception:  # DataFusion raises plain Exceptions
        return []
