"""The device half of differential expression: program `genes.accumulate` (Figure 1, §7).

For each partition of the request the device
1. finds its cached Combine for (dataset version, grouping), if any, and which slices it covers;
2. runs Accumulate on every other slice (inside `ctx.compute`, so a slow drive is slow), or
   pushes a slice back: forced by the request, or decided at run time by the controller of
   `quarry.device.controller` (ActivePy Eq. 1 on measured costs) when the request says "auto";
3. Combines the partition (cache + new partials), stores that in its cache when it covers more
   than before, and reduces it to the statistics of the one or two cell sets the host compares
   (`select_groups`: the group, and the reference or "rest");
4. ships those side statistics (a few dozen bytes per gene), combined over its partitions.

Pushed-back slice ranges are reported in the summary; the host fetches them raw
(`DeviceClient.scan`) and accumulates them itself. A slice is either executed, cached or pushed
back, never two of them, so the host's Combine of everything counts every cell once.

The request header (JSON) and payload:
    domain, dataset, version, ingest_ids   which dataset, and which ingests the host saw
    partitions                             partition numbers this device serves
    grouping, group_count, cell_count      grouping digest and shape
    sides                                  [[group ids of side 0], [group ids of side 1]]
    mode                                   "always" | "auto"
    push_back                              {"partition": [[first, end], ...]} forced (tests)
    host, policy                           HostCost and Policy of the controller ("auto")
    payload                                group id per cell, int32 little-endian, or empty
                                           (then, if anything must be computed, the answer is
                                           empty with summary "grouping_needed": true)
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from quarry.device.controller import Adaptive, Annotation, Decision, HostCost, Policy
from quarry.device.programs import ProgramContext, ProgramResult, register
from quarry.genes.errors import GenesInputError, StaleDataset
from quarry.genes.groups import grouping_digest
from quarry.genes.stats import PARTIAL_SCHEMA, accumulate, combine, select_groups
from quarry.store.partition import PartitionMeta

PROGRAM = "genes.accumulate"
CACHE_FORMAT = b"1"
# Groupings whose statistics a device keeps per dataset version; the oldest-named others go.
CACHED_GROUPINGS_MAX = 64
SIDES_MAX = 2
OUTPUT_ROWS_PER_BATCH = 1 << 16
MODES = ("always", "auto")


@dataclass(frozen=True)
class Request:
    domain: str
    dataset: str
    version: str
    ingest_ids: frozenset[str]
    partitions: tuple[int, ...]
    grouping: str
    group_count: int
    cell_count: int
    sides: tuple[tuple[int, ...], ...]
    mode: str
    push_back: dict[int, list[tuple[int, int]]]
    host: HostCost | None
    policy: Policy

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> Request:
        sides = tuple(tuple(int(g) for g in side) for side in header["sides"])
        group_count = int(header["group_count"])
        if not 1 <= len(sides) <= SIDES_MAX:
            raise GenesInputError(f"{PROGRAM}: 1 or 2 sides, got {len(sides)}")
        if any(not 0 <= g < group_count for side in sides for g in side):
            raise GenesInputError(f"{PROGRAM}: side group ids must be in [0, {group_count})")
        mode = header.get("mode", "always")
        if mode not in MODES:
            raise GenesInputError(f"{PROGRAM}: mode must be one of {MODES}, not {mode!r}")
        push_back = {
            int(partition): [(int(a), int(b)) for a, b in ranges]
            for partition, ranges in (header.get("push_back") or {}).items()
        }
        return cls(
            domain=header["domain"],
            dataset=header["dataset"],
            version=str(header["version"]),
            ingest_ids=frozenset(header["ingest_ids"]),
            partitions=tuple(int(p) for p in header["partitions"]),
            grouping=str(header["grouping"]),
            group_count=group_count,
            cell_count=int(header["cell_count"]),
            sides=sides,
            mode=mode,
            push_back=push_back,
            host=HostCost.from_json(header.get("host")),
            policy=Policy.from_json(header.get("policy")),
        )


@dataclass
class Cached:
    covered: set[int]
    statistics: pa.Table


@dataclass
class PartitionWork:
    partition: int
    meta: PartitionMeta
    forced: set[int]
    usable: Cached | None
    stored: Cached | None  # what the cache holds now (maybe not usable for this request)
    todo: list[int]
    executed: list[int] = field(default_factory=list)
    pushed_back: list[int] = field(default_factory=list)
    annotation: Annotation = field(default_factory=Annotation)


@register(PROGRAM)
def accumulate_program(
    ctx: ProgramContext, header: dict[str, Any], payload: bytes
) -> ProgramResult:
    started = time.perf_counter()
    request = Request.from_header(header)
    works = [_plan_partition(ctx, request, partition) for partition in request.partitions]
    needs_grouping = any(work.todo for work in works)
    group_of_cell = _grouping(request, payload) if payload else None
    if needs_grouping and group_of_cell is None:
        # Not an error: the host asked first without the grouping, hoping for a cache hit.
        # Answer at once, having read nothing but metadata, and let it send the grouping.
        summary = {
            "program": PROGRAM,
            "grouping_needed": True,
            "program_s": time.perf_counter() - started,
        }
        return ProgramResult(PARTIAL_SCHEMA, iter(()), summary)

    adaptive = None
    if request.mode == "auto" and request.host is not None:
        adaptive = Adaptive(request.policy, request.host, ctx.emulator.load)
    compute_s = 0.0
    sides: list[pa.RecordBatch] = []
    for work in works:
        partials: list[pa.RecordBatch | pa.Table] = []
        if work.usable is not None:
            partials.append(work.usable.statistics)
        for number in work.todo:
            stage, reason = _decide(adaptive, number)
            if stage != "full":
                work.pushed_back.append(number)
                work.annotation.record(Decision(number, number + 1, "raw", reason))
                continue
            batch = ctx.read_slice(work.meta, number)
            assert group_of_cell is not None
            compute_started = time.perf_counter()
            partial = ctx.compute(lambda b=batch: accumulate(b, group_of_cell, request.group_count))
            seconds = time.perf_counter() - compute_started
            compute_s += seconds
            if adaptive is not None:
                adaptive.observe(
                    "full", work.meta.slices[number].bytes_stored, partial.nbytes, seconds
                )
            partials.append(partial)
            work.executed.append(number)
            work.annotation.record(Decision(number, number + 1, "full", reason))
        compute_started = time.perf_counter()
        statistics, side_batches = ctx.compute(lambda p=partials: _reduce(p, request.sides))
        compute_s += time.perf_counter() - compute_started
        sides.extend(side_batches)
        _store(ctx, request, work, statistics)

    compute_started = time.perf_counter()
    output = ctx.compute(lambda: combine(sides)) if sides else _empty()
    compute_s += time.perf_counter() - compute_started
    summary = _summary(request, works, compute_s, time.perf_counter() - started)
    return ProgramResult(PARTIAL_SCHEMA, _batches(output), summary)


def _plan_partition(ctx: ProgramContext, request: Request, partition: int) -> PartitionWork:
    meta = ctx.meta(request.domain, request.dataset, partition)
    if meta.ingest["id"] not in request.ingest_ids:
        raise StaleDataset(
            f"{request.domain}/{request.dataset} partition {partition} on this device belongs "
            "to another ingest than the one the host asked about (it was re-ingested); ask again"
        )
    slice_count = len(meta.slices)
    forced = {
        n
        for first, end in request.push_back.get(partition, [])
        for n in range(max(first, 0), min(end, slice_count))
    }
    stored = _load(ctx, request, partition, meta)
    wanted = set(range(slice_count)) - forced
    # A Combine cannot be taken apart: a cache that covers a slice this request pushes back
    # cannot serve it, so the slices are accumulated again (and the cache kept as it is).
    usable = stored if stored is not None and stored.covered <= wanted else None
    covered = usable.covered if usable is not None else set()
    todo = sorted(wanted - covered)
    work = PartitionWork(partition, meta, forced, usable, stored, todo)
    for first, end in _ranges(sorted(forced)):
        work.annotation.record(Decision(first, end, "raw", "forced by the request"))
    work.pushed_back.extend(sorted(forced))
    return work


def _decide(adaptive: Adaptive | None, number: int) -> tuple[str, str]:
    if adaptive is None:
        return "full", "executed: the host asked for the whole sub-plan"
    stage, reason, _ = adaptive.stage_for(number)
    # Accumulate has no filter stage: anything but running it is a push-back of the raw slice.
    return ("full", reason) if stage == "full" else ("raw", reason)


def _reduce(
    partials: list[pa.RecordBatch | pa.Table], sides: tuple[tuple[int, ...], ...]
) -> tuple[pa.RecordBatch, list[pa.RecordBatch]]:
    statistics = combine(partials)
    return statistics, [
        select_groups(statistics, list(ids), as_group=i) for i, ids in enumerate(sides)
    ]


def _grouping(request: Request, payload: bytes) -> np.ndarray:
    group_of_cell = np.frombuffer(payload, dtype="<i4").astype(np.int32)
    if len(group_of_cell) != request.cell_count:
        raise GenesInputError(
            f"{PROGRAM}: the grouping covers {len(group_of_cell)} cells, the request says "
            f"{request.cell_count}"
        )
    if grouping_digest(group_of_cell, request.group_count) != request.grouping:
        # The digest names the cache entry: a payload that does not match would poison it.
        raise GenesInputError(f"{PROGRAM}: the grouping does not match its digest")
    return group_of_cell


# ---- cache ----------------------------------------------------------------------------------


def _cache_key(ctx: ProgramContext, request: Request, partition: int) -> str:
    return ctx.cache_key(
        request.domain,
        request.dataset,
        PROGRAM,
        request.version,
        request.grouping,
        f"{partition:04d}",
    )


def _load(
    ctx: ProgramContext, request: Request, partition: int, meta: PartitionMeta
) -> Cached | None:
    raw = ctx.cache_get(_cache_key(ctx, request, partition))
    if raw is None:
        return None
    table = pa.ipc.open_stream(pa.py_buffer(raw)).read_all()
    metadata = table.schema.metadata or {}
    if (
        metadata.get(b"format") != CACHE_FORMAT
        or metadata.get(b"ingest", b"").decode() != meta.ingest["id"]
    ):
        return None  # written for other data: recompute (the put below replaces it)
    covered = {int(n) for n in json.loads(metadata[b"covered"])}
    if covered and max(covered) >= len(meta.slices):
        return None
    return Cached(covered, table.replace_schema_metadata(None))


def _store(
    ctx: ProgramContext, request: Request, work: PartitionWork, statistics: pa.RecordBatch
) -> None:
    if not work.executed:
        return
    previous = work.usable.covered if work.usable is not None else set()
    covered = previous | set(work.executed)
    if work.stored is not None and not work.stored.covered <= covered:
        return  # the cache covers slices this request did not: keep the larger coverage
    metadata = {
        b"format": CACHE_FORMAT,
        b"ingest": work.meta.ingest["id"].encode(),
        b"covered": json.dumps(sorted(covered)).encode(),
    }
    sink = pa.BufferOutputStream()
    schema = statistics.schema.with_metadata(metadata)
    with pa.ipc.new_stream(sink, schema) as writer:
        writer.write_batch(pa.RecordBatch.from_arrays(statistics.columns, schema=schema))
    _evict(ctx, request)
    ctx.cache_put(_cache_key(ctx, request, work.partition), sink.getvalue().to_pybytes())


def _evict(ctx: ProgramContext, request: Request) -> None:
    """Bound the cache: drop other versions of the dataset, and groupings beyond the limit."""
    base = ctx.cache_key(request.domain, request.dataset, PROGRAM) + "/"
    keys = ctx.store.list(base)
    stale = [k for k in keys if not k.startswith(f"{base}{request.version}/")]
    current = f"{base}{request.version}/"
    groupings = sorted({k[len(current) :].split("/")[0] for k in keys if k.startswith(current)})
    others = [g for g in groupings if g != request.grouping]
    excess = others[: max(0, len(groupings) + 1 - CACHED_GROUPINGS_MAX)]
    doomed = stale + [k for k in keys if any(k.startswith(f"{current}{g}/") for g in excess)]
    if doomed:
        with ctx.store.transaction() as txn:
            for key in doomed:
                txn.delete(key)


# ---- output ---------------------------------------------------------------------------------


def _summary(
    request: Request, works: list[PartitionWork], compute_s: float, program_s: float
) -> dict[str, Any]:
    partitions = {}
    for work in works:
        cached = sorted(work.usable.covered) if work.usable is not None else []
        partitions[str(work.partition)] = {
            "slices": len(work.meta.slices),
            "executed": _ranges(work.executed),
            "pushed_back": _ranges(sorted(work.pushed_back)),
            "cached": _ranges(cached),
            "decisions": work.annotation.to_json(),
        }
    return {
        "program": PROGRAM,
        "partitions": partitions,
        "slices_executed": sum(len(w.executed) for w in works),
        "slices_pushed_back": sum(len(w.pushed_back) for w in works),
        "slices_cached": sum(len(w.usable.covered) for w in works if w.usable is not None),
        "cache_hits": sum(1 for w in works if w.usable is not None and not w.todo),
        "accumulate_s": compute_s,
        "program_s": program_s,
    }


def _ranges(numbers: list[int]) -> list[list[int]]:
    """[1, 2, 3, 7] -> [[1, 4], [7, 8]]"""
    out: list[list[int]] = []
    for number in numbers:
        if out and out[-1][1] == number:
            out[-1][1] = number + 1
        else:
            out.append([number, number + 1])
    return out


def _empty() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=PARTIAL_SCHEMA)


def _batches(output: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
    for start in range(0, max(output.num_rows, 1), OUTPUT_ROWS_PER_BATCH):
        chunk = output.slice(start, OUTPUT_ROWS_PER_BATCH)
        if chunk.num_rows:
            yield pa.RecordBatch.from_arrays(chunk.columns, schema=PARTIAL_SCHEMA)
