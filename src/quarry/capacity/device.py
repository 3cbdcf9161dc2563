"""The CSD system of CSDPLAN on a live device: programs ``capacity.<kernel>`` (Skytether §5.2 exec).

Each of the four §4 kernels is a built-in device program, run by name:

    table, summary = cluster.devices["dev0"].program(
        "capacity.count", {"domain": "capacity", "dataset": "count", "partition": 0, "threads": 2})

For every partition of the request the program
1. reads the partition's slices off the device's store with ``ctx.read_slice`` (each slice passes
   the drive's emulated internal bandwidth) and copies the kernel's columns into contiguous numpy
   arrays as they come: the **data transfer** of the paper (NAND to the drive's memory),
   ``transfer_s``;
2. runs the kernel with ``threads`` threads, every piece of work inside ``ctx.compute``: one of
   the drive's emulated cores (a slot), held compute_factor times the piece's CPU time: the
   **computation**, ``compute_s``. Beyond the profile's cores, pieces queue for a slot.
A partition is the unit of work, as the paper's "one I/O" of the working set: it bounds the
device's memory to one partition, and keeps sorted runs whole for Array Merge (ingest deals row
groups round-robin to partitions, so a sorted column is sorted within each partition only).

The request header (JSON):
    domain, dataset            the dataset
    partition | partitions     one partition number, or a list of them (all on this device)
    threads                    1..THREADS_MAX, default 1; beyond the profile's cores, pieces queue
    params                     kernel parameters (Count's ``value``, Page Rank's ``iterations``...)
    output                     "digest" (default: per partition a row count and checksum) or
                               "full" (the kernel's result rows, through the external link)

The output table, per kernel:
    count                      partition, count, rows
    vector_addition            partition, rows, checksum | partition, value
    array_merge                partition, rows, checksum | partition, value
    pagerank                   page, rank (the whole matrix must be one partition on this device)

The summary adds to the server's bytes_read / rows_read / bytes_shipped / wall_s: kernel,
threads, cores, compute_factor, partitions, rows, bytes (the kernel's input bytes in memory),
transfer_s, compute_s, program_s and result (Count's count, summed over the partitions).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from quarry.capacity.kernel_data import (
    KERNEL_INPUTS,
    OPTIONAL_INPUTS,
    Gatherer,
    KernelInputError,
)
from quarry.capacity.kernels import KERNELS, THREADS_MAX, check_preconditions
from quarry.device.programs import REGISTRY, ProgramContext, ProgramResult, register
from quarry.errors import QuarryError

PROGRAM_PREFIX = "capacity."
PARTITIONS_MAX = 4096
OUTPUTS = ("digest", "full")
OUTPUT_ROWS_PER_BATCH = 1 << 16


class CapacityProgramError(QuarryError, ValueError):
    """A ``capacity.<kernel>`` request the device cannot run; the message names the field."""

    code = "capacity_program"


def program_name(kernel: str) -> str:
    return f"{PROGRAM_PREFIX}{kernel}"


@dataclass(frozen=True)
class Request:
    kernel: str
    domain: str
    dataset: str
    partitions: tuple[int, ...]
    threads: int
    params: dict[str, Any]
    output: str

    @classmethod
    def from_header(cls, kernel: str, header: Mapping[str, Any]) -> Request:
        name = program_name(kernel)
        for key in ("domain", "dataset"):
            if not isinstance(header.get(key), str) or not header[key]:
                raise CapacityProgramError(f"{name}: header field {key!r} must name the dataset")
        if "partitions" in header:
            partitions = header["partitions"]
            if not isinstance(partitions, list) or not 1 <= len(partitions) <= PARTITIONS_MAX:
                raise CapacityProgramError(
                    f"{name}: 'partitions' must be a list of 1 to {PARTITIONS_MAX} numbers"
                )
        elif "partition" in header:
            partitions = [header["partition"]]
        else:
            raise CapacityProgramError(f"{name}: give 'partition' (a number) or 'partitions'")
        if any(isinstance(p, bool) or not isinstance(p, int) or p < 0 for p in partitions):
            raise CapacityProgramError(
                f"{name}: partition numbers are integers >= 0, got {partitions}"
            )
        if len(set(partitions)) != len(partitions):
            raise CapacityProgramError(f"{name}: partition listed twice in {partitions}")
        threads = header.get("threads", 1)
        if (
            isinstance(threads, bool)
            or not isinstance(threads, int)
            or not 1 <= threads <= THREADS_MAX
        ):
            raise CapacityProgramError(
                f"{name}: 'threads' must be an integer from 1 to {THREADS_MAX}, got {threads!r}"
            )
        params = header.get("params") or {}
        if not isinstance(params, dict):
            raise CapacityProgramError(f"{name}: 'params' must be an object, got {params!r}")
        output = header.get("output", "digest")
        if output not in OUTPUTS:
            raise CapacityProgramError(f"{name}: 'output' must be one of {OUTPUTS}, got {output!r}")
        return cls(
            kernel, header["domain"], header["dataset"], tuple(partitions), threads, params, output
        )


@dataclass
class Totals:
    transfer_s: float = 0.0
    compute_s: float = 0.0
    rows: int = 0
    input_bytes: int = 0
    outputs: list[pa.RecordBatch] = field(default_factory=list)
    count: int = 0


def run_program(kernel: str, ctx: ProgramContext, header: Mapping[str, Any]) -> ProgramResult:
    """Run ``kernel`` over the requested partitions; times transfer and computation apart."""
    started = time.perf_counter()
    request = Request.from_header(kernel, header)
    totals = Totals()
    for partition in request.partitions:
        _run_partition(ctx, request, partition, totals)
    schema = output_schema(kernel, request.output)
    output = pa.Table.from_batches(totals.outputs, schema=schema).combine_chunks()
    summary: dict[str, Any] = {
        "program": program_name(kernel),
        "kernel": kernel,
        "threads": request.threads,
        "cores": ctx.emulator.profile.cores,
        "compute_factor": ctx.emulator.profile.compute_factor,
        "profile": ctx.emulator.profile.name,
        "partitions": list(request.partitions),
        "rows": totals.rows,
        "bytes": totals.input_bytes,
        "transfer_s": totals.transfer_s,
        "compute_s": totals.compute_s,
        "program_s": time.perf_counter() - started,
    }
    if kernel == "count":
        summary["result"] = totals.count
    return ProgramResult(schema, _batches(output), summary)


def _run_partition(ctx: ProgramContext, request: Request, partition: int, totals: Totals) -> None:
    kernel = request.kernel
    meta = ctx.meta(request.domain, request.dataset, partition)
    _check_columns(request, partition, meta.schema)
    transfer_started = time.perf_counter()
    try:
        gatherer = Gatherer(kernel, meta.schema, meta.rows)
        for number in range(len(meta.slices)):
            batch = ctx.read_slice(meta, number)
            # Paired with the write side: each slice holds the rows its metadata promised.
            assert batch.num_rows == meta.slices[number].rows, (number, batch.num_rows)
            gatherer.add(batch)
        inputs = gatherer.finish()
    except KernelInputError as error:
        raise CapacityProgramError(
            f"{program_name(kernel)}: partition {partition}: {error}"
        ) from None
    totals.transfer_s += time.perf_counter() - transfer_started
    # Validation is neither transfer nor the kernel's work, so it runs outside both timers.
    try:
        check_preconditions(kernel, inputs)
        if kernel == "pagerank":
            _check_whole_matrix(inputs["matrix"], partition)
    except KernelInputError as error:
        raise CapacityProgramError(
            f"{program_name(kernel)}: partition {partition}: {error}"
        ) from None
    compute_started = time.perf_counter()
    try:
        result = KERNELS[kernel](inputs, request.threads, request.params, ctx.compute)
    except KernelInputError as error:
        raise CapacityProgramError(f"{program_name(kernel)}: {error}") from None
    totals.compute_s += time.perf_counter() - compute_started
    totals.rows += meta.rows
    totals.input_bytes += int(sum(array.nbytes for array in inputs.values()))
    totals.outputs.append(_output(kernel, request.output, partition, meta.rows, result))
    if kernel == "count":
        totals.count += int(result)


def _check_columns(request: Request, partition: int, schema: pa.Schema) -> None:
    names = KERNEL_INPUTS[request.kernel]
    required = [n for n in names if (request.kernel, n) not in OPTIONAL_INPUTS]
    # materialize() falls back to column order when the first input is not named; a device is
    # stricter, because a stored dataset with other columns is more likely the wrong dataset.
    missing = [n for n in required if n not in schema.names]
    if missing:
        raise CapacityProgramError(
            f"{program_name(request.kernel)}: {request.domain}/{request.dataset} partition "
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


def _batches(output: pa.Table) -> Iterator[pa.RecordBatch]:
    yield from output.to_batches(max_chunksize=OUTPUT_ROWS_PER_BATCH)


# One registration per kernel, each under its own name, so `grep capacity.count` finds it.


@register("capacity.count")
def count_program(ctx: ProgramContext, header: dict[str, Any], payload: bytes) -> ProgramResult:
    return run_program("count", ctx, header)


@register("capacity.vector_addition")
def vector_addition_program(
    ctx: ProgramContext, header: dict[str, Any], payload: bytes
) -> ProgramResult:
    return run_program("vector_addition", ctx, header)


@register("capacity.array_merge")
def array_merge_program(
    ctx: ProgramContext, header: dict[str, Any], payload: bytes
) -> ProgramResult:
    return run_program("array_merge", ctx, header)


@register("capacity.pagerank")
def pagerank_program(ctx: ProgramContext, header: dict[str, Any], payload: bytes) -> ProgramResult:
    return run_program("pagerank", ctx, header)


assert all(program_name(kernel) in REGISTRY for kernel in KERNELS), "a kernel without a program"
