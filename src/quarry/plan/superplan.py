"""The host's side: completing fragments that came back unfinished, then running the super-plan."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

import pyarrow as pa

from quarry.plan import engine, merge, tree
from quarry.plan.decompose import Decomposition, Fragment
from quarry.plan.passthrough import passthrough_fragment
from quarry.plan.stage import run_stage

# Completion runs the full stage over bounded groups of pushed-back rows, so host memory stays
# bounded and output streams while rows still arrive. Any grouping is correct: the full stage
# of a union equals the union of full stages up to what the super-plan merges anyway.
COMPLETION_GROUP_BYTES_MAX = 64 * 1024 * 1024


def complete(
    fragment: Fragment,
    batches: Iterable[pa.RecordBatch],
    group_bytes_max: int = COMPLETION_GROUP_BYTES_MAX,
) -> Iterator[pa.RecordBatch]:
    """Run the fragment's `full` stage over rows that came back `raw` or `filter`-ed.

    The full stage contains the complete filter, so it also re-checks rows that a restricted
    device filtered with only part of the predicate. `batches` may hold more columns than the
    raw schema (whole slices); nothing is produced for no batches.
    """
    assert group_bytes_max > 0
    group: list[pa.RecordBatch] = []
    group_bytes = 0
    for batch in batches:
        group.append(batch)
        group_bytes += batch.nbytes
        if group_bytes >= group_bytes_max:
            yield from _complete_group(fragment, group)
            group, group_bytes = [], 0
    if group:
        yield from _complete_group(fragment, group)


def _complete_group(fragment: Fragment, group: list[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    schema = group[0].schema
    return run_stage(fragment.stages["full"], schema, group, target_partitions=engine.cpu_count())


def conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """`batch` with `schema`'s names and types (DataFusion may hand back view types)."""
    if batch.schema.equals(schema):
        return batch
    if batch.num_columns != len(schema):
        raise ValueError(
            f"a batch has {batch.num_columns} columns, expected {len(schema)}: "
            f"{', '.join(schema.names)}"
        )
    columns = [
        column if column.type == field.type else column.cast(field.type)
        for column, field in zip(batch.columns, schema)
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def run_super(
    decomposition: Decomposition, fragment_outputs: Mapping[str, Iterable[pa.RecordBatch]]
) -> pa.RecordBatchReader:
    """Run the super-plan over each fragment's (completed) output; the result streams.

    Fragment outputs are held in memory as DataFusion tables (a fragment may be read more
    than once by the super-plan); the result is produced batch by batch. A super-plan that only
    reads one fragment (``passthrough``) is not run at all: its batches stream straight out.
    """
    missing = [f.name for f in decomposition.fragments if f.name not in fragment_outputs]
    if missing:
        raise ValueError(f"no output given for fragment(s) {', '.join(missing)}")
    schema = decomposition.output_schema
    only = passthrough_fragment(decomposition)
    if only is not None:  # nothing to run on the host: the fragment's rows are the answer
        batches = fragment_outputs[only.name]
        return pa.RecordBatchReader.from_batches(schema, (conform(b, schema) for b in batches))
    ctx = engine.session()
    merge.register_merge_functions(
        ctx, tree.function_names(tree.parse_plan(decomposition.super_plan)).values()
    )
    for fragment in decomposition.fragments:
        batches = [
            conform(batch, fragment.output_schema) for batch in fragment_outputs[fragment.name]
        ]
        engine.register_batches(
            ctx, fragment.name, fragment.output_schema, batches, engine.cpu_count()
        )
    frame = engine.consume(ctx, decomposition.super_plan)
    stream = frame.execute_stream()
    return pa.RecordBatchReader.from_batches(
        schema, (conform(batch.to_pyarrow(), schema) for batch in stream)
    )
