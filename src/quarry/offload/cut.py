"""A program run with its cut: the lines before it on the host, a run of lines on the devices,
the rest on the host again, each part in the same namespace.

The devices' part is the first run of lines Algorithm 1 moved that starts with a read of a
stored dataset (``Block``). It runs as the ``offload.lines`` unit (``device.py``) through the
one host dispatch, over every partition; with it go the imports and the earlier lines its
lines need (a constant, a threshold from ``sys.argv``), computed again on the devices. What the
host gets back is every value the later lines read: rows (frames, series, arrays, tables)
concatenated in the source's order, and reductions' partials combined (``reductions.py``).
Those are the plain run's values (reductions to floating-point rounding), whatever the devices
decided: a slice a device pushes back runs the same lines here (migration, §III.D).
"""

from __future__ import annotations

import ast
import os
import pickle
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from quarry import settings
from quarry.coordinator.dispatch.dispatch import Dispatch
from quarry.coordinator.query.planning import partition_task
from quarry.cost.model import host_share
from quarry.device.unit import host_context, host_cores
from quarry.offload import profile, values, worker
from quarry.offload.device import Geometry, Lines, LinesArgs, OffloadFailed, Partial
from quarry.offload.program import Line, Program
from quarry.offload.reads import Mounts, Reads
from quarry.offload.reductions import Reduction
from quarry.protocol.counters import WorkCounters
from quarry.protocol.stage import PushBack, Stage
from quarry.protocol.work import ForcedDecision, HostCost, PartitionRange, WorkRequest

WORKERS_PER_DEVICE = 2
QUEUE_BATCHES_MAX = 16
READERS = {"read_parquet": "pandas", "read_csv": "pandas", "read_table": "arrow"}
ROWS = ("DataFrame", "Series", "ndarray", "Table")  # values that concatenate
SHIPPED_BYTES_MAX = 256 << 20  # earlier lines' values sent with a block, per request


@dataclass(frozen=True)
class Block:
    first: int  # index of its read line in the program
    end: int  # index after its last line
    dataset: str
    frame: str  # the name the read binds
    reader: str  # "pandas" or "arrow"
    outputs: tuple[str, ...]  # row values later lines read
    same: tuple[str, ...]  # values the same on every device (a constant made in the block)
    reductions: tuple[tuple[int, Reduction], ...]  # (line, reduction) whose values they read
    columns: tuple[str, ...] | None
    needs: tuple[int, ...]  # earlier lines run again on the devices (imports, definitions)
    lines: tuple[int, ...]  # its lines after the read
    shipped: tuple[str, ...] = ()  # values of earlier lines the host sends with the work

    @property
    def rows_lines(self) -> tuple[int, ...]:
        """The block's lines after its read that run as written (not as partials)."""
        return tuple(n for n in self.lines if n not in dict(self.reductions))


def blocks_of(program: Program, planned: Any) -> list[Block]:
    """The devices' parts of the plan, in the program's order: every run of moved lines that
    starts with a read of a stored dataset (moved lines before a read, such as imports and
    constants, go along as needs)."""
    lines = program.lines
    moved = planned.cut.device_lines
    reads = {r.line: r for r in planned.check.reads}
    blocks: list[Block] = []
    first = 0
    while first < len(lines):
        read = reads.get(lines[first].number)
        usable = read is not None and read.function in READERS and len(lines[first].binds) == 1
        if lines[first].number not in moved or not usable:
            first += 1
            continue
        end = first + 1
        while end < len(lines) and lines[end].number in moved and lines[end].number not in reads:
            end += 1
        block = _block(lines, first, end, read, planned.check)
        if block is not None:
            blocks.append(block)
        first = block.end if block is not None else first + 1
    return blocks


def _block(lines: Sequence[Line], first: int, end: int, read: Any, check: Any) -> Block | None:
    reduced = check.reductions
    # a reduction's value exists only once combined, on the host: lines reading it stay there
    targets: set[str] = set()
    for index in range(first + 1, end):
        if lines[index].reads & targets:
            end = index
            break
        if lines[index].number in reduced:
            targets.add(reduced[lines[index].number].target)
    while end > first + 1:
        outputs = _outputs(lines, first, end, check)
        if outputs is not None:
            break
        end -= 1  # a value that cannot come back (an object the program made): stop before
    else:
        return None
    rows, same, reductions = outputs
    if not rows and not reductions:
        return None
    rerun, shipped = _needs(lines, first, end)
    return Block(
        first,
        end,
        read.dataset,
        next(iter(lines[first].binds)),
        READERS[read.function],
        rows,
        same,
        reductions,
        read.columns,
        rerun,
        tuple(line.number for line in lines[first + 1 : end]),
        shipped,
    )


def _outputs(
    lines: Sequence[Line], first: int, end: int, check: Any
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[tuple[int, Reduction], ...]] | None:
    """What later lines read of the block: row values, and reductions; None when one of them
    cannot come back."""
    later = set().union(*(line.reads for line in lines[end:])) if end < len(lines) else set()
    rows, same, reductions = [], [], []
    for name in sorted(set().union(*(line.binds for line in lines[first:end])) & later):
        last = max(i for i in range(first, end) if name in lines[i].binds)
        number = lines[last].number
        reduction = check.reductions.get(number)
        if reduction is not None and reduction.target == name:
            reductions.append((number, reduction))
        elif name in check.same.get(number, ()):
            same.append(name)  # the same everywhere: any run's value is the value
        elif type(check.whole.get(number, {}).get(name)).__name__ in ROWS:
            rows.append(name)
        else:
            return None
    return tuple(rows), tuple(same), tuple(reductions)


def _needs(lines: Sequence[Line], first: int, end: int) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """What the block's lines need of earlier ones: (lines run again on the devices: every
    import, and the definitions of functions and classes they use; names whose values the
    host sends: whatever else an earlier line bound, as it is when the block starts)."""
    needed = set().union(*(line.reads for line in lines[first + 1 : end]))
    rerun, shipped = [], set()
    for line in reversed(lines[:first]):
        statement = ast.parse(line.text).body[0] if line.text else None
        if isinstance(statement, ast.Import | ast.ImportFrom):
            rerun.append(line.number)
        elif not line.binds & needed:
            continue
        elif isinstance(statement, ast.FunctionDef | ast.ClassDef):
            rerun.append(line.number)
            needed |= line.reads  # what the function uses of the program's globals
        else:
            shipped |= line.binds & needed
        needed -= line.binds
    return tuple(sorted(rerun)), tuple(sorted(shipped))


def limits() -> dict[str, Any]:
    """The worker's limits: $QUARRY_OFFLOAD_CPU_S, $QUARRY_OFFLOAD_MEMORY_MIB and
    $QUARRY_OFFLOAD_CHUNK_S, unset the offload unit's defaults."""
    return {
        "cpu_s": settings.OFFLOAD_CPU_S.get(),
        "memory_bytes": settings.OFFLOAD_MEMORY_MIB.get() << 20,
        "chunk_wall_s": settings.OFFLOAD_CHUNK_S.get(),
    }


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
class Migration:
    """Slices a device handed back, which the host ran (§III.D)."""

    device: str
    partition: int
    slices: int  # of the partition's
    slices_total: int
    at_s: float  # after the devices' part began, when the host finished the first of them
    reason: str
    pushed_back: PushBack | None = None  # why, in one word (the device's ``Decision``)


@dataclass(frozen=True)
class Offloaded:
    """What the devices did for a program: its lines, the bytes on either side, migrations."""

    lines: tuple[int, ...]
    devices: tuple[str, ...]
    rows_read: int
    bytes_read: int
    bytes_shipped: int
    wall_s: float = 0.0
    migrations: tuple[Migration, ...] = field(default_factory=tuple)
    bytes_sent: int = 0  # values of earlier lines sent to the devices, every request counted
    drive_s: float = 0.0  # the devices' seconds: their CPU, stretched by profile and load
    # the block was not sent at all (its inputs cannot go to the devices): why, and in words
    declined: PushBack | None = None
    declined_reason: str = ""


@dataclass(frozen=True)
class Migrate:
    """How the devices' part may move to the host: ``auto`` (each device's controller judges
    its measured rate against the host's, Eq. 1), ``never``, or ``force`` (the second half of
    every partition's slices, as if every device slowed half-way)."""

    mode: str = "auto"
    host_s_per_byte: float = 0.0  # the lines' host time per stored byte (the estimate)
    device_s_per_byte: float = 0.0  # one device's estimate, the probe's measure included
    link_bytes_per_s: float = 1e12


class NotOffloadable(Exception):
    """A block whose inputs cannot go to the devices (a value that does not pickle, or too
    large to send): its lines run on the host."""


def shipped_values(block: Block, namespace: dict[str, Any]) -> bytes:
    """The values of earlier lines the block's lines read, for the devices."""
    if not block.shipped:
        return b""
    try:
        payload = pickle.dumps({name: namespace[name] for name in block.shipped}, protocol=5)
    except Exception as error:
        raise NotOffloadable(f"{', '.join(block.shipped)} cannot be sent: {error}") from None
    if len(payload) > SHIPPED_BYTES_MAX:
        raise NotOffloadable(
            f"{', '.join(block.shipped)} take {len(payload):,} bytes, over "
            f"{SHIPPED_BYTES_MAX:,} to send to every device"
        )
    return payload


def run_on_devices(
    cluster: Any,
    program: Program,
    block: Block,
    argv: Sequence[str],
    migrate: Migrate | None = None,
    payload: bytes = b"",
    probe_slices: int = 0,
) -> tuple[dict[str, Any], Offloaded]:
    """The values later lines read of the block, every partition on its device (or, migrated,
    here), back in the source's order. ``payload``: the values it needs of earlier lines.
    ``probe_slices``: only the first slices of one partition per device, to measure the
    devices' time (the values are then partial)."""
    entry = cluster.entry(block.dataset)
    migrate = migrate or Migrate()
    body = LinesArgs(
        source=program.source,
        path=program.path,
        lines=block.needs + block.rows_lines,
        frame=block.frame,
        reader=block.reader,
        outputs=block.outputs + block.same,
        partials=tuple(Partial(n, r.target, r.partial) for n, r in block.reductions),
        columns=block.columns,
        geometry=geometry_of(entry),
        argv=(program.path, *argv),
        **limits(),
    ).to_json()
    tasks = []
    for p in _probed(entry, probe_slices):
        rest = probe_slices and p.slices > probe_slices
        skip = (PartitionRange(p.partition, probe_slices, p.slices),) if rest else ()
        request = WorkRequest(
            unit=Lines.NAME,
            domain=entry.domain,
            dataset=entry.name,
            partitions=(p.partition,),
            args=body,
            elsewhere=skip,
            **_migration(migrate, p, len(cluster.live_devices())),
        )
        host = Lines(request, payload, host_context())
        tasks.append(partition_task(cluster, entry, p, request, host, payload=payload))
    workers = WORKERS_PER_DEVICE * len(cluster.live_devices())
    dispatch = Dispatch()
    started = time.monotonic()
    batches = list(dispatch.run(tasks, workers, QUEUE_BATCHES_MAX, "quarry-offload"))
    wall_s = time.monotonic() - started
    table = pa.Table.from_batches(batches, schema=worker.OUTPUT_SCHEMA)
    reports = dispatch.sorted_reports()
    counted = WorkCounters.sum(r.counters for r in reports)
    done = Offloaded(
        lines=(program.lines[block.first].number, *block.lines),
        devices=tuple(sorted({r.device for r in reports})),
        rows_read=counted.rows_read,
        bytes_read=counted.bytes_read,
        bytes_shipped=counted.bytes_shipped,
        wall_s=wall_s,
        migrations=_migrations(reports, tasks, started),
        bytes_sent=dispatch.bytes_sent,
        drive_s=counted.drive_s,
    )
    return _values_of(table, block), done


def _probed(entry: Any, probe_slices: int) -> list[Any]:
    """Every partition with rows; to probe, the first each device holds."""
    found, devices = [], set()
    for p in entry.partitions:
        if not p.rows or (probe_slices and p.devices[0] in devices):
            continue
        devices.add(p.devices[0])
        found.append(p)
    return found


def _migration(migrate: Migrate, partition: Any, devices: int) -> dict[str, Any]:
    """The request's say on pushing back: forced for the second half, or the controller's."""
    if migrate.mode == "force":
        half = partition.slices // 2
        return {"forced": (ForcedDecision(partition.partition, half, partition.slices),)}
    if migrate.mode == "never":
        return {}
    host = HostCost(
        full_s_per_byte=migrate.host_s_per_byte,
        raw_ratio=1.0,
        filter_ratio=1.0,
        link_bytes_per_s=max(1.0, migrate.link_bytes_per_s),
        host_share=host_share(host_cores(), max(1, devices)),
        start=Stage.FULL,
        device_full_s_per_byte=migrate.device_s_per_byte,
    )
    return {"host": host, "query_id": f"offload-{os.getpid()}-{time.monotonic_ns()}"}


def _migrations(reports: Sequence[Any], tasks: Sequence[Any], started: float) -> tuple:
    found = []
    hosts = {t.request.partitions[0]: t.host for t in tasks}
    for report in reports:
        pushed = [d for d in report.decisions if d.stage is Stage.RAW]
        if not pushed:
            continue
        host = hosts.get(report.partition)
        at = host.first_completed - started if host and host.first_completed else 0.0
        found.append(
            Migration(
                report.device,
                report.partition,
                sum(d.end - d.first for d in pushed),
                report.counters.slices_total,
                round(at, 3),
                pushed[0].reason,
                pushed[0].pushed_back,
            )
        )
    return tuple(found)


def _declined(lines: tuple[int, ...], reason: str) -> Offloaded:
    """A block kept on the host because its inputs cannot go to the devices: the devices
    cannot take it (``capability``), and nothing was read or sent."""
    return Offloaded(lines, (), 0, 0, 0, declined=PushBack.CAPABILITY, declined_reason=reason)


def _values_of(table: pa.Table, block: Block) -> dict[str, Any]:
    """Every value, its runs in the source's order: rows concatenated, partials combined."""
    found: dict[str, Any] = {}
    rows = table.sort_by([("name", "ascending"), ("first", "ascending"), ("part", "ascending")])
    names = rows.column("name").to_pylist()
    firsts = rows.column("first").to_pylist()
    blobs = rows.column("value")
    grouped: dict[str, dict[int, list[Any]]] = {}
    for index, (name, first) in enumerate(zip(names, firsts)):
        value = values.decode(blobs[index].as_py())
        grouped.setdefault(name, {}).setdefault(first, []).append(value)
    for name in block.outputs:
        found[name] = _concatenated([parts[0] for parts in grouped.get(name, {}).values()])
    for name in block.same:
        found[name] = next(iter(grouped[name].values()))[0]
    for _, reduction in block.reductions:
        runs = [tuple(parts) for parts in grouped.get(reduction.target, {}).values()]
        found[reduction.target] = reduction.combine(runs)
    return found


def _concatenated(pieces: list[Any]) -> Any:
    first = pieces[0]
    if isinstance(first, pa.Table):
        return pa.concat_tables(pieces)
    if isinstance(first, np.ndarray):
        return np.concatenate(pieces)
    import pandas as pd

    joined = pd.concat(pieces)
    index = joined.index
    every_row = len(index) and index[0] == 0 and index[-1] == len(index) - 1
    if index.dtype.kind == "i" and every_row and index.is_monotonic_increasing:
        joined.index = pd.RangeIndex(len(index))  # every row, in order: the plain run's index
    return joined


def run_with_cut(
    program: Program,
    cluster: Any,
    mounts: Mounts,
    argv: Sequence[str],
    blocks: Sequence[Block],
    migrate: Migrate | Sequence[Migrate] | None = None,
    report: list[Offloaded] | None = None,
) -> dict[str, Any]:
    """The program, its blocks on the devices and the rest here, in one namespace; the
    namespace when it ends. What the devices did for each block goes to ``report``."""
    namespace: dict[str, Any] = {"__name__": "__main__", "__file__": program.path}
    migrates = migrate if isinstance(migrate, Sequence) else [migrate] * len(blocks)

    def host(lines: Sequence[Line]) -> None:
        part = Program(program.path, tuple(lines), program.source)
        profile.run(part, Reads(cluster, mounts), argv, namespace=namespace)

    position = 0
    for block, how in zip(blocks, migrates):
        host(program.lines[position : block.first])
        try:
            payload = shipped_values(block, namespace)
            found, done = run_on_devices(cluster, program, block, argv, how, payload)
        except NotOffloadable as error:
            host(program.lines[block.first : block.end])  # here, as a plain run would
            if report is not None:
                lines = (program.lines[block.first].number, *block.lines)
                report.append(_declined(lines, str(error)))
        except OffloadFailed as error:
            raise profile.ProgramFailed(str(error)) from None
        else:
            namespace.update(found)
            if report is not None:
                report.append(done)
        position = block.end
    host(program.lines[position:])
    return namespace
