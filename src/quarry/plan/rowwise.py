"""Super-plans that work row by row: they run over the fragment's rows as they arrive.

A super-plan made only of filters and projections over one fragment (``SELECT a + b FROM t
WHERE f(c)`` when the devices cannot run it all, or under ``pushdown="never"``) distributes over
a union: running it on each group of arriving batches and concatenating the outputs gives its
answer. So it needs no spool and no pool: it runs on groups of at most ``GROUP_BYTES_MAX`` as
the devices ship them, and the answer streams in bounded memory while rows still arrive.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.types as pt
from substrait import algebra_pb2

from quarry.plan import tree
from quarry.plan.passthrough import SHAPES_KEPT_MAX, Decomposed

GROUP_BYTES_MAX = 16 << 20  # rows the host holds at once for a row-by-row super-plan
ROW_RELS = frozenset({"project", "filter", "read"})


def rowwise_fragment(decomposition: Decomposed) -> Any | None:
    """The one fragment the super-plan reads, if it does nothing but filter and project it."""
    if decomposition.host_sql:
        return None
    name = rowwise_read(decomposition.super_plan)
    if name is None:
        return None
    try:
        return decomposition.fragment(name)
    except KeyError:
        return None


@functools.lru_cache(maxsize=SHAPES_KEPT_MAX)
def rowwise_read(super_plan: bytes) -> str | None:
    """The table a super-plan reads, if it only filters and projects it (worked out once per
    plan: a kept plan is asked again by every query)."""
    plan = tree.parse_plan(super_plan)
    if len(plan.relations) != 1 or not plan.relations[0].HasField("root"):
        return None
    rels = list(tree.iter_rels(plan.relations[0].root.input))
    if any(tree.kind(rel) not in ROW_RELS for rel in rels):
        return None
    reads = [rel for rel in rels if tree.kind(rel) == "read"]
    if len(reads) != 1:
        return None
    if any(isinstance(m, algebra_pb2.Expression.WindowFunction) for m in tree.iter_messages(plan)):
        return None  # a window reads other rows
    names = tree.named_table(reads[0])
    if names is None or len(names) != 1:
        return None
    return names[0]


def groups(
    batches: Iterable[pa.RecordBatch], group_bytes_max: int = GROUP_BYTES_MAX
) -> Iterator[list[pa.RecordBatch]]:
    """Arriving batches in groups of about ``group_bytes_max`` (a batch is never split)."""
    assert group_bytes_max > 0
    group: list[pa.RecordBatch] = []
    size = 0
    for batch in batches:
        group.append(batch)
        size += batch.nbytes
        if size >= group_bytes_max:
            yield group
            group, size = [], 0
    if group:
        yield group


def coalesced(batches: Iterable[pa.RecordBatch], rows_max: int) -> list[pa.RecordBatch]:
    """Neighbouring batches joined while together they hold at most ``rows_max`` rows (a larger
    batch passes as it is, uncopied; empty ones are dropped). Key cuts and selective filters
    leave a few rows of every slice, and each batch costs a message on the wire and a step of
    every operator after it, whatever it holds: TPC-DS Q42's devices shipped 220 batches of 8
    rows each."""
    assert rows_max > 0
    out: list[pa.RecordBatch] = []
    group: list[pa.RecordBatch] = []
    rows = 0
    for batch in batches:
        if not batch.num_rows:
            continue
        if group and rows + batch.num_rows > rows_max:
            out.extend(_joined(group))
            group, rows = [], 0
        group.append(batch)
        rows += batch.num_rows
    if group:
        out.extend(_joined(group))
    return out


def _joined(group: list[pa.RecordBatch]) -> list[pa.RecordBatch]:
    """One batch of the group's rows; as they were if their types differ."""
    if len(group) == 1:
        return group
    try:
        return [pa.concat_batches(group)]
    except pa.ArrowInvalid:
        return group


def adjacent_once(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` without each row equal to the one before it, where every column is of fixed
    width (else as it is). Rows of one ticket, order or day lie together as stored: TPC-DS
    Q38's year of store sales, as (customer, day), is one row in ten so. A hash of every row
    would find every repeat, at ten times the cost (10 to 34 ms a 540,000-row chunk against
    about 1), more than the host's join of the rows it drops costs (Q14: 593 -> 685 ms)."""
    if batch.num_rows < 2 or not all(_fixed_width(column.type) for column in batch.columns):
        return batch
    differs = np.zeros(batch.num_rows, dtype=np.bool_)
    differs[0] = True
    for column in batch.columns:
        words = _words(column)
        differs[1:] |= (words[1:] != words[:-1]).any(axis=1)
        if column.null_count:  # a null's slot holds anything: null against value, or not
            valid = column.is_valid().to_numpy(zero_copy_only=False)
            differs[1:] |= valid[1:] != valid[:-1]
    if differs.all():
        return batch
    return batch.filter(pa.array(differs))


def _fixed_width(kind: pa.DataType) -> bool:
    fixed = pt.is_integer(kind) or pt.is_floating(kind) or pt.is_temporal(kind)
    return (fixed or pt.is_decimal(kind)) and kind.bit_width in (8, 16, 32, 64, 128)


def _words(column: pa.Array) -> np.ndarray:
    """The column's values, a row of unsigned words each (a 128-bit decimal: two)."""
    width = column.type.bit_width // 8
    data = np.frombuffer(column.buffers()[1], np.uint8)
    rows = data[column.offset * width : (column.offset + len(column)) * width]
    word = min(width, 8)
    return rows.view(f"u{word}").reshape(len(column), width // word)
