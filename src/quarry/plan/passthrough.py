"""Super-plans with nothing to do: the answer is one fragment's output, as it arrives.

A filter-and-project query (``SELECT a, b FROM t WHERE ...``) decomposes into one fragment that
does all the work and a super-plan that only reads it. Running that super-plan in DataFusion
would hold the whole result in host memory before the first row reaches the user; passing the
fragment's batches straight through streams the answer in constant memory, with the devices
kept busy only as fast as the reader takes rows.
"""

from __future__ import annotations

import functools
from typing import Any, Protocol

import pyarrow as pa

from quarry.plan import tree

SHAPES_KEPT_MAX = 256  # super-plans whose shape is remembered (plans are kept as many)


class Decomposed(Protocol):
    """What this needs of a ``quarry.plan.decompose.Decomposition`` (which calls it to explain
    itself, so it cannot be imported here)."""

    super_plan: bytes
    output_schema: pa.Schema
    host_sql: str  # a super-plan DuckDB runs (``duckdb_super``): neither of the shapes here

    def fragment(self, name: str) -> Any: ...


def passthrough_fragment(decomposition: Decomposed) -> Any | None:
    """The fragment whose output is the answer column for column, if the super-plan is only a
    plain read of it (no filter, no reordering of columns, nothing above the read)."""
    if decomposition.host_sql:
        return None
    read = plain_read(decomposition.super_plan)
    if read is None:
        return None
    name, fields = read
    try:
        fragment = decomposition.fragment(name)
    except KeyError:
        return None
    width = len(fragment.output_schema)
    if fields != tuple(range(width)):
        return None
    if len(decomposition.output_schema) != width:
        return None
    return fragment


@functools.lru_cache(maxsize=SHAPES_KEPT_MAX)
def plain_read(super_plan: bytes) -> tuple[str, tuple[int, ...]] | None:
    """The table a super-plan reads and the fields it keeps, if it does nothing else. Asked
    once per query of a plan kept between queries: worked out once per plan."""
    plan = tree.parse_plan(super_plan)
    if len(plan.relations) != 1 or not plan.relations[0].HasField("root"):
        return None
    rel = plan.relations[0].root.input
    if tree.kind(rel) != "read":
        return None
    read = rel.read
    if read.HasField("filter") or read.HasField("best_effort_filter"):
        return None
    names = tree.named_table(rel)
    if names is None or len(names) != 1:
        return None
    return names[0], tuple(tree.read_output_fields(read))
