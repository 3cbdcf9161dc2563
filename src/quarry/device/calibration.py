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

KERNEL_ELEMENTS = 1 << 22
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

    It sorts in place in a buffer allocated once: fresh allocations would add page faults
    and allocator behaviour that differ from one process to another, which is not the CPU's
    speed."""
    _KERNEL_BUFFER[:] = _KERNEL_INPUT
    _KERNEL_BUFFER.sort()
    return float(_KERNEL_BUFFER[:: 1 << 10].sum())


def time_kernel(emulator: Emulator | None = None, repeat: int = KERNEL_REPEAT) -> float:
    """Best of ``repeat`` runs, in seconds of the drive's time: the kernel's CPU seconds on this
    thread, plus, on a device, the time the profile stretches them by. CPU time keeps other
    processes on the machine out of the figure."""
    assert repeat >= 1
    best = float("inf")
    compute_kernel()  # warm-up: allocator, caches
    for _ in range(repeat):
        if emulator is None:
            started = time.thread_time()
            compute_kernel()
            best = min(best, time.thread_time() - started)
            continue
        with emulator.slot():
            started = time.thread_time()
            compute_kernel()
            work_s = time.thread_time() - started
            best = min(best, work_s + emulator.stretch(work_s))
    return best


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
