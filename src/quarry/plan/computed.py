"""computed: parts of a super-plan the host has already run, read as tables of their output.

A join's build through the host's filter (``join_filters``' ``through``: TPC-H Q18's HAVING over
every order's partial sums) runs on the host before its probes may start, for its keys. The
super-plan holds the same part below its join; run a second time, it merged SF 10's 15 million
partial sums again (1.4 s of the super-plan's 1.7). The output kept with the keys is read
instead: the same rows, since the spool holds exactly what the keys were taken from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import pyarrow as pa

from quarry.plan import engine, tree
from quarry.plan.decompose import Decomposition, Fragment, host_frame, typed_read

COMPUTED_PREFIX = "__quarry_computed_"


def substituted(
    decomposition: Decomposition, computed: Mapping[bytes, pa.Table]
) -> tuple[Decomposition, dict[str, pa.Table]]:
    """The decomposition whose super-plan reads each part ``computed`` holds (by its plan's
    bytes) as a table of its output, and those tables by name. A part the super-plan does not
    hold, or whose table's types are not the part's, is left to run as it was."""
    if not computed:  # most queries: nothing to parse
        return decomposition, {}
    plan = tree.parse_plan(decomposition.super_plan)
    tables: dict[str, pa.Table] = {}
    for part, table in sorted(computed.items()):
        name = f"{COMPUTED_PREFIX}{len(tables)}"
        if _types(part, decomposition.fragments) != table.schema.types:
            continue
        if _read_instead(plan, part, name, table.schema):
            tables[name] = table
    if not tables:
        return decomposition, {}
    changed = replace(decomposition, super_plan=plan.SerializeToString())
    extra = {name: table.schema for name, table in tables.items()}
    if _types(changed.super_plan, changed.fragments, extra) != decomposition.output_schema.types:
        return decomposition, {}
    return changed, tables


def _read_instead(plan, part: bytes, name: str, schema: pa.Schema) -> bool:
    """Replace every relation of ``plan`` equal to ``part``'s root by a read of ``name``."""
    wanted = tree.root_rel(tree.parse_plan(part)).SerializeToString(deterministic=True)
    found = False
    while True:
        match = next(
            (
                rel
                for rel in tree.iter_rels(plan)
                if rel.SerializeToString(deterministic=True) == wanted
            ),
            None,
        )
        if match is None:
            return found
        tree.replace(match, typed_read(name, schema))
        found = True


def _types(
    plan: bytes, fragments: list[Fragment], tables: Mapping[str, pa.Schema] | None = None
) -> list[pa.DataType]:
    """The types of a plan's output over the fragments' tables (and ``tables``), as DataFusion
    plans it; none when it does not plan (the part then stays as it was)."""
    try:
        return host_frame(tree.parse_plan(plan), fragments, tables).schema().types
    except Exception:  # DataFusion raises plain Exceptions
        return []


def register_computed(ctx, tables: Mapping[str, pa.Table], partitions: int) -> None:
    for name, table in tables.items():
        engine.register_batches(ctx, name, table.schema, table.to_batches(), partitions)
