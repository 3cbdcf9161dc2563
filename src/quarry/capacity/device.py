"""The CSD system of CSDPLAN on a live device: units of work ``capacity.<kernel>``.

Each of the four §4 kernels is a unit of work of the one device loop, run by name (Skytether
§5.2 exec):

    table, summary = cluster.devices["dev0"].program(
        "capacity.count", {"domain": "capacity", "dataset": "count", "partition": 0, "threads": 2})

A kernel needs its whole working set, so a partition is one chunk and the unit has no stage but
``full``: the device always runs it (nothing to push back). For every partition the unit
1. reads the partition's slices as the loop hands them over (each slice passes the drive's
   emulated internal bandwidth) and copies the kernel's columns into contiguous numpy arrays as
   they come: the **data transfer** of the paper (NAND to the drive's memory), ``transfer_s``;
2. runs the kernel with ``threads`` threads, every piece of work inside ``context.compute``: one of
   the drive's emulated cores (a slot), held compute_factor times the piece's CPU time: the
   **computation**, ``compute_s``. Beyond the profile's cores, pieces queue for a slot.
A partition is the unit of work, as the paper's "one I/O" of the working set: it bounds the
device's memory to one partition, and keeps sorted runs whole for Array Merge (ingest deals row
groups round-robin to partitions, so a sorted column is sorted within each partition only).

The request names the dataset and its partitions (all on this device); ``KernelArgs``:
    threads                    1..THREADS_MAX, default 1; beyond the profile's cores, pieces queue
    params                     kernel parameters (Count's ``value``, Page Rank's ``iterations``...)
    output                     "digest" (default: per partition a row count and checksum) or
                               "full" (the kernel's result rows, through the external link)

The output table, per kernel:
    count                      partition, count, rows
    vector_addition            partition, rows, checksum | partition, value
    array_merge                partition, rows, checksum | partition, value
    pagerank                   page, rank (the whole matrix must be one partition on this device)

The summary (beside the loop's bytes read and shipped, per partition): kernel,
threads, cores, compute_factor, partitions, rows, bytes (the kernel's input bytes in memory),
transfer_s, compute_s, program_s and result (Count's count, summed over the partitions).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from quarry.auth.tokens import Role
from quarry.capacity.kernel_data import (
    KERNEL_INPUTS,
    OPTIONAL_INPUTS,
    Gatherer,
    KernelInputError,
)
from quarry.capacity.kernels import KERNELS, THREADS_MAX, check_preconditions
from quarry.device.unit import REGISTRY, Chunk, Unit, register
from quarry.errors import ProtocolError, QuarryError
from quarry.protocol.message import Message, bounded
from quarry.protocol.stage import Stage

PROGRAM_PREFIX = "capacity."
OUTPUTS = ("digest", "full")
OUTPUT_ROWS_PER_BATCH = 1 << 16


class CapacityProgramError(QuarryError, ValueError):
    """A ``capacity.<kernel>`` request the device cannot run; the message names the field."""

    code = "capacity_program"


def program_name(kernel: str) -> str:
    return f"{PROGRAM_PREFIX}{kernel}"


@dataclass(frozen=True)
class KernelArgs(Message):
    threads: int = bounded(low=1, high=THREADS_MAX, default=1)
    params: dict[str, Any] = bounded(items_max=64, default_factory=dict)
    output: str = "digest"

    def __post_init__(self) -> None:
        assert self.output in OUTPUTS, f"output must be one of {OUTPUTS}, got {self.output!r}"


@dataclass
class Totals:
    transfer_s: float = 0.0
    compute_s: float = 0.0
    rows: int = 0
    input_bytes: int = 0
    count: int = 0


class KernelUnit(Unit):
    """One CSDPLAN kernel over whole partitions; subclasses name the kernel."""

    KERNEL = ""
    STAGES = frozenset({Stage.FULL})
    CHUNK_SLICES_MAX = None  # a partition is the unit of work: the paper's "one I/O"
    RESUMABLE = True  # a partition's result is whole once shipped
    ROLE = Role.ADMIN  # a program run on the drive, not a query

    def __init__(self, request, payload, context):
        super().__init__(request, payload, context)
        try:
            self.args = KernelArgs.from_json(request.args)
        except ProtocolError as error:
            raise CapacityProgramError(f"{self.NAME}: {error}") from None
        self.started = time.perf_counter()
        self.totals = Totals()

    @property
    def output_schema(self) -> pa.Schema:
        return output_schema(self.KERNEL, self.args.output)

    def execute(self, chunk: Chunk) -> list[pa.RecordBatch]:
        kernel, partition = self.KERNEL, chunk.meta.partition
        _check_columns(kernel, self.request, partition, chunk.meta.schema)
        transfer_started = time.perf_counter()
        try:
            gatherer = Gatherer(kernel, chunk.meta.schema, chunk.meta.rows)
            for batch in chunk.batches():
                gatherer.add(batch)
            inputs = gatherer.finish()
        except KernelInputError as error:
            raise CapacityProgramError(f"{self.NAME}: partition {partition}: {error}") from None
        self.totals.transfer_s += time.perf_counter() - transfer_started
        # Validation is neither transfer nor the kernel's work, so it runs outside both timers.
        try:
            check_preconditions(kernel, inputs)
            if kernel == "pagerank":
                _check_whole_matrix(inputs["matrix"], partition)
        except KernelInputError as error:
            raise CapacityProgramError(f"{self.NAME}: partition {partition}: {error}") from None
        compute_started = time.perf_counter()
        try:
            result = KERNELS[kernel](
                inputs, self.args.threads, self.args.params, self.context.compute
            )
        except KernelInputError as error:
            raise CapacityProgramError(f"{self.NAME}: {error}") from None
        self.totals.compute_s += time.perf_counter() - compute_started
        self.totals.rows += chunk.meta.rows
        self.totals.input_bytes += int(sum(array.nbytes for array in inputs.values()))
        if kernel == "count":
            self.totals.count += int(result)
        return [_output(kernel, self.args.output, partition, chunk.meta.rows, result)]

    def summary(self) -> dict[str, Any]:
        profile = self.context.emulator.profile
        summary: dict[str, Any] = {
            "program": self.NAME,
            "kernel": self.KERNEL,
            "threads": self.args.threads,
            "cores": profile.cores,
            "compute_factor": profile.compute_factor,
            "profile": profile.name,
            "partitions": list(self.request.partitions),
            "rows": self.totals.rows,
            "bytes": self.totals.input_bytes,
            "transfer_s": self.totals.transfer_s,
            "compute_s": self.totals.compute_s,
            "program_s": time.perf_counter() - self.started,
        }
        if self.KERNEL == "count":
            summary["result"] = self.totals.count
        return summary


def _check_columns(kernel: str, request: Any, partition: int, schema: pa.Schema) -> None:
    names = KERNEL_INPUTS[kernel]
    required = [n for n in names if (kernel, n) not in OPTIONAL_INPUTS]
    # materialize() falls back to column order when the first input is not named; a device is
    # stricter, because a stored dataset with other columns is more likely the wrong dataset.
    missing = [n for n in required if n not in schema.names]
    if missing:
        raise CapacityProgramError(
            f"{program_name(kernel)}: {request.domain}/{request.dataset} partition "
            f"{partition} has columns {schema.names}, missing {missing}; ingest the kernel's "
            "inputs with quarry.capacity.measure.ingest_kernel_inputs"
        )


def _check_whole_matrix(matrix: np.ndarray, partition: int) -> None:
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise KernelInputError(
            f"pagerank: this partition holds {matrix.shape[0]} rows of a matrix "
            f"{matrix.shape[1] if matrix.ndim == 2 else '?'} wide; each iteration needs the whole "
            "matrix, so ingest it as one partition (partitions=1)"
        )


def output_schema(kernel: str, output: str) -> pa.Schema:
    if kernel == "count":
        return pa.schema([("partition", pa.int32()), ("count", pa.int64()), ("rows", pa.int64())])
    if kernel == "pagerank":
        return pa.schema([("page", pa.int64()), ("rank", pa.float64())])
    if output == "full":
        return pa.schema([("partition", pa.int32()), ("value", pa.int64())])
    return pa.schema([("partition", pa.int32()), ("rows", pa.int64()), ("checksum", pa.int64())])


def _output(kernel: str, output: str, partition: int, rows: int, result: Any) -> pa.RecordBatch:
    schema = output_schema(kernel, output)
    if kernel == "count":
        return pa.record_batch(
            [
                pa.array([partition], pa.int32()),
                pa.array([int(result)]),
                pa.array([rows], pa.int64()),
            ],
            schema=schema,
        )
    if kernel == "pagerank":
        return pa.record_batch(
            [pa.array(np.arange(len(result), dtype=np.int64)), pa.array(result.astype(np.float64))],
            schema=schema,
        )
    if output == "full":
        return pa.record_batch(
            [
                pa.array(np.full(len(result), partition, dtype=np.int32)),
                pa.array(result.astype(np.int64)),
            ],
            schema=schema,
        )
    # A checksum lets the host check the device's answer without shipping it (modular int64 sum).
    checksum = int(np.sum(result, dtype=np.int64))
    return pa.record_batch(
        [
            pa.array([partition], pa.int32()),
            pa.array([len(result)], pa.int64()),
            pa.array([checksum], pa.int64()),
        ],
        schema=schema,
    )


# One registration per kernel, each under its own name, so `grep capacity.count` finds it.


@register
class CountUnit(KernelUnit):
    NAME, KERNEL = "capacity.count", "count"


@register
class VectorAdditionUnit(KernelUnit):
    NAME, KERNEL = "capacity.vector_addition", "vector_addition"


@register
class ArrayMergeUnit(KernelUnit):
    NAME, KERNEL = "capacity.array_merge", "array_merge"


@register
class PageRankUnit(KernelUnit):
    NAME, KERNEL = "capacity.pagerank", "pagerank"


assert all(program_name(kernel) in REGISTRY for kernel in KERNELS), "a kernel without a unit"
