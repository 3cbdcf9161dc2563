"""Offloaded lines as a unit of work: the device loop runs them a chunk of slices at a time.

A run of lines that starts with a read of a stored dataset and passed the per-partition check
(``partitions.py``) runs on each device over its partitions' rows, in a worker process with
limits (``worker.py``); only the admin role may ask for it. Each row carries its place in the
source (``IngestRecord.group_rows``: the partition's groups), which becomes the frame's index,
so the host concatenates the devices' outputs, sorts by it, and has exactly the plain run's
value. The unit has no push-back (yet): a device runs all of it.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from quarry.auth.tokens import Role
from quarry.device.unit import Chunk, Unit, UnitError, register
from quarry.errors import QuarryError
from quarry.offload import worker
from quarry.protocol.message import Message, bounded
from quarry.protocol.stage import Stage

MEMORY_BYTES_DEFAULT = 2 << 30
CPU_S_DEFAULT = 600
CHUNK_WALL_S_DEFAULT = 600.0


class OffloadFailed(QuarryError):
    """An offloaded line raised, or ran out of its limits, on a device: where, and what."""

    code = "offload_failed"


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
class LinesArgs(Message):
    source: str = bounded(chars_max=1 << 20)  # the whole program
    path: str = bounded(chars_max=4096)
    lines: tuple[int, ...] = bounded(items_max=100_000)  # the statements to run
    frame: str = bounded(chars_max=256)  # the name the read binds
    output: str = bounded(chars_max=256)  # the name the host needs back
    schema: pa.Schema  # of the output, as the sample gave it
    columns: tuple[str, ...] | None = bounded(items_max=10_000, default=None)
    geometry: dict[str, Geometry] = bounded(items_max=100_000, default_factory=dict)
    memory_bytes: int = bounded(low=1 << 20, default=MEMORY_BYTES_DEFAULT)
    cpu_s: int = bounded(low=1, default=CPU_S_DEFAULT)
    chunk_wall_s: float = bounded(low=0.1, default=CHUNK_WALL_S_DEFAULT)
    argv: tuple[str, ...] = bounded(items_max=10_000, default=())  # sys.argv of the program


@register
class Lines(Unit):
    NAME = "offload.lines"
    ROLE = Role.ADMIN  # it runs the caller's code
    STAGES = frozenset({Stage.FULL})
    RESUMABLE = True  # row by row: a chunk's output is whole once streamed

    def __init__(self, request, payload, context):
        super().__init__(request, payload, context)
        self.args = LinesArgs.from_json(request.args)
        self._worker: Worker | None = None

    @property
    def output_schema(self) -> pa.Schema:
        return self.args.schema

    def columns(self) -> list[str] | None:
        return list(self.args.columns) if self.args.columns is not None else None

    def execute(self, chunk: Chunk) -> list[pa.RecordBatch]:
        geometry = self.args.geometry.get(str(chunk.meta.partition))
        if geometry is None:
            raise UnitError(f"no source geometry for partition {chunk.meta.partition}")
        first = sum(chunk.meta.slices[n].rows for n in range(chunk.numbers[0]))
        table = pa.Table.from_batches(list(chunk.batches()))
        rows = table.append_column(
            worker.ROW_COLUMN, pa.array(geometry.rows(first, table.num_rows))
        )
        out = self.context.compute(lambda: self.worker().run(rows))
        return [b for b in out.cast(self.args.schema).to_batches() if b.num_rows]

    def worker(self) -> Worker:
        if self._worker is None:
            self._worker = Worker(self.args)
        return self._worker

    def finish(self) -> Iterable[pa.RecordBatch]:
        if self._worker is not None:
            self._worker.close()
        return ()


class Worker:
    """One worker process and its pipes."""

    def __init__(self, args: LinesArgs):
        self.args = args

        def limits() -> None:  # in the child, before anything of the program runs
            resource.setrlimit(resource.RLIMIT_AS, (args.memory_bytes, args.memory_bytes))
            resource.setrlimit(resource.RLIMIT_CPU, (args.cpu_s, args.cpu_s))

        self.process = subprocess.Popen(
            [sys.executable, "-m", "quarry.offload.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            preexec_fn=limits,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        header = {
            "source": args.source,
            "path": args.path,
            "lines": list(args.lines),
            "frame": args.frame,
            "output": args.output,
            "argv": list(args.argv),
        }
        self.process.stdin.write(json.dumps(header).encode() + b"\n")
        self.process.stdin.flush()

    def run(self, rows: pa.Table) -> pa.Table:
        timer = threading.Timer(self.args.chunk_wall_s, self.process.kill)
        timer.start()
        try:
            worker.write_frame(self.process.stdin, b"D", worker.ipc(rows))
            frame = worker.read_frame(self.process.stdout)
        except (BrokenPipeError, EOFError, OSError):
            frame = None
        finally:
            timer.cancel()
        if frame is None:
            raise OffloadFailed(self._death())
        tag, body = frame
        if tag == b"E":
            self.close()
            raise OffloadFailed(body.decode(errors="replace"))
        return pa.ipc.open_stream(pa.py_buffer(body)).read_all()

    def _death(self) -> str:
        code = self.process.wait(timeout=10)
        limits = (
            f"{self.args.memory_bytes >> 20} MiB of memory, {self.args.cpu_s} s of CPU, "
            f"{self.args.chunk_wall_s:g} s per chunk"
        )
        return (
            f"{self.args.path}: the offloaded lines {list(self.args.lines)} stopped "
            f"(exit {code}) within their limits ({limits})"
        )

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.process.stdin.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
