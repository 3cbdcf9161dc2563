"""A program run with its cut: the lines before it on the host, a run of lines on the devices,
the rest on the host again, each part in the same namespace.

The devices' part is the first run of lines Algorithm 1 moved that starts with a pandas read of
a stored dataset (``Block``). It runs as the ``offload.lines`` unit (``device.py``) through the
one host dispatch, over every partition; with it go the imports and the earlier lines its
lines need (a constant, a threshold from ``sys.argv``), computed again on the devices. What the
host gets back is the one value the later lines read: the partitions' frames concatenated and
put back in the source's order by their index, which is the plain run's value.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from quarry.coordinator.dispatch import Dispatch
from quarry.coordinator.planning import partition_task
from quarry.device.unit import host_context
from quarry.offload import profile
from quarry.offload.device import Geometry, Lines, LinesArgs, OffloadFailed
from quarry.offload.program import Line, Program
from quarry.offload.reads import Mounts, Reads
from quarry.protocol.work import WorkRequest

WORKERS_PER_DEVICE = 2
QUEUE_BATCHES_MAX = 16


@dataclass(frozen=True)
class Block:
    first: int  # index of its read line in the program
    end: int  # index after its last line
    dataset: str
    frame: str  # the name the read binds
    output: str  # the one name later lines read
    columns: tuple[str, ...] | None
    schema: pa.Schema  # of the output, as the whole sample gave it
    needs: tuple[int, ...]  # earlier lines run again on the devices (imports, constants)


def block_of(program: Program, planned: Any) -> Block | None:
    """The devices' part of the plan, or None when it has none this can run."""
    lines = program.lines
    moved = planned.cut.device_lines
    reads = {r.line: r for r in planned.check.reads}
    for first, line in enumerate(lines):
        read = reads.get(line.number)
        if line.number not in moved or read is None:
            continue  # moved lines before the read (imports, constants) go along as needs
        if read.function != "read_parquet" or len(line.binds) != 1:
            return None
        end = first + 1
        while end < len(lines) and lines[end].number in moved and lines[end].number not in reads:
            end += 1
        return _block(lines, first, end, read, planned.check.whole)
    return None


def _block(
    lines: Sequence[Line], first: int, end: int, read: Any, whole: dict[int, dict[str, Any]]
) -> Block | None:
    later = set().union(*(line.reads for line in lines[end:])) if end < len(lines) else set()
    bound = set().union(*(line.binds for line in lines[first:end]))
    live = bound & later
    if len(live) != 1:
        return None  # none, or several, values to bring back: the host runs it
    output = live.pop()
    last = max(i for i in range(first, end) if output in lines[i].binds)
    value = whole.get(lines[last].number, {}).get(output)
    if type(value).__name__ != "DataFrame":
        return None
    schema = pa.Schema.from_pandas(value, preserve_index=True)
    frame = next(iter(lines[first].binds))
    return Block(
        first, end, read.dataset, frame, output, read.columns, schema, _needs(lines, first, end)
    )


def _needs(lines: Sequence[Line], first: int, end: int) -> tuple[int, ...]:
    """Earlier lines the block's lines need: every import, and the lines that bind what they
    read (and what those read), unless they print, write or read stored data."""
    needed = set().union(*(line.reads for line in lines[first + 1 : end]))
    chosen = []
    for line in reversed(lines[:first]):
        statement = ast.parse(line.text).body[0] if line.text else None
        is_import = isinstance(statement, ast.Import | ast.ImportFrom)
        if is_import or (line.binds & needed and not line.pinned):
            chosen.append(line.number)
            needed |= line.reads
    return tuple(sorted(chosen))


def limits() -> dict[str, Any]:
    """The worker's limits, when set in the environment (else the unit's defaults)."""
    found: dict[str, Any] = {}
    if os.environ.get("QUARRY_OFFLOAD_CPU_S"):
        found["cpu_s"] = int(os.environ["QUARRY_OFFLOAD_CPU_S"])
    if os.environ.get("QUARRY_OFFLOAD_MEMORY_MIB"):
        found["memory_bytes"] = int(os.environ["QUARRY_OFFLOAD_MEMORY_MIB"]) << 20
    if os.environ.get("QUARRY_OFFLOAD_CHUNK_S"):
        found["chunk_wall_s"] = float(os.environ["QUARRY_OFFLOAD_CHUNK_S"])
    return found


def geometry_of(entry: Any) -> dict[str, Geometry]:
    """Where each partition's rows sit in the source (the ingests' groups, in order)."""
    rows = {p.partition: p.rows for p in entry.partitions}
    found: dict[str, Geometry] = {}
    base = 0
    for record in sorted(entry.ingests, key=lambda r: r.created_at):
        if record.group_rows <= 0:
            raise OffloadFailed(
                f"{entry.qualified} was ingested before quarry kept its source's order: ingest "
                "it again to run lines on its devices"
            )
        numbers = range(record.first_partition, record.first_partition + record.partitions)
        for index, partition in enumerate(numbers):
            found[str(partition)] = Geometry(base, record.group_rows, record.partitions, index)
        base += sum(rows.get(p, 0) for p in numbers)
    return found


@dataclass(frozen=True)
class Offloaded:
    """What the devices did for a program: its lines, and the bytes on either side."""

    lines: tuple[int, ...]
    devices: tuple[str, ...]
    rows_read: int
    bytes_read: int
    bytes_shipped: int


def run_on_devices(
    cluster: Any, program: Program, block: Block, argv: Sequence[str]
) -> tuple[Any, Offloaded]:
    """The block's output: every partition on its device, back in the source's order."""
    entry = cluster.entry(block.dataset)
    moved = tuple(line.number for line in program.lines[block.first + 1 : block.end])
    body = LinesArgs(
        source=program.source,
        path=program.path,
        lines=block.needs + moved,
        frame=block.frame,
        output=block.output,
        columns=block.columns,
        schema=block.schema,
        geometry=geometry_of(entry),
        argv=(program.path, *argv),
        **limits(),
    ).to_json()
    tasks = []
    for p in entry.partitions:
        if not p.rows:
            continue
        request = WorkRequest(
            unit=Lines.NAME,
            domain=entry.domain,
            dataset=entry.name,
            partitions=(p.partition,),
            args=body,
        )
        tasks.append(
            partition_task(cluster, entry, p, request, Lines(request, b"", host_context()))
        )
    workers = WORKERS_PER_DEVICE * len(cluster.live_devices())
    dispatch = Dispatch()
    batches = list(dispatch.run(tasks, workers, QUEUE_BATCHES_MAX, "quarry-offload"))
    table = pa.Table.from_batches(batches, schema=block.schema)
    reports = dispatch.sorted_reports()
    done = Offloaded(
        lines=(program.lines[block.first].number, *moved),
        devices=tuple(sorted({r.device for r in reports})),
        rows_read=sum(r.rows_read for r in reports),
        bytes_read=sum(r.bytes_read for r in reports),
        bytes_shipped=sum(r.bytes_shipped for r in reports),
    )
    return table.to_pandas().sort_index(), done


def run_with_cut(
    program: Program, cluster: Any, mounts: Mounts, argv: Sequence[str], block: Block
) -> tuple[dict[str, Any], Offloaded]:
    """The program, its block on the devices; the namespace when it ends, and what the
    devices did."""
    namespace: dict[str, Any] = {"__name__": "__main__", "__file__": program.path}

    def host(lines: Sequence[Line]) -> None:
        part = Program(program.path, tuple(lines), program.source)
        profile.run(part, Reads(cluster, mounts), argv, namespace=namespace)

    host(program.lines[: block.first])
    try:
        namespace[block.output], done = run_on_devices(cluster, program, block, argv)
    except OffloadFailed as error:
        raise profile.ProgramFailed(str(error)) from None
    host(program.lines[block.end :])
    return namespace, done
