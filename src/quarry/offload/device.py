"""Offloaded lines as a unit of work: the device loop runs them a slice at a time.

A run of lines that starts with a read of a stored dataset and passed the per-partition check
(``partitions.py``) runs on each device over its partitions' rows, in a worker process with
limits (``worker.py``); only the admin role may ask for it. Each row carries its place in the
source (``IngestRecord.group_rows``: the partition's groups): a pandas frame is indexed by it,
and every value comes back tagged with the first source row of its run, so the host puts the
values in the source's order (rows concatenated, reductions' partials combined) and has the
plain run's values, whatever the devices decided.

The unit pushes back like every other (stage ``raw``): a pushed-back slice ships its rows with
their source row numbers, and the host runs the same lines on them in a worker of its own
(migration, ActivePy §III.D). The device's controller decides it from the rates it measures,
or the request forces it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from quarry.auth.tokens import Role
from quarry.device.unit import Chunk, Unit, UnitError, register
from quarry.offload import worker
from quarry.offload.process import Limits, OffloadFailed, Worker
from quarry.protocol.message import Message, bounded
from quarry.protocol.stage import Stage
from quarry.store.partition import PartitionMeta

MEMORY_BYTES_DEFAULT = 2 << 30
CPU_S_DEFAULT = 600
CHUNK_WALL_S_DEFAULT = 600.0
__all__ = ["Geometry", "Lines", "LinesArgs", "OffloadFailed", "Partial"]


@dataclass(frozen=True)
class Geometry(Message):
    """Where a partition's rows sit in the source: group g of it is source group
    ``g * parts + index``, after ``base`` rows of earlier ingests."""

    base: int = bounded(low=0)
    group_rows: int = bounded(low=1)
    parts: int = bounded(low=1)
    index: int = bounded(low=0)

    def rows(self, first: int, count: int) -> np.ndarray:
        local = np.arange(first, first + count, dtype=np.int64)
        group, offset = np.divmod(local, self.group_rows)
        return self.base + (group * self.parts + self.index) * self.group_rows + offset


@dataclass(frozen=True)
class Partial(Message):
    """A reduction's line: devices bind ``target``'s parts from ``expression`` instead."""

    line: int = bounded(low=1)
    target: str = bounded(chars_max=256)
    expression: str = bounded(chars_max=1 << 16)


@dataclass(frozen=True)
class LinesArgs(Message):
    source: str = bounded(chars_max=1 << 20)  # the whole program
    path: str = bounded(chars_max=4096)
    lines: tuple[int, ...] = bounded(items_max=100_000)  # statements run as written
    frame: str = bounded(chars_max=256)  # the name the read binds
    reader: str = bounded(chars_max=16, default="pandas")  # "pandas" or "arrow" (pq.read_table)
    outputs: tuple[str, ...] = bounded(items_max=1_000, default=())  # row values sent back
    partials: tuple[Partial, ...] = bounded(items_max=1_000, default=())
    columns: tuple[str, ...] | None = bounded(items_max=10_000, default=None)
    geometry: dict[str, Geometry] = bounded(items_max=100_000, default_factory=dict)
    memory_bytes: int = bounded(low=1 << 20, default=MEMORY_BYTES_DEFAULT)
    cpu_s: int = bounded(low=1, default=CPU_S_DEFAULT)
    chunk_wall_s: float = bounded(low=0.1, default=CHUNK_WALL_S_DEFAULT)
    argv: tuple[str, ...] = bounded(items_max=10_000, default=())  # sys.argv of the program

    def header(self) -> worker.Header:
        return worker.Header(
            source=self.source,
            path=self.path,
            frame=self.frame,
            reader=self.reader,
            lines=list(self.lines),
            partials={str(p.line): p.expression for p in self.partials},
            targets={str(p.line): p.target for p in self.partials},
            outputs=list(self.outputs),
            argv=list(self.argv),
        )


@register
class Lines(Unit):
    NAME = "offload.lines"
    ROLE = Role.ADMIN  # it runs the caller's code
    STAGES = frozenset({Stage.FULL, Stage.RAW})
    RESUMABLE = True  # run by run: a chunk's output is whole once streamed
    CHUNK_SLICES_MAX = 1  # a slice at a time: the controller judges, and migrates, per slice

    def __init__(self, request, payload, context):
        super().__init__(request, payload, context)
        self.args = LinesArgs.from_json(request.args)
        self._worker: Worker | None = None
        self._in_process: worker.InProcess | None = None  # the host's, for pushed-back slices
        self._lock = threading.Lock()
        self.completed_slices = 0  # on the host: pushed-back slices it ran
        self.first_completed: float | None = None  # and when it finished the first (monotonic)

    @property
    def output_schema(self) -> pa.Schema:
        return worker.OUTPUT_SCHEMA

    def columns(self) -> list[str] | None:
        return list(self.args.columns) if self.args.columns is not None else None

    def execute(self, chunk: Chunk) -> list[pa.RecordBatch]:
        geometry = self._geometry(chunk.meta.partition)
        first = sum(chunk.meta.slices[n].rows for n in range(chunk.numbers[0]))
        out = []
        for batch in chunk.batches():  # one slice at a time: the same runs wherever it runs
            rows = _with_rows(pa.Table.from_batches([batch]), geometry.rows(first, batch.num_rows))
            first += batch.num_rows
            values = self.context.compute_elsewhere(lambda rows=rows: self.worker().run(rows))
            out.extend(values.to_batches())
        return [b for b in out if b.num_rows]

    def raw_schema_of(self, meta: PartitionMeta) -> pa.Schema:
        names = meta.schema.names if self.args.columns is None else self.args.columns
        schema = pa.schema([meta.schema.field(name) for name in names])
        return schema.append(pa.field(worker.ROW_COLUMN, pa.int64(), nullable=False))

    def raw_slice(self, meta: PartitionMeta, number: int, batch: pa.RecordBatch) -> pa.RecordBatch:
        """A pushed-back slice: its rows, with their place in the source."""
        first = sum(meta.slices[n].rows for n in range(number))
        names = [f.name for f in self.raw_schema_of(meta)][:-1]
        rows = self._geometry(meta.partition).rows(first, batch.num_rows)
        return pa.RecordBatch.from_arrays(
            [*batch.select(names).columns, pa.array(rows)], schema=self.raw_schema_of(meta)
        )

    def complete(self, stage: Stage, batches: Iterable[pa.RecordBatch]) -> Iterable[pa.RecordBatch]:
        """On the host: the same lines over pushed-back slices, one slice at a time, in this
        process (the program is the host's own: its plain run would run here too)."""
        for batch in batches:
            rows = pa.Table.from_batches([batch])
            try:
                out = self.context.compute(lambda rows=rows: self._here().run(rows))
            except worker.LinesFailed as error:
                raise OffloadFailed(str(error)) from None
            self.completed_slices += 1
            if self.first_completed is None:
                self.first_completed = time.monotonic()
            yield from out.to_batches()

    def _here(self) -> worker.InProcess:
        with self._lock:
            if self._in_process is None:
                self._in_process = worker.InProcess(self.args.header(), self.payload)
            return self._in_process

    def _geometry(self, partition: int) -> Geometry:
        geometry = self.args.geometry.get(str(partition))
        if geometry is None:
            raise UnitError(f"no source geometry for partition {partition}")
        return geometry

    def worker(self) -> Worker:
        with self._lock:  # the host may complete two pushed-back ranges at once
            if self._worker is None:
                limits = Limits(self.args.memory_bytes, self.args.cpu_s, self.args.chunk_wall_s)
                self._worker = Worker.given(self.args.header(), self.payload, limits)
            return self._worker

    def finish(self) -> Iterable[pa.RecordBatch]:
        if self._worker is not None:
            self._worker.release()
            self._worker = None
        return ()


def _with_rows(table: pa.Table, rows: np.ndarray) -> pa.Table:
    return table.append_column(worker.ROW_COLUMN, pa.array(rows))
