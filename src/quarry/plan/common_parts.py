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
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from substrait import algebra_pb2

from quarry.plan import engine, tree
from quarry.plan.decompose import typed_read

COMMON_PREFIX = "__quarry_common_"
PARTS_MAX = 8  # parts run once per super-plan, the most saving first
# A part is run once only where that saves reading this many input rows or more: below, running
# it apart (its own plan, a table, a check of the answer's types: a few milliseconds) costs more
# than it saves (TPC-DS Q1's and Q30's CTEs over 30,000 returns were slower run once).
ROWS_SAVED_MIN = 100_000
WORK_RELS = frozenset(
    ("join", "cross", "hash_join", "merge_join", "nested_loop_join", "aggregate", "set", "window")
)
SHAPES_KEPT_MAX = 256  # super-plans whose parts are kept
VOLATILE_FUNCTIONS = ("random", "uuid", "now", "current_", "nextval")


def run_once(
    ctx: Any,
    super_plan: bytes,
    inputs: Inputs,
    rows_bytes_max: int,
    partitions: int = 1,
) -> tuple[bytes, dict[str, pa.Table]]:
    """The super-plan with each common part read from a table of its output, run on ``ctx``
    (which holds the fragments' outputs), and those tables by name, registered on ``ctx``;
    together they hold at most ``rows_bytes_max``."""
    current = super_plan
    tables: dict[str, pa.Table] = {}
    refused: set[bytes] = set()
    for _ in range(PARTS_MAX):
        part = _most_saving(current, inputs, refused)
        if part is None:
            break
        plan = tree.parse_plan(current)
        rels = [rel for rel, _ in tree.iter_rels_nested(tree.root_rel(plan))]
        table = _collected(ctx, plan, rels[part.places[0]], rows_bytes_max)
        if table is None:
            refused.add(part.key)
            continue
        rows_bytes_max -= table.nbytes  # every part's rows together
        name = f"{COMMON_PREFIX}{len(tables)}"
        engine.register_batches(ctx, name, table.schema, table.to_batches(), partitions)
        read = typed_read(name, table.schema)
        for place in part.places:
            tree.replace(rels[place], read)
        tables[name] = table
        current = plan.SerializeToString()
    if not tables:
        return super_plan, {}
    if _types(ctx, current) != inputs.output_types:  # never an answer of other types
        for name in tables:
            ctx.deregister_table(name)
        return super_plan, {}
    return current, tables


@dataclass(frozen=True)
class Inputs:
    """What ``run_once`` knows of the super-plan's inputs and output: per fragment the one
    whose output it is (``same``, from ``same_outputs``) and its rows, and the types of the
    answer."""

    same: tuple[tuple[str, str], ...]
    rows: tuple[tuple[str, int], ...]
    output_types: tuple[pa.DataType, ...]

    @classmethod
    def of(cls, same: Mapping[str, str], rows: Mapping[str, int], output: pa.Schema) -> Inputs:
        return cls(tuple(sorted(same.items())), tuple(sorted(rows.items())), tuple(output.types))


@dataclass(frozen=True)
class Part:
    """A part that occurs more than once: its bytes (reads named as the fragments they are
    taken for), where it occurs (places in ``iter_rels_nested``'s order, none inside
    another) and the tables it reads, once per read."""

    key: bytes
    places: tuple[int, ...]
    reads: tuple[str, ...]


def same_outputs(fragments: Iterable[Any], cut: Collection[str]) -> dict[str, str]:
    """Per fragment, the one whose output it is (``Inputs.same``): fragments that read
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


def _most_saving(super_plan: bytes, inputs: Inputs, refused: Collection[bytes]) -> Part | None:
    """Of the parts that may run once, the one that saves the most input rows read (at least
    ``ROWS_SAVED_MIN``); None if there is none."""
    rows = dict(inputs.rows)
    best, saved_most = None, ROWS_SAVED_MIN - 1
    for part in _parts(super_plan, inputs.same):
        saved = sum(rows.get(name, 0) for name in part.reads) * (len(part.places) - 1)
        if saved > saved_most and part.key not in refused:
            best, saved_most = part, saved
    return best


@functools.lru_cache(maxsize=SHAPES_KEPT_MAX)
def _parts(super_plan: bytes, same: tuple[tuple[str, str], ...]) -> tuple[Part, ...]:
    """The parts of a super-plan that do work (a join, an aggregate, a set in them), occur more
    than once and run on their own; worked out once per plan. Each relation's bytes are
    written once, from a copy of the plan whose reads are named as the fragments they are
    taken for (a copy per relation cost TPC-DS Q64 0.15 s)."""
    plan = tree.parse_plan(super_plan)
    canonical = tree.copy_plan(plan)
    taken = dict(same)
    nested = list(tree.iter_rels_nested(tree.root_rel(canonical)))
    for rel, _ in nested:
        names = tree.named_table(rel)
        if names is not None and len(names) == 1 and names[0] in taken:
            tree.set_named_table(rel, [taken[names[0]]])
    kinds = [tree.kind(rel) for rel, _ in nested]
    places: dict[bytes, list[int]] = {}
    for place, (rel, _) in enumerate(nested):
        if kinds[place] != "read":
            places.setdefault(rel.SerializeToString(deterministic=True), []).append(place)
    original = [rel for rel, _ in tree.iter_rels_nested(tree.root_rel(plan))]
    parts = []
    for key, found in places.items():
        if len(found) < 2:
            continue
        spans = [(place, _subtree_end(nested, place)) for place in found]
        outermost = [p for p, _ in spans if not any(a < p < b for a, b in spans)]
        first, end = spans[0]
        works = any(kind in WORK_RELS for kind in kinds[first:end])
        ordered = kinds[first] == "sort"  # its order would not survive the table
        if len(outermost) < 2 or not works or ordered:
            continue
        if not _standalone(original[first], plan):
            continue
        reads = tuple(name for rel, _ in nested[first:end] for name in tree.named_table(rel) or ())
        parts.append(Part(key, tuple(outermost), reads))
    return tuple(parts)


def _subtree_end(nested: list[tuple[Any, int]], place: int) -> int:
    """Where the relations under ``nested[place]`` end (the first not nested deeper)."""
    depth, end = nested[place][1], place + 1
    while end < len(nested) and nested[end][1] > depth:
        end += 1
    return end


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


def _types(ctx: Any, plan: bytes) -> tuple[pa.DataType, ...]:
    try:
        return tuple(engine.consume(ctx, plan).schema().types)
    except Exception:  # DataFusion raises plain Exceptions
        return ()
