"""Running a sub-plan on one partition: prune, decide per slice range, execute, stream back.

The stream carries the ``full`` stage's output batches. Slice ranges the device declines are
announced at once in metadata messages (``pushed_back``) so the host can fetch them while the
device goes on; the last message is the annotation (decisions per range) and the metrics.
"""

from __future__ import annotations

import resource
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa
from pyarrow import flight

from quarry import protocol
from quarry.device.controller import (
    Adaptive,
    Annotation,
    Controllers,
    Decision,
    ForcedDecisions,
    HostCost,
    Policy,
)
from quarry.device.emulation import Emulator
from quarry.errors import PlanNotSupported
from quarry.store import partition as partitions
from quarry.store.kv import KeyValueStore
from quarry.store.partition import PartitionMeta, schema_from_text

CHUNK_SLICES_MAX = 4  # slices executed together: amortises planning, bounds device memory
PARKED_BYTES_MAX = 256 << 20  # filtered rows a device keeps for the host to fetch
TRACE_ENTRIES_MAX = 100_000  # per-chunk timings kept when a request asks for a trace
PUSHBACK_NOTICE_SLICES = 16  # announce pushed-back slices in groups so the host starts early


@dataclass
class Metrics:
    slices_total: int = 0
    slices_pruned: int = 0
    slices_scanned: int = 0
    slices_executed: int = 0
    slices_pushed_back: int = 0
    rows_read: int = 0
    bytes_read: int = 0
    rows_shipped: int = 0
    bytes_shipped: int = 0
    device_cpu_s: float = 0.0
    wall_s: float = 0.0


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def split_stages(header: dict[str, Any], payload: bytes) -> dict[str, bytes]:
    stages, offset = {}, 0
    for name, length in header["stage_bytes"].items():
        stages[name] = payload[offset : offset + length]
        offset += length
    assert offset == len(payload), "stage lengths do not add up to the payload"
    return stages


def candidate_slices(meta: PartitionMeta, predicates: list[dict[str, Any]]) -> list[int]:
    if not predicates:
        return list(range(len(meta.slices)))
    from quarry.plan.prune import slice_may_match

    return [i for i, s in enumerate(meta.slices) if slice_may_match(predicates, s.zone_map)]


def ranges(numbers: list[int]) -> list[tuple[int, int]]:
    """[1,2,3,7,8] -> [(1,4),(7,9)]"""
    out: list[tuple[int, int]] = []
    for n in numbers:
        if out and out[-1][1] == n:
            out[-1] = (out[-1][0], n + 1)
        else:
            out.append((n, n + 1))
    return out


def conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """DataFusion may report nullability differently chunk to chunk; the stream's schema rules."""
    if batch.schema.equals(schema):
        return batch
    return pa.RecordBatch.from_arrays(batch.columns, schema=schema)


def run_query(
    store: KeyValueStore,
    emulator: Emulator,
    header: dict[str, Any],
    payload: bytes,
    writer: flight.MetadataRecordBatchWriter,
    controllers: Controllers | None = None,
    parked: Parked | None = None,
) -> None:
    from quarry.plan.stage import run_stage

    started, cpu_started = time.perf_counter(), cpu_seconds()
    stages = split_stages(header, payload)
    meta = partitions.read_meta(
        store, header["domain"], header["dataset"], int(header["partition"])
    )
    output_schema = schema_from_text(header["output_schema"])
    writer.begin(output_schema)
    metrics = Metrics(slices_total=len(meta.slices))
    annotation = Annotation()
    forced = ForcedDecisions(header.get("decisions") or [])

    candidates = candidate_slices(meta, header.get("predicates") or [])
    kept = set(candidates)
    for first, end in ranges([i for i in range(len(meta.slices)) if i not in kept]):
        annotation.record(Decision(first, end, "pruned", "zone maps exclude every row"))
        metrics.slices_pruned += end - first

    host = HostCost.from_json(header.get("host"))
    adaptive = None
    if host is not None:

        def create() -> Adaptive:
            return Adaptive(Policy.from_json(header.get("policy")), host, emulator.load)

        key = header.get("query_id")
        adaptive = controllers.get(key, create) if controllers is not None and key else create()
    pushed: list[int] = []
    pushed_stage = ""
    trace: list[dict[str, Any]] | None = [] if header.get("trace") else None
    chunk_slices_max = max(
        1, min(int(header.get("chunk_slices", CHUNK_SLICES_MAX)), CHUNK_SLICES_MAX)
    )

    def flush_pushed() -> None:
        nonlocal pushed
        if not pushed:
            return
        notice = {
            "pushed_back": {
                "slices": [[a, b] for a, b in ranges(pushed)],
                "stage": pushed_stage,
                # the host reads these through another stream; it accounts them with these
                "rows": sum(meta.slices[n].rows for n in pushed),
                "bytes_stored": sum(meta.slices[n].bytes_stored for n in pushed),
            }
        }
        writer.write_metadata(pa.py_buffer(protocol.encode_json(notice)))
        pushed = []

    # stored bytes of every candidate slice from each position on: the work left
    remaining_bytes = [0] * (len(candidates) + 1)
    for index in range(len(candidates) - 1, -1, -1):
        remaining_bytes[index] = (
            remaining_bytes[index + 1] + meta.slices[candidates[index]].bytes_stored
        )
    position = 0
    while position < len(candidates):
        first = candidates[position]
        stage, reason, retry = _decide(
            forced,
            adaptive,
            first,
            meta.slices[first].bytes_stored,
            remaining_bytes[position],
        )
        numbers = [first]
        probing = adaptive is not None and adaptive.probing
        if stage == "full" and not probing:  # a chunk: contiguous slices, the same decision
            while (
                len(numbers) < chunk_slices_max
                and position + len(numbers) < len(candidates)
                and candidates[position + len(numbers)] == numbers[-1] + 1
                and forced.stage_for(numbers[-1] + 1) in (None, "full")
            ):
                numbers.append(numbers[-1] + 1)
        position += len(numbers)
        end = numbers[-1] + 1
        if stage != "full":
            if pushed and (pushed_stage != stage or len(pushed) >= PUSHBACK_NOTICE_SLICES):
                flush_pushed()
            if stage == "filter":
                # The device filters now, timed like any work it does, and parks the rows for
                # the host to fetch with the rest of this range.
                _filter_now(
                    store,
                    emulator,
                    meta,
                    numbers,
                    stages["filter"],
                    header,
                    adaptive,
                    metrics,
                    parked,
                )
            pushed_stage = stage
            pushed.extend(numbers)
            metrics.slices_pushed_back += len(numbers)
            annotation.record(Decision(first, end, stage, reason, retry))
            continue
        stored = 0
        batches = []
        for number in numbers:
            emulator.read(meta.slices[number].bytes_stored)
            batch = partitions.read_slice(store, meta, number)
            stored += meta.slices[number].bytes_stored
            batches.append(batch)
        # Reading costs the same whether the device runs the sub-plan or pushes back, so the
        # decision compares only what follows the read.
        chunk_started = time.perf_counter()
        metrics.rows_read += sum(b.num_rows for b in batches)
        metrics.bytes_read += stored
        metrics.slices_scanned += len(numbers)
        outputs, drive_s = emulator.run_timed(
            lambda batches=batches: [
                conform(out, output_schema)
                for out in _run(run_stage, stages["full"], meta.schema, batches)
                if out.num_rows
            ]
        )
        shipped = 0
        for out in outputs:
            size = pa.ipc.get_record_batch_size(out)
            emulator.ship(size)
            shipped += size
            metrics.rows_shipped += out.num_rows
            writer.write_batch(out)
        metrics.bytes_shipped += shipped
        metrics.slices_executed += len(numbers)
        chunk_s = time.perf_counter() - chunk_started
        if adaptive is not None:
            # the drive's own time: emulated compute, and shipping at its link's rate
            adaptive.observe(
                "full", stored, shipped, drive_s + shipped / adaptive.host.link_bytes_per_s
            )
        if trace is not None and len(trace) < TRACE_ENTRIES_MAX:
            trace.append(
                {
                    "first": first,
                    "end": end,
                    "seconds": chunk_s,
                    "bytes_stored": stored,
                    "bytes_shipped": shipped,
                }
            )
        annotation.record(Decision(first, end, "full", reason))
    flush_pushed()

    metrics.device_cpu_s = cpu_seconds() - cpu_started
    metrics.wall_s = time.perf_counter() - started
    final = {"annotation": annotation.to_json(), "metrics": asdict(metrics)}
    if trace is not None:
        final["trace"] = trace
    writer.write_metadata(pa.py_buffer(protocol.encode_json(final)))


def _run(
    run_stage: Any, stage: bytes, schema: pa.Schema, batches: list[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """Execute a stage; a plan this device cannot decode or run becomes PlanNotSupported."""
    try:
        yield from run_stage(stage, schema, batches)
    except Exception as error:
        if getattr(error, "code", None) not in (None, "error", PlanNotSupported.code):
            raise
        raise PlanNotSupported(f"this device cannot run the sub-plan: {error}") from None


class Parked:
    """Filter-stage results a device computed during a query, kept for the host to fetch.

    Bounded in bytes; when full, nothing more is parked and a fetch recomputes the filter.
    """

    def __init__(self, bytes_max: int = PARKED_BYTES_MAX, idle_s_max: float = 120.0):
        self.bytes_max = bytes_max
        self.idle_s_max = idle_s_max
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, int, int], tuple[list[pa.RecordBatch], int, float]] = {}
        self._bytes = 0

    def put(self, key: tuple[str, int, int], batches: list[pa.RecordBatch]) -> bool:
        size = sum(b.nbytes for b in batches)
        now = time.monotonic()
        with self._lock:
            for stale in [k for k, (_, _, t) in self._entries.items() if now - t > self.idle_s_max]:
                self._bytes -= self._entries.pop(stale)[1]
            if self._bytes + size > self.bytes_max:
                return False
            self._entries[key] = (batches, size, now)
            self._bytes += size
            return True

    def take(self, key: tuple[str, int, int]) -> list[pa.RecordBatch] | None:
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is None:
                return None
            self._bytes -= entry[1]
            return entry[0]


def _filter_now(
    store: KeyValueStore,
    emulator: Emulator,
    meta: PartitionMeta,
    numbers: list[int],
    stage: bytes,
    header: dict[str, Any],
    adaptive: Adaptive | None,
    metrics: Metrics,
    parked: Parked | None,
) -> None:
    from quarry.plan.stage import run_stage

    raw_schema = schema_from_text(header["raw_schema"]) if header.get("raw_schema") else None
    stored = 0
    for number in numbers:
        emulator.read(meta.slices[number].bytes_stored)
        stored += meta.slices[number].bytes_stored
    drive_s = 0.0
    outputs: dict[int, list[pa.RecordBatch]] = {}
    for number in numbers:
        batch = partitions.read_slice(store, meta, number)
        metrics.rows_read += batch.num_rows
        outputs[number], seconds = emulator.run_timed(
            lambda b=batch: [
                conform(out, raw_schema) if raw_schema is not None else out
                for out in _run(run_stage, stage, meta.schema, [b])
                if out.num_rows
            ]
        )
        drive_s += seconds
    metrics.bytes_read += stored
    metrics.slices_scanned += len(numbers)
    filtered = sum(pa.ipc.get_record_batch_size(b) for bs in outputs.values() for b in bs)
    if adaptive is not None:
        adaptive.observe(
            "filter", stored, filtered, drive_s + filtered / adaptive.host.link_bytes_per_s
        )
    if parked is not None and header.get("query_id"):
        for number, batches in outputs.items():
            if not parked.put((header["query_id"], int(header["partition"]), number), batches):
                break


def _decide(
    forced: ForcedDecisions,
    adaptive: Adaptive | None,
    number: int,
    slice_bytes: int = 0,
    remaining_bytes: int = 0,
) -> tuple[str, str, float | None]:
    stage = forced.stage_for(number)
    if stage is not None:
        return stage, "forced by the request", None
    if adaptive is not None:
        return adaptive.stage_for(number, slice_bytes, remaining_bytes)
    return "full", "executed: the host asked for the whole sub-plan", None


def scan_stage(
    store: KeyValueStore,
    emulator: Emulator,
    header: dict[str, Any],
    payload: bytes,
    parked: Parked | None = None,
) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """Slices a device pushed back, fetched by the host: raw columns, or after the filter."""
    from quarry.plan.stage import run_stage

    meta = partitions.read_meta(
        store, header["domain"], header["dataset"], int(header["partition"])
    )
    schema = schema_from_text(header["schema"])
    numbers = [n for a, b in header["slices"] for n in range(a, b)]
    assert all(0 <= n < len(meta.slices) for n in numbers), "slice out of range"

    def batches() -> Iterator[pa.RecordBatch]:
        for number in numbers:
            ready = None
            if payload and parked is not None and header.get("query_id"):
                ready = parked.take((header["query_id"], int(header["partition"]), number))
            if ready is not None:  # filtered during the query: ship what was parked
                for out in ready:
                    emulator.ship(pa.ipc.get_record_batch_size(out))
                    yield out
                continue
            emulator.read(meta.slices[number].bytes_stored)
            batch = partitions.read_slice(store, meta, number)
            if payload:
                outputs = emulator.run(
                    lambda b=batch: [
                        conform(out, schema)
                        for out in _run(run_stage, payload, meta.schema, [b])
                        if out.num_rows
                    ]
                )
            else:
                outputs = [batch.select(schema.names)]
            for out in outputs:
                emulator.ship(pa.ipc.get_record_batch_size(out))
                yield out

    return schema, batches()
