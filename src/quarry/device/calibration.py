"""Micro-benchmarks a device runs for ``quarry calibrate`` (CSDPLAN step 1).

The same compute kernel runs on the host (no emulation) and inside a device slot (with it); the
ratio of their times is the measured compute factor. Internal bandwidth is timed reading
key-values from the device's own store; external bandwidth is timed by the host receiving a
stream (``calibration_stream``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from quarry.device.emulation import Emulator
from quarry.store.kv import KeyValueStore

KERNEL_ELEMENTS = 1 << 15  # 256 KiB of float64: the working set stays in the core's own cache
KERNEL_PASSES = 256
KERNEL_REPEAT = 5
INTERNAL_BYTES = 128 << 20
EXTERNAL_BATCH_ROWS = 1 << 19  # 4 MiB of float64 per batch
CALIBRATION_PREFIX = "~calibration/"
MEASURE_S = 1.0  # each bandwidth is timed over at least this long
INTERNAL_PASSES_MAX = 64


_KERNEL_INPUT = np.random.default_rng(1234).random(KERNEL_ELEMENTS)
_KERNEL_BUFFER = np.empty_like(_KERNEL_INPUT)


def compute_kernel() -> float:
    """A fixed, single-threaded CPU workload; returns its checksum (so nothing is skipped).

    It sorts a small array in place, pass after pass, in a buffer allocated once. The working
    set fits the core's own cache, so the time is the processor's and not the memory bus's,
    which other processes on the machine share (a kernel over 32 MiB varied by 10% from run to
    run; this one by under 2%). Fresh allocations would add page faults and allocator
    behaviour that differ from one process to another."""
    for _ in range(KERNEL_PASSES):
        _KERNEL_BUFFER[:] = _KERNEL_INPUT
        _KERNEL_BUFFER.sort()
    return float(_KERNEL_BUFFER[:: 1 << 10].sum())


def time_kernel(emulator: Emulator | None = None, repeat: int = KERNEL_REPEAT) -> float:
    """Best of ``repeat`` runs, in seconds of the drive's time: the kernel's CPU seconds on this
    thread, plus, on a device, the time the profile stretches them by. CPU time keeps other
    processes on the machine out of the figure.

    On a device the runs go back to back and the slot is then held once for the stretch of all
    of them: a sleep between runs would leave caches and clocks cold for the next one, which
    measures the emulator's sleeping, not the drive's processor."""
    assert repeat >= 1
    if emulator is None:
        return _best_kernel_s(repeat)
    with emulator.slot():
        works_s = [_kernel_s() for _ in range(repeat + 1)][1:]  # the first run warms up
        extra_s = emulator.stretch(sum(works_s))
    return min(works_s) * (1.0 + extra_s / sum(works_s))


def _kernel_s() -> float:
    started = time.thread_time()
    compute_kernel()
    return time.thread_time() - started


def _best_kernel_s(repeat: int) -> float:
    compute_kernel()  # warm-up: allocator, caches
    return min(_kernel_s() for _ in range(repeat))


def time_internal_reads(store: KeyValueStore, emulator: Emulator) -> float:
    """Bytes per second reading key-values off the store through the internal link.

    Reads go on, pass after pass over the same key-values, for at least ``MEASURE_S``: a fast
    link must be timed long enough that the bucket's small idle credit does not count."""
    value_bytes = min(store.kv_bytes_max, 1 << 20)
    count = INTERNAL_BYTES // value_bytes
    keys = [f"{CALIBRATION_PREFIX}{i:06d}" for i in range(count)]
    payload = np.random.default_rng(5).bytes(value_bytes)
    with store.transaction() as txn:
        for key in keys:
            txn.put(key, payload)
    try:
        store.get_many(keys[:4])  # warm the page cache path once
        started = time.perf_counter()
        total = 0
        for _ in range(INTERNAL_PASSES_MAX):
            for key in keys:
                emulator.read(value_bytes)
                total += len(store.get(key)[0])
            if time.perf_counter() - started >= MEASURE_S:
                break
        elapsed = time.perf_counter() - started
    finally:
        store.delete_prefix(CALIBRATION_PREFIX)
    return total / elapsed


def calibration_stream(emulator: Emulator, total_bytes: int) -> tuple[pa.Schema, Iterator]:
    """Record batches of ``total_bytes`` sent through the external link (the host times it)."""
    schema = pa.schema([("v", pa.float64())])
    batch = pa.record_batch([pa.array(np.zeros(EXTERNAL_BATCH_ROWS))], schema=schema)
    size = pa.ipc.get_record_batch_size(batch)
    count = max(1, total_bytes // size)

    def batches() -> Iterator[pa.RecordBatch]:
        for _ in range(count):
            emulator.ship(size)
            yield batch

    return schema, batches()
