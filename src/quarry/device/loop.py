"""The one device loop, for every kind of work: prune → decide → execute → stream → push back →
annotate (DESIGN §3, Skytether §4-5).

For each partition of a ``WorkRequest`` the loop skips what the unit need not run (zone maps, a
cache), then walks the remaining slices in order. Per range it decides a stage (forced by the
request, or the controller's choice from measured drive time), runs it, streams the output
through the drive's external link, and records the decision with its reason. Ranges it declines
are announced at once (``PushedBack``) so the host fetches them while the device goes on; the
last message (``WorkDone``) carries every decision and the metrics, each slice counted once.

Every range declined says why (``PushBack``), counted per reason: the request forced it, the
controller found the drive busy or slow, or a stage failed here. A chunk whose stage fails for
the device's own reasons (``declined_by``) is handed back instead of failing the query, and the
rest of the request follows it: a plan the device cannot run (``capability``), or a shape now in
quarantine (``device.quarantine``). A request whose shape is in quarantine already hands every
range back before reading one.
"""

from __future__ import annotations

import functools
import resource
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import pyarrow as pa
from pyarrow import flight

from quarry import threads, tracing
from quarry.device import faults
from quarry.device.admission import SMALL_BYTES_MAX, Admission
from quarry.device.column_cache import ColumnCache
from quarry.device.controller import (  # pushed-back slices go in groups: the host starts early
    PUSHBACK_NOTICE_SLICES,
    Adaptive,
    Annotation,
    Controllers,
    Decided,
)
from quarry.device.emulation import Emulator
from quarry.device.parked import Parked
from quarry.device.quarantine import Quarantine
from quarry.device.unit import (
    Chunk,
    Skipped,
    Unit,
    UnitContext,
    UnitError,
    conform,
    host_cores,
    lookup,
)
from quarry.errors import PlanNotSupported, StageFailed
from quarry.lazy import cached_property
from quarry.protocol.control import LoadStatus, QuarantineCause
from quarry.protocol.counters import WorkCounters, pushed_back
from quarry.protocol.stage import PushBack, Skip, Stage
from quarry.protocol.work import (
    REASON_CHARS_MAX,
    ChunkDone,
    Decision,
    PartitionReport,
    PushedBack,
    SliceRange,
    SliceRequest,
    TraceEntry,
    WorkDone,
    WorkMetrics,
    WorkRequest,
    WorkTimes,
    ranges_of,
)
from quarry.store import partition as partitions
from quarry.store import stored
from quarry.store.kv import KeyValueStore
from quarry.store.partition import PartitionMeta
from quarry.tally import Tally

# Reads of the next chunk while the unit computes this one: one chunk ahead per partition run,
# on threads shared by every request (a bounded pool: a busy device queues its read-aheads).
READ_AHEAD_THREADS_MAX = 8
_READ_AHEAD = ThreadPoolExecutor(READ_AHEAD_THREADS_MAX, thread_name_prefix="quarry-read-ahead")
CHUNKS_AT_ONCE_MAX = 8  # a request's chunks run at once, at most one per drive core
TRACE_ENTRIES_MAX = 100_000  # per-chunk timings kept when a request asks for a trace
METAS_KEPT_MAX = 1024  # partitions' metadata kept between requests (``Metas``)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Metas:
    """Partition metadata as last read, kept while the store sees no write: every request
    reads its partitions' metadata first, and decoding it costs more than a small chunk's
    read. Bounded; only read, never changed, by those who take it."""

    def __init__(self, entries_max: int = METAS_KEPT_MAX) -> None:
        self.entries_max = entries_max
        self._kept: OrderedDict[tuple[str, str, int], tuple[int, PartitionMeta]] = OrderedDict()
        self._lock = threading.Lock()

    def read(
        self, store: KeyValueStore, domain: str, dataset: str, partition: int
    ) -> PartitionMeta:
        key, writes = (domain, dataset, partition), store.writes()
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None and kept[0] == writes:
                self._kept.move_to_end(key)
                return kept[1]
        meta = partitions.read_meta(store, domain, dataset, partition)
        if writes % 2 == 0 and store.writes() == writes:  # no write began or was under way
            with self._lock:
                self._kept[key] = (writes, meta)
                while len(self._kept) > self.entries_max:
                    self._kept.popitem(last=False)
        return meta


@dataclass
class Runtime:
    """What a device lends every unit of work it runs."""

    store: KeyValueStore
    emulator: Emulator
    device: str
    admission: Admission
    controllers: Controllers = field(default_factory=Controllers)
    parked: Parked = field(default_factory=Parked)
    metas: Metas = field(default_factory=Metas)
    # told of every WorkDone sent (the device's metrics count what its callers were told)
    on_work_done: Callable[[WorkDone], None] | None = None
    # the sub-plan shapes it declines (None: it keeps none, and quarantines nothing)
    quarantine: Quarantine | None = None
    cache: ColumnCache | None = None  # decoded columns kept in its memory (None: none)


def declined_by(error: Exception) -> PushBack | None:
    """Why a chunk whose stage raised ``error`` goes back to the host rather than failing the
    query (None: the error is the query's, or a bug: it stands)."""
    if isinstance(error, PlanNotSupported):
        return PushBack.CAPABILITY
    if isinstance(error, StageFailed):
        return PushBack.MEMORY if error.memory else PushBack.FAILED_STAGE
    if isinstance(error, MemoryError):
        return PushBack.MEMORY
    return None


class Declines:
    """Why the rest of a request goes back, once it is known: its shape is in quarantine here
    (before it began, or since a stage of it failed), or the device cannot run its plan.
    Shared by the request's partitions; set from whichever thread ran the chunk that failed."""

    def __init__(self) -> None:
        self.rest: tuple[PushBack, str] | None = None  # why, and the reason in words


class Stream:
    """The exchange's writer, with the drive's external link in front of it. Output computed
    and waiting for the link counts as the device's queued bytes (``Admission``)."""

    def __init__(
        self, writer: flight.MetadataRecordBatchWriter, emulator: Emulator, admission: Admission
    ):
        self.writer = writer
        self.emulator = emulator
        self.admission = admission
        self._lock = threading.Lock()  # partitions run at once write one stream

    def batches(self, batches: list[pa.RecordBatch], schema: pa.Schema, metrics: Counters) -> int:
        with metrics.ship.timing():
            return self._batches(batches, schema, metrics)

    def _batches(self, batches: list[pa.RecordBatch], schema: pa.Schema, metrics: Counters) -> int:
        queued = sum(batch.nbytes for batch in batches)
        self.admission.queue(queued)
        shipped = 0
        try:
            for batch in batches:
                if not batch.num_rows:
                    continue
                size = pa.ipc.get_record_batch_size(batch)
                self.emulator.ship(size)
                with self._lock:
                    self.writer.write_batch(conform(batch, schema))
                self.admission.unqueue(batch.nbytes)
                queued -= batch.nbytes
                shipped += size
                metrics.count(rows_shipped=batch.num_rows)
        finally:
            self.admission.unqueue(queued)
        metrics.count(bytes_shipped=shipped)
        return shipped

    def message(self, message: PushedBack | ChunkDone | WorkDone) -> None:
        with self._lock:
            self.writer.write_metadata(pa.py_buffer(message.encode()))


@dataclass
class Counters:
    """WorkMetrics while they are counted: the work counters (the one declaration,
    ``WorkCounters``, added to as the work goes) and where the time went (``WorkTimes``)."""

    counted: WorkCounters = WorkCounters()
    read: Tally = field(default_factory=Tally)
    decode: Tally = field(default_factory=Tally)
    execute: Tally = field(default_factory=Tally)
    ship: Tally = field(default_factory=Tally)

    def count(self, **counts: float) -> None:
        """Add to counters by name (a name not declared fails here)."""
        counted = self.counted
        self.counted = replace(counted, **{k: getattr(counted, k) + v for k, v in counts.items()})

    def push_back(self, why: PushBack, slices: int) -> None:
        """Slices pushed back, counted in the total and under their reason."""
        self.counted = self.counted.plus(pushed_back(why, slices))

    def add_read(self, chunk: Chunk) -> None:
        self.count(
            slices_scanned=len(chunk.numbers),
            slices_verified=chunk.verified,
            rows_read=chunk.rows_read,
            bytes_read=chunk.bytes_read,
            bytes_cached=chunk.bytes_cached,
        )
        self.read.add(chunk.read_time)
        self.decode.add(chunk.decode_time)

    def add(self, other: Counters) -> None:
        """Another count of the same partition's work (a chunk counted on its own thread)."""
        self.counted = self.counted.plus(other.counted)
        self.read.add(other.read)
        self.decode.add(other.decode)
        self.execute.add(other.execute)
        self.ship.add(other.ship)

    def add_computed(self, before: Tally, after: Tally) -> None:
        """The unit's compute on this thread between two readings of ``computed_here``."""
        self.execute.wall_s += after.wall_s - before.wall_s
        self.execute.cpu_s += after.cpu_s - before.cpu_s

    def frozen(self, cpu_s: float, wall_s: float) -> WorkMetrics:
        """The partition's metrics: its share of the device's CPU (``cpu_s``) is counted here,
        once, rather than chunk by chunk."""
        times = WorkTimes(
            read_s=self.read.wall_s,
            read_cpu_s=self.read.cpu_s,
            decode_s=self.decode.wall_s,
            decode_cpu_s=self.decode.cpu_s,
            execute_s=self.execute.wall_s,
            execute_cpu_s=self.execute.cpu_s,
            ship_s=self.ship.wall_s,
            ship_cpu_s=self.ship.cpu_s,
        )
        counted = replace(self.counted, device_cpu_s=cpu_s)
        return WorkMetrics(counted, wall_s=wall_s, times=times)


class ChunkSlots:
    """A request's chunks on the drive's cores at once, each on a kept thread.

    Partitions are where data lives; cores are how much of it a drive works on at once. A
    request's chunks, of every partition it names, share ``width`` slots (the drive's cores):
    a drive with one partition of a dataset uses every core, and a request over many small
    partitions does not pay a thread per partition. The deciding thread waits for a free slot
    before it hands a chunk over, so it decides at most ``width`` chunks ahead of what it has
    measured, and the drive holds at most ``width`` chunks' rows at once. The first error of a
    chunk is raised to the decider at its next hand-over, or by ``wait``.
    """

    def __init__(self, width: int) -> None:
        assert width >= 1
        self.width = width
        self._free = threading.Semaphore(width)
        self._running: list[Future[None]] = []

    def run(self, work: Callable[[], None], last: bool = False) -> None:
        """Run ``work`` in a slot once one is free. The request's ``last`` chunk runs on the
        deciding thread, which has nothing left to decide (a request of one chunk, the common
        small one, then hands nothing to another thread)."""
        self._free.acquire()
        self._running = [f for f in self._running if not f.done() or f.exception() is not None]
        failed = next((f for f in self._running if f.done()), None)
        if failed is not None:
            self._free.release()
            failed.result()
        if last:
            self._released(work)
            return
        self._running.append(threads.submit(self._released, work, name="quarry-chunk"))

    def _released(self, work: Callable[[], None]) -> None:
        try:
            work()
        finally:
            self._free.release()

    def wait(self) -> None:
        """Every chunk handed over has run (none is left writing to the stream); the first
        error of any is raised."""
        for future in self._running:
            future.exception()
        for future in self._running:
            future.result()


class PartitionRun:
    """One partition of a work request, from its metadata to its report."""

    def __init__(
        self,
        runtime: Runtime,
        request: WorkRequest,
        partition: int,
        unit: Unit,
        declines: Declines | None = None,
        span: tracing.Span = tracing.NO_SPAN,
    ):
        self.runtime = runtime
        self.span = span  # the exchange's: each stage it runs and range it hands back a child
        self.request = request
        self.unit = unit
        self.declines = declines if declines is not None else Declines()
        self.meta: PartitionMeta = runtime.metas.read(
            runtime.store, request.domain, request.dataset, partition
        )
        self.forced = _forced(request, self.meta)
        self.counters = Counters(WorkCounters(slices_total=len(self.meta.slices)))
        self.annotation = Annotation()
        elsewhere = _elsewhere(request, self.meta)
        skipped_numbers: set[int] = set()
        for skipped in elsewhere:
            self.annotation.record(
                Decision(skipped.range.first, skipped.range.end, skipped.skip, skipped.reason)
            )
            skipped_numbers.update(skipped.range.numbers())
            self.counters.count(slices_elsewhere=len(skipped.range))
        not_here = frozenset(self.forced) | frozenset(skipped_numbers)
        self.answered: list[SliceRange] = []
        for skipped in unit.plan(self.meta, not_here):
            self.annotation.record(
                Decision(skipped.range.first, skipped.range.end, skipped.skip, skipped.reason)
            )
            skipped_numbers.update(skipped.range.numbers())
            if skipped.skip is Skip.PRUNED:
                self.counters.count(slices_pruned=len(skipped.range))
            elif skipped.skip is Skip.ANSWERED:
                self.counters.count(slices_answered=len(skipped.range))
                self.answered.append(skipped.range)
            else:
                self.counters.count(slices_cached=len(skipped.range))
        self.candidates = [n for n in range(len(self.meta.slices)) if n not in skipped_numbers]
        self.pushed: list[int] = []
        self.pushed_stage = Stage.RAW
        self.started = time.perf_counter()
        self._ahead: tuple[list[int], Future[Chunk]] | None = None
        self._counting = threading.Lock()  # chunks run at once add their counts one at a time
        # the annotation and the ranges going back: the decider's, and a failed chunk's thread's
        self._deciding = threading.RLock()

    @property
    def partition(self) -> int:
        return self.meta.partition

    def candidate_bytes(self) -> int:
        """Stored bytes of the slices left to run once pruning and caches have had their say."""
        return sum(self.meta.slices[n].bytes_stored for n in self.candidates)

    # ---- the loop ------------------------------------------------------------------------------

    def run(
        self,
        controller: Adaptive | None,
        stream: Stream,
        trace: list[TraceEntry] | None,
        slots: ChunkSlots | None = None,
        last: bool = False,
    ) -> None:
        """Decide every range, run the chunks (here, one read ahead; or in ``slots``, on the
        drive's cores at once) and announce what goes back. With ``slots``, chunks may still
        be running when this returns: ``slots.wait`` says when they are done."""
        # stored bytes of every candidate slice from each position on: the work left
        remaining = [0] * (len(self.candidates) + 1)
        for index in range(len(self.candidates) - 1, -1, -1):
            remaining[index] = (
                remaining[index + 1] + self.meta.slices[self.candidates[index]].bytes_stored
            )
        self._answer(stream)
        position = 0
        while position < len(self.candidates):
            first = self.candidates[position]
            decided = self._decide(controller, first, remaining[position])
            stage = decided.stage
            numbers = self._chunk(position, stage, controller)
            position += len(numbers)
            if stage is Stage.FULL:
                with self._deciding:
                    self.annotation.record(
                        Decision(numbers[0], numbers[-1] + 1, Stage.FULL, decided.reason)
                    )
                if slots is None:
                    chunk = self._new_chunk(numbers)
                    self._read_ahead(position, controller)
                    self._execute(chunk, controller, stream, trace)
                else:
                    chunk = self._fresh_chunk(numbers)
                    work = functools.partial(self._execute, chunk, controller, stream, trace)
                    final = last and position >= len(self.candidates)
                    if final:  # the host may fetch what went back while this one runs
                        self.flush(stream)
                    slots.run(work, last=final)
            else:
                self._push_back(numbers, decided, controller, stream)
        self._drop_ahead()
        self.flush(stream)

    def _answer(self, stream: Stream) -> None:
        """Ranges the unit answers without reading them (``Skip.ANSWERED``): their output, each
        marked done like a chunk it ran."""
        for answered in self.answered:
            outputs = _computed(
                self.unit.context, self.counters, lambda r=answered: self.unit.answer(self.meta, r)
            )
            stream.batches(outputs, self.unit.output_schema, self.counters)
            if self.unit.RESUMABLE:
                with self.counters.ship.timing():
                    stream.message(ChunkDone(self.partition, answered.first, answered.end))

    def _read_ahead(self, position: int, controller: Adaptive | None) -> None:
        """Start reading the chunk that comes next if it runs whole as this one did; the drive's
        decision for it is still its own (a chunk read ahead and then pushed back is dropped)."""
        if position >= len(self.candidates):
            return
        if self.forced.get(self.candidates[position], Stage.FULL) is not Stage.FULL:
            return
        numbers = self._chunk(position, Stage.FULL, controller)
        self._ahead = (numbers, _READ_AHEAD.submit(self._fresh_chunk(numbers).load))

    def _drop_ahead(self) -> None:
        if self._ahead is not None:
            self._ahead[1].exception()  # wait: no read outlives its run; its error is moot
            self._ahead = None

    def _decide(self, controller: Adaptive | None, number: int, remaining_bytes: int) -> Decided:
        declined = self.declines.rest
        stage = self.forced.get(number)
        if declined is not None:  # nothing more of this request runs here
            decided = Decided(Stage.RAW, declined[1], None, declined[0])
        elif stage is not None:
            why = None if stage is Stage.FULL else PushBack.FORCED
            decided = Decided(stage, "forced by the request", None, why)
        elif controller is not None:
            slice_bytes = self.meta.slices[number].bytes_stored
            decided = controller.stage_for(number, slice_bytes, remaining_bytes)
        else:
            decided = Decided(
                Stage.FULL, "executed: the host asked for the whole sub-plan", None, None
            )
        if decided.stage is Stage.FILTER and Stage.FILTER not in self.unit.STAGES:
            # a unit without a filter stage pushes back raw rather than half-running
            return decided._replace(stage=Stage.RAW)
        return decided

    def _chunk(self, position: int, stage: Stage, controller: Adaptive | None) -> list[int]:
        """Contiguous slices with the same decision, run together."""
        first = self.candidates[position]
        if stage is not Stage.FULL or (controller is not None and controller.probing):
            return [first]
        limit, most = self._chunk_limit, self._chunk_limit * 3 // 2
        if self.request.chunk_slices is not None:  # the caller's bound, kept to the slice
            limit = most = max(1, min(limit, self.request.chunk_slices))
        run = self._run_length(position, most + 1)
        # A remainder under half a chunk joins the chunk before it: an engine run costs a few
        # ms whatever its size (TPC-H SF 1 lineitem in 16 partitions of 17 slices: 16 runs of
        # 17 slices, not 32 of 16 and 1).
        size = run if run <= most else limit
        return list(range(first, first + size))

    def _run_length(self, position: int, most: int) -> int:
        """How many contiguous candidates from ``position`` on run whole (at most ``most``)."""
        count = 1
        while (
            count < most
            and position + count < len(self.candidates)
            and self.candidates[position + count] == self.candidates[position] + count
            and self.forced.get(self.candidates[position] + count, Stage.FULL) is Stage.FULL
        ):
            count += 1
        return count

    @cached_property
    def _chunk_limit(self) -> int:
        return self.unit.chunk_slices(self.meta) or len(self.meta.slices)

    def _new_chunk(self, numbers: list[int]) -> Chunk:
        """The chunk of these slices: the one read ahead if it is that, a fresh one otherwise."""
        if self._ahead is not None and self._ahead[0] == numbers:
            future, self._ahead = self._ahead[1], None
            return future.result()
        self._drop_ahead()
        return self._fresh_chunk(numbers)

    def _fresh_chunk(self, numbers: list[int]) -> Chunk:
        meta, unit = self.meta, self.unit
        return Chunk(
            meta,
            numbers,
            self.runtime.store,
            self.runtime.emulator,
            unit.columns(),
            rows_of=lambda number: unit.slice_rows(meta, number),
            cache=self.runtime.cache,
            cache_admits=self._cache_admits,
        )

    @cached_property
    def _cache_admits(self) -> bool:
        """Whether the columns this run reads may enter the device's column cache: not for a
        request that reads more than half of it (a scan larger than the cache would push out
        what fits, and copy every column on its way in for nothing: TPC-H SF 10's lineitem)."""
        cache = self.runtime.cache
        if cache is None or not cache.capacity_bytes:
            return False
        columns = self.unit.columns()
        sizes = partitions.whole_read_bytes(self.meta, columns)
        read = sum(sizes[n] for n in self.candidates)
        return read * len(self.request.partitions) <= cache.capacity_bytes // 2

    def _execute(
        self,
        chunk: Chunk,
        controller: Adaptive | None,
        stream: Stream,
        trace: list[TraceEntry] | None,
    ) -> None:
        """Run one chunk and stream its output (on any thread: it is counted on its own and
        added to the partition's counts once done)."""
        numbers = chunk.numbers
        context = self.unit.context
        span = self._stage_span(Stage.FULL, numbers)
        started, drive_before = time.perf_counter(), context.drive_s_here
        computed_before = context.computed_here
        try:
            faults.stage(self.runtime.device)
            outputs = list(self.unit.execute(chunk))
        except Exception as error:
            why = declined_by(error)
            if why is None or Stage.RAW not in self.unit.STAGES:
                raise
            span.end(error)  # the range goes back: its push-back follows
            self._failed(chunk, why, error, stream)
            return
        self._timed(time.perf_counter() - started)
        drive_s = context.drive_s_here - drive_before
        counted = Counters()
        counted.add_computed(computed_before, context.computed_here)
        shipped = stream.batches(outputs, self.unit.output_schema, counted)
        if self.unit.RESUMABLE:  # everything this range yields is out: the host may count it
            with counted.ship.timing():
                stream.message(ChunkDone(self.partition, numbers[0], numbers[-1] + 1))
        span.set(bytes_read=chunk.bytes_read, bytes_shipped=shipped)
        span.end()  # a stage that failed is told by the exchange's span, which it ends
        counted.add_read(chunk)
        counted.count(slices_executed=len(numbers), drive_s=drive_s)
        with self._counting:
            self.counters.add(counted)
        if controller is not None:
            # the drive's own time: emulated compute, and shipping at its link's rate
            link_s = shipped / controller.host.link_bytes_per_s
            controller.observe(Stage.FULL, chunk.bytes_stored, shipped, drive_s + link_s)
        if trace is not None and len(trace) < TRACE_ENTRIES_MAX:
            trace.append(
                TraceEntry(
                    self.partition,
                    numbers[0],
                    numbers[-1] + 1,
                    time.perf_counter() - started,
                    drive_s,
                    chunk.bytes_stored,
                    shipped,
                )
            )

    def _stage_span(self, stage: Stage, numbers: list[int]) -> tracing.Span:
        return self.span.child(
            "stage",
            process=self.runtime.device,
            stage=str(stage),
            partition=self.partition,
            first=numbers[0],
            end=numbers[-1] + 1,
        )

    def _failed(self, chunk: Chunk, why: PushBack, error: Exception, stream: Stream) -> None:
        """A chunk whose stage failed for the device's own reasons goes back raw, recorded in
        place of the run it was to be; the rest of the request follows it when the plan cannot
        run here (``capability``) or its shape is quarantined now. Its read is not counted: the
        host reads the range again when it fetches it, and counts it there, once."""
        reason = f"{why}: {error}"[:REASON_CHARS_MAX]
        decided = Decided(Stage.RAW, reason, None, why)
        self._push_back(chunk.numbers, decided, None, stream, revise=True)
        if why is PushBack.CAPABILITY:
            self.declines.rest = (why, reason)
        elif why is PushBack.FAILED_STAGE:
            self._quarantine(QuarantineCause.FAILED_STAGE, str(error))

    def _timed(self, stage_s: float) -> None:
        """A chunk's stage that ran past the device's limit: its output stands, and its shape
        is quarantined for what is left and for the next requests."""
        quarantine = self.runtime.quarantine
        if quarantine is None or stage_s <= quarantine.stage_s_max:
            return
        if Stage.RAW in self.unit.STAGES:
            detail = f"a chunk's stage ran {stage_s:.1f} s, over {quarantine.stage_s_max:g} s"
            self._quarantine(QuarantineCause.TIME_LIMIT, detail)

    def _quarantine(self, cause: QuarantineCause, detail: str) -> None:
        """The request's shape in quarantine here (once: chunks at once may fail together)."""
        quarantine, declined = self.runtime.quarantine, self.declines.rest
        if quarantine is None or (declined is not None and declined[0] is PushBack.QUARANTINE):
            return
        shape = self.unit.shape()
        if shape is None:
            return
        request = self.request
        entry = quarantine.enter(
            f"{request.domain}/{request.dataset}", request.unit, shape, cause, detail
        )
        self.declines.rest = (PushBack.QUARANTINE, quarantined(entry.shape, cause, detail))

    def _push_back(
        self,
        numbers: list[int],
        decided: Decided,
        controller: Adaptive | None,
        stream: Stream,
        revise: bool = False,
    ) -> None:
        """Hand ``numbers`` back at ``decided.stage``; ``revise``: in place of the decision
        recorded for them already."""
        if Stage.RAW not in self.unit.STAGES:
            raise UnitError(f"unit {self.unit.NAME} cannot push back: it runs whole partitions")
        stage, why = decided.stage, decided.pushed_back
        assert why is not None, f"slices {numbers} pushed back without a reason"
        decision = Decision(
            numbers[0], numbers[-1] + 1, stage, decided.reason, decided.retry_after_s, why
        )
        with self._deciding:
            if self.pushed and (
                self.pushed_stage is not stage or len(self.pushed) >= PUSHBACK_NOTICE_SLICES
            ):
                self.flush(stream)
            if stage is Stage.FILTER:
                self._filter_now(numbers, controller)
            self.pushed_stage = stage
            self.pushed.extend(numbers)
            with self._counting:
                self.counters.push_back(why, len(numbers))
            if revise:
                self.annotation.revise(decision)
            else:
                self.annotation.record(decision)

    def _filter_now(self, numbers: list[int], controller: Adaptive | None) -> None:
        """The device filters now, timed like any work it does, and parks the rows for the host
        to fetch with the rest of the range (the read is counted here, once)."""
        chunk = self._new_chunk(numbers)
        drive_before = self.unit.context.drive_s_here
        computed_before = self.unit.context.computed_here
        with self._stage_span(Stage.FILTER, numbers):
            outputs = self.unit.filter(chunk)
        drive_s = self.unit.context.drive_s_here - drive_before
        counted = Counters(WorkCounters(drive_s=drive_s))
        counted.add_computed(computed_before, self.unit.context.computed_here)
        counted.add_read(chunk)
        with self._counting:  # chunks of this partition may still be running
            self.counters.add(counted)
        filtered = sum(pa.ipc.get_record_batch_size(b) for bs in outputs.values() for b in bs)
        if controller is not None:
            link_s = filtered / controller.host.link_bytes_per_s
            controller.observe(Stage.FILTER, chunk.bytes_stored, filtered, drive_s + link_s)
        if self.request.query_id:
            for number, batches in outputs.items():
                key = (self.request.query_id, self.partition, number)
                if not self.runtime.parked.put(key, batches):
                    break

    def flush(self, stream: Stream) -> None:
        """Announce the ranges declined and not yet announced (``PushedBack``)."""
        with self._deciding:
            self._flush(stream)

    def _flush(self, stream: Stream) -> None:
        if not self.pushed:
            return
        raw = self.pushed_stage is Stage.RAW
        # Raw ranges are read when the host fetches them; it accounts them with these figures.
        # Filtered ranges were read above and are counted already.
        notice = PushedBack(
            partition=self.partition,
            ranges=tuple(ranges_of(self.pushed)),
            stage=self.pushed_stage,
            rows=sum(self.meta.slices[n].rows for n in self.pushed) if raw else 0,
            bytes_stored=sum(self.meta.slices[n].bytes_stored for n in self.pushed) if raw else 0,
        )
        self.span.child(
            "push_back",
            process=self.runtime.device,
            stage=str(notice.stage),
            partition=notice.partition,
            slices=notice.slices,
        ).end()
        stream.message(notice)
        self.pushed = []

    def report(self, cpu_s: float) -> PartitionReport:
        wall_s = time.perf_counter() - self.started
        counted = self.counters.counted
        # paired with the count of each push back: every slice under one reason
        assert sum(counted.pushed_back_by().values()) == counted.slices_pushed_back, counted
        return PartitionReport(
            self.partition, tuple(self.annotation.decisions), self.counters.frozen(cpu_s, wall_s)
        )


def quarantined(shape: str, cause: QuarantineCause, detail: str) -> str:
    """A decline for quarantine, in words."""
    return f"quarantine: sub-plan {shape} quarantined here ({cause}: {detail})"[:REASON_CHARS_MAX]


def _elsewhere(request: WorkRequest, meta: PartitionMeta) -> list[Skipped]:
    """Ranges of this partition another replica finished before it stopped answering."""
    return [
        Skipped(
            SliceRange(r.first, min(r.end, len(meta.slices))),
            Skip.ELSEWHERE,
            "done by another replica before it stopped answering",
        )
        for r in request.elsewhere
        if r.partition == meta.partition and r.first < min(r.end, len(meta.slices))
    ]


def _forced(request: WorkRequest, meta: PartitionMeta) -> dict[int, Stage]:
    forced: dict[int, Stage] = {}
    for decision in request.forced:
        if decision.partition != meta.partition:
            continue
        for number in range(decision.first, min(decision.end, len(meta.slices))):
            forced[number] = decision.stage
    return forced


def _controller(runtime: Runtime, request: WorkRequest) -> Adaptive | None:
    """One controller per query fragment on this device, shared by its partitions, so what one
    partition measured informs the others."""
    if request.host is None:
        return None

    def create() -> Adaptive:
        return Adaptive(request.policy, request.host, runtime.emulator.load)

    if request.query_id:
        return runtime.controllers.get(request.query_id, create)
    return create()


def run_work(
    runtime: Runtime,
    request: WorkRequest,
    payload: bytes,
    writer: flight.MetadataRecordBatchWriter,
    span: tracing.Span = tracing.NO_SPAN,
) -> None:
    """Run a work request; stream its output, its push-back notices, then ``WorkDone``
    (under ``span``, the exchange's: a span for each stage run and each range handed back)."""
    started, cpu_started = time.perf_counter(), cpu_seconds()
    context = UnitContext(runtime.store, runtime.emulator, runtime.device)
    unit = lookup(request.unit)(request, payload, context)
    declines = _declines(runtime, request, unit)
    runs = [
        PartitionRun(runtime, request, partition, unit, declines, span)
        for partition in request.partitions
    ]
    # Admitted (or refused as busy) once pruning says how much is left to read, before a byte
    # of output: a refused request has started nothing the caller must undo.
    small = sum(run.candidate_bytes() for run in runs) <= SMALL_BYTES_MAX
    with runtime.admission.exchange(small):
        writer.begin(unit.output_schema)
        _run_admitted(
            runtime,
            request,
            unit,
            runs,
            Stream(writer, runtime.emulator, runtime.admission),
            started,
            cpu_started,
        )


def _run_admitted(
    runtime: Runtime,
    request: WorkRequest,
    unit: Unit,
    runs: list[PartitionRun],
    stream: Stream,
    started: float,
    cpu_started: float,
) -> None:
    context = unit.context
    if unit.payload_needed():
        # Not an error: the host asked first without its payload, hoping nothing needs it.
        stream.message(WorkDone((), unit.summary(), None, True, time.perf_counter() - started))
        return
    controller = _controller(runtime, request)
    trace: list[TraceEntry] | None = [] if request.trace else None

    def finished(run: PartitionRun) -> None:
        stream.batches(
            _computed(context, run.counters, lambda: unit.finish_partition(run.meta)),
            unit.output_schema,
            run.counters,
        )

    at_once = _chunks_at_once(runtime, unit)
    if at_once > 1:
        slots = ChunkSlots(at_once)
        try:
            for number, run in enumerate(runs, 1):
                run.run(controller, stream, trace, slots, last=number == len(runs))
        finally:
            slots.wait()
        for run in runs:
            run.flush(stream)  # chunks that failed in their slots went back
            finished(run)
    else:
        for run in runs:
            run.run(controller, stream, trace)
            finished(run)
    stream.batches(
        _computed(context, runs[-1].counters, unit.finish), unit.output_schema, runs[-1].counters
    )
    cpu_s = cpu_seconds() - cpu_started
    done = WorkDone(
        partitions=tuple(run.report(cpu_s / len(runs)) for run in runs),
        summary=unit.summary(),
        trace=tuple(trace) if trace is not None else None,
        wall_s=time.perf_counter() - started,
        device_cpu_s=cpu_s,
        load=LoadStatus(**runtime.emulator.load()),
    )
    stream.message(done)
    if runtime.on_work_done is not None:
        runtime.on_work_done(done)


def _declines(runtime: Runtime, request: WorkRequest, unit: Unit) -> Declines:
    """What the request meets before it starts: its shape in quarantine here (then every range
    goes back, unread), or nothing yet."""
    declines = Declines()
    quarantine = runtime.quarantine
    if quarantine is None or Stage.RAW not in unit.STAGES:
        return declines
    held = quarantine.holds(f"{request.domain}/{request.dataset}", request.unit, unit.shape)
    if held is not None:
        declines.rest = (PushBack.QUARANTINE, quarantined(held.shape, held.cause, held.detail))
    return declines


def _chunks_at_once(runtime: Runtime, unit: Unit) -> int:
    """A drive's cores each take a chunk of a request when its unit keeps no state across
    chunks: the drive's cores work at once, as its compute factor per core assumes. The
    query's controller is shared by every chunk (and every stream) of the query on the drive,
    and takes their measurements as they come."""
    if not unit.CHUNKS_AT_ONCE:
        return 1
    cores = runtime.emulator.profile.cores or host_cores()
    return max(1, min(cores, CHUNKS_AT_ONCE_MAX))


def _computed(context: UnitContext, counters: Counters, produce) -> list[pa.RecordBatch]:
    drive_before, computed_before = context.drive_s_here, context.computed_here
    outputs = list(produce())
    counters.count(drive_s=context.drive_s_here - drive_before)
    counters.add_computed(computed_before, context.computed_here)
    return outputs


# ---- pushed-back ranges, fetched by the host ----------------------------------------------------


def fetch_slices(
    runtime: Runtime, request: SliceRequest, payload: bytes
) -> tuple[pa.Schema, Iterable[pa.RecordBatch]]:
    """Slices a device pushed back: raw (the unit's raw columns), or after the unit's filter
    (parked during the work when it could be, computed again otherwise)."""
    work = WorkRequest(
        unit=request.unit,
        domain=request.domain,
        dataset=request.dataset,
        partitions=(request.partition,),
        query_id=request.query_id,
        args=request.args,
    )
    context = UnitContext(runtime.store, runtime.emulator, runtime.device)
    unit = lookup(request.unit)(work, payload, context)
    meta = runtime.metas.read(runtime.store, request.domain, request.dataset, request.partition)
    numbers = [n for r in request.ranges for n in r.numbers()]
    if not all(0 <= n < len(meta.slices) for n in numbers):
        raise UnitError(
            f"slices {[(r.first, r.end) for r in request.ranges]} out of range: partition "
            f"{request.partition} has {len(meta.slices)}"
        )
    schema = unit.raw_schema_of(meta)
    if request.stored and request.stage is Stage.RAW and _ships_as_stored(unit, meta, numbers):
        return stored_slices(runtime, meta, numbers, schema.names)

    def batches() -> Iterable[pa.RecordBatch]:
        for number in numbers:
            for batch in _fetch_one(runtime, unit, meta, request, number, schema):
                runtime.emulator.ship(pa.ipc.get_record_batch_size(batch))
                yield batch

    return schema, batches()


def _ships_as_stored(unit: Unit, meta: PartitionMeta, numbers: list[int]) -> bool:
    """A raw range ships as stored when the unit ships raw rows as they are (it adds nothing of
    its own) and every slice has a stream per column (not the first, whole format)."""
    return unit.ships_as_stored() and all(meta.slices[n].columns is not None for n in numbers)


def stored_slices(
    runtime: Runtime, meta: PartitionMeta, numbers: Iterable[int], names: list[str]
) -> tuple[pa.Schema, Iterable[pa.RecordBatch]]:
    """Slices as stored (``quarry.store.stored``): read through the drive's internal link and
    shipped through its external one undecoded; the receiver decompresses."""
    fields = pa.schema([meta.schema.field(n) for n in names], metadata=meta.schema.metadata)
    stream = stored.schema(fields)

    def batches() -> Iterable[pa.RecordBatch]:
        for number in numbers:
            runtime.emulator.read(partitions.read_bytes(meta, number, names))
            read = partitions.read_stored(runtime.store, meta, number, names)
            assert read is not None, "a slice stored whole has no stream per column"
            parts, checksums = read  # checked here, and again where they arrive
            batch = stored.batch(parts, meta.slices[number].rows, stream, checksums)
            runtime.emulator.ship(pa.ipc.get_record_batch_size(batch))
            yield batch

    return stream, batches()


def _fetch_one(
    runtime: Runtime,
    unit: Unit,
    meta: PartitionMeta,
    request: SliceRequest,
    number: int,
    schema: pa.Schema,
) -> list[pa.RecordBatch]:
    chunk = Chunk(
        meta, [number], runtime.store, runtime.emulator, unit.columns(), cache=runtime.cache
    )
    if request.stage is Stage.RAW:
        return [unit.raw_slice(meta, number, batch) for batch in chunk.batches()]
    if request.query_id:
        ready = runtime.parked.take((request.query_id, request.partition, number))
        if ready is not None:  # filtered during the work: ship what was parked
            return ready
    return [conform(b, schema) for b in unit.filter(chunk).get(number, []) if b.num_rows]


__all__ = ["Runtime", "SliceRange", "cpu_seconds", "fetch_slices", "run_work", "stored_slices"]
