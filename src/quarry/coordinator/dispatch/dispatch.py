"""The one host dispatch: work requests out, completed streams back (DESIGN §3, one pipeline).

For every kind of work (SQL fragments, gene statistics, samples ...) the host does the same:
open one work exchange per task, stream the device's output on, fetch each pushed-back range as
soon as it is announced and complete it with the *same unit of work* run on the host, and
collect what each device did into ``WorkReport`` rows. ``pushdown="never"`` is the same path
with every slice read raw; a device that cannot plan the work hands all of it back.

Bounded everywhere: a task's pushed-back ranges are fetched by ``FETCHERS_PER_EXCHANGE``
threads, tasks run on a fixed pool, and the merged output waits in a queue of at most
``queue_items_max`` batches for its reader.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import TypeVar

import pyarrow as pa

from quarry import threads, tracing
from quarry.coordinator.dispatch.failover import DeviceLost, Progress, resume
from quarry.coordinator.dispatch.report import WorkReport
from quarry.coordinator.dispatch.streams import Merged, merge
from quarry.coordinator.membership.device_client import DeviceClient
from quarry.device.unit import Unit
from quarry.errors import CorruptSlice, DeviceUnavailable, PlanNotSupported, ProtocolError
from quarry.protocol.control import LoadStatus
from quarry.protocol.stage import PushBack, Stage
from quarry.protocol.work import ChunkDone, PushedBack, SliceRequest, WorkDone, WorkRequest
from quarry.store import stored
from quarry.tally import Tally

T = TypeVar("T")
log = logging.getLogger("quarry.dispatch")
FETCHERS_PER_EXCHANGE = 2  # concurrent fetches of pushed-back ranges per device stream
PAYLOAD_ROUNDS_MAX = 2  # a unit asks for its payload at most once


@dataclass
class Task:
    """One work exchange: a unit of work on one device, over some of its partitions."""

    client: DeviceClient
    request: WorkRequest
    host: Unit  # the same unit, on the host: completes what the device hands back
    payload: bytes = b""
    deferred_payload: bytes | None = None  # sent only if the device says it needs it
    label: str = ""  # what the reports call the work (a fragment, a dataset)
    host_only: bool = False  # pushdown never: read every slice raw, the host does everything
    # the device can run only part of the unit (a scan engine filters): what it streams is
    # completed on the host from this stage
    complete_output_from: Stage | None = None
    # per partition, the other replicas in placement order: where the rest goes if the device
    # stops answering (none: the work fails with the device's error)
    replicas: dict[int, list[DeviceClient]] = field(default_factory=dict)
    failovers: int = 0  # how often this task has moved already
    # raw slices travel as stored (a compressed dataset): this side decompresses them
    stored_raw: bool = False
    # a scan (``host_only``) of rows few enough for one engine run: the slices of every such
    # task of a fragment are completed together, once (``Dispatch.run``), not once per task
    complete_once: bool = False
    # partitions whose slices carry checksums, checked by whoever reads them: raw slices the
    # host receives count as verified (their device checked them, and this side too when they
    # come as stored)
    verified: frozenset[int] = frozenset()
    # the span its trace goes under (a fragment's, a storage server's exchange): each task is
    # a span of its own there, with the device's spans under it (``tracing``; none when off)
    span: tracing.Span = tracing.NO_SPAN


class Dispatch:
    """Runs tasks; ``reports`` says afterwards what every device did, partition by partition."""

    def __init__(
        self,
        marks: bool = False,
        passes_on: Callable[[Task, PushedBack], bool] | None = None,
        expect: Callable[[str], str] | None = None,
        loads_seen: Callable[[dict[str, LoadStatus]], None] | None = None,
        cancelled: threading.Event | None = None,
        down: Iterable[str] = (),
        task_span: str | None = None,
    ) -> None:
        # ``marks``: also yield a ``ChunkDone`` after the output of every slice range known
        # whole, as a device does (a storage server passes them on to its own upstream).
        # ``passes_on``: a pushed-back range it says yes to is not fetched here but yielded, for
        # the upstream to fetch and complete (a storage server that hands work further back).
        self.marks = marks
        self.passes_on = passes_on
        # ``task_span``: each task a span of its own, so named (a storage server's ``forward``:
        # its upstream sees nothing else of its drives); none on the host, whose tasks' spans
        # would only repeat the devices' own ``work`` under the fragment's
        self.task_span = task_span
        # ``expect``: per device, the generation to send with its work and raw scans (it
        # refuses them if its own differs: ``freshness``); ``loads_seen``: told each device's
        # load as its work ends
        self.expect = expect
        self.loads_seen = loads_seen
        self.reports: dict[tuple[str, str, int], WorkReport] = {}
        self.requests = 0  # work exchanges opened
        self.bytes_sent = 0  # payload bytes sent to devices
        self._hosts: dict[int, Unit] = {}  # the host units that completed anything
        # devices that stopped answering during this work (or did before: ``down``, their work
        # goes straight to the next replica, or to a stripe's parity)
        self.dead: set[str] = set(down)
        # set by ``cancel``, from any thread (shared by the runs of one query: ``cancelled``)
        self.cancelled = cancelled if cancelled is not None else threading.Event()
        # from asking a device to open a stream (a work exchange, a raw scan, a fetch of
        # pushed-back slices) to its first answer (admitted), summed: its queue as the host
        # meets it, busy refusals and their back-off included
        self.opening = Tally()
        self.streams = 0  # streams opened
        self._lock = threading.Lock()

    def cancel(self) -> None:
        """Stop every task: their streams end at the next batch, their readers raise
        ``QueryCancelled`` (a reader waiting for a batch, too)."""
        self.cancelled.set()

    def report(self, task: Task, partition: int) -> WorkReport:
        key = (task.label, task.client.name, partition)
        with self._lock:
            if key not in self.reports:
                mode = "scan" if task.host_only else "subplan"
                self.reports[key] = WorkReport(task.client.name, task.label, partition, mode)
            return self.reports[key]

    @property
    def host_complete_s(self) -> float:
        """Host CPU seconds spent completing handed-back work (in the host's core slots)."""
        with self._lock:
            return sum(host.context.drive_s for host in self._hosts.values())

    def host_completed(self) -> Tally:
        """Wall and CPU seconds the host spent completing handed-back work (summed over the
        streams that did)."""
        total = Tally()
        with self._lock:
            for host in self._hosts.values():
                total.add(host.context.computed)
        return total

    def sorted_reports(self) -> list[WorkReport]:
        return [self.reports[key] for key in sorted(self.reports)]

    # ---- many tasks ---------------------------------------------------------------------------

    def run(
        self, tasks: list[Task], workers: int, queue_items_max: int, name: str = "quarry-work"
    ) -> Merged[pa.RecordBatch]:
        """Every task's completed output, interleaved as it arrives, through a bounded queue."""
        if len(tasks) > 1 and all(task.complete_once for task in tasks):
            return self._completed_once(tasks, workers, queue_items_max, name)
        return merge(
            [(lambda task=task: self.stream(task)) for task in tasks],
            workers=max(1, workers),
            queue_items_max=queue_items_max,
            name=name,
            cancelled=self.cancelled,
        )

    def _completed_once(
        self, tasks: list[Task], workers: int, queue_items_max: int, name: str
    ) -> Merged[pa.RecordBatch]:
        """Scans whose rows make one engine run: their streams read at once, their slices
        completed together by the reader, in one run (a 1,000-row table on four devices took
        four runs of the host's engine, about 0.5 ms of CPU each, and the super-plan's fifth)."""
        raw = merge(
            [(lambda task=task: self._host_raw(task)) for task in tasks],
            workers=max(1, workers),
            queue_items_max=queue_items_max,
            name=name,
            cancelled=self.cancelled,
        )
        host = tasks[0].host

        def completed() -> Iterator[pa.RecordBatch]:
            try:
                yield from self._complete(host, Stage.RAW, raw)
                yield from self._finish(host)
            finally:
                raw.close()

        return Merged(completed(), threading.Event())

    # ---- one task -----------------------------------------------------------------------------

    def stream(self, task: Task) -> Iterator[pa.RecordBatch]:
        """One task's output: what the device ran, then what the host completed."""
        if self.task_span is None or not task.span.recording:
            yield from self._stream(task)
            return
        span = task.span.child(
            self.task_span,
            process=task.client.name,
            partitions=len(task.request.partitions),
            scan=task.host_only,
        )
        with span:
            yield from self._stream(replace(task, span=span))

    def _stream(self, task: Task) -> Iterator[pa.RecordBatch]:
        if task.host_only:
            yield from self._host_only(task)
        else:
            try:
                yield from self._exchange(task)
            except PlanNotSupported as error:
                reports = [self.report(task, p) for p in task.request.partitions]
                if any(r.counters.rows_shipped for r in reports):
                    raise
                for r in reports:
                    r.mode = "scan"
                    r.fallback = f"{error}; the host ran this sub-plan over raw slices"
                yield from self._host_only(task)
                with self._lock:  # every slice it read raw came back for the device's lack
                    for r in reports:
                        r.push_back(PushBack.CAPABILITY, r.slices_raw)
        yield from self._finish(task.host)

    def _finish(self, host: Unit) -> Iterator[pa.RecordBatch]:
        with self._lock:
            self._hosts[id(host)] = host
        yield from host.finish()  # a unit's last output: small (side statistics, or nothing)

    def _host_only(self, task: Task) -> Iterator[pa.RecordBatch]:
        yield from self._complete(task.host, Stage.RAW, self._host_raw(task))

    def _host_raw(self, task: Task) -> Iterator[pa.RecordBatch]:
        """The task's partitions' slices as stored, each counted as it comes."""
        for partition in task.request.partitions:
            yield from self._raw_slices(task, partition, self.report(task, partition))

    def _raw_slices(
        self, task: Task, partition: int, report: WorkReport
    ) -> Iterator[pa.RecordBatch]:
        """A partition's slices as stored, one batch per slice; a device that stops answering
        is left for the next replica, from the first slice not yet received."""
        request, received = task.request, 0
        columns = task.host.columns()  # what the unit reads: the rest stays on the drive
        lost: list[tuple[str, DeviceUnavailable | CorruptSlice]] = []
        for client in [task.client, *task.replicas.get(partition, ())]:
            if client.name in self.dead:
                continue
            if lost:
                failover = {"from": lost[-1][0], "to": client.name, "slices_done_before": received}
                report.failovers.append({**failover, "error": str(lost[-1][1])})
            try:
                if getattr(client, "rebuilds", False):  # a lost partition, from its stripe
                    skip = _elsewhere(request, partition)
                    reader = client.rebuilt(first=received, skip=skip, columns=columns)
                else:
                    reader = self._opened(
                        lambda client=client, first=received: client.scan(
                            request.domain,
                            request.dataset,
                            partition,
                            first=first,
                            columns=columns,
                            stored=task.stored_raw,
                            generation=self._expected(client.name),
                            span=task.span,
                        )
                    )
                for shipped in client.batches(reader):
                    size = pa.ipc.get_record_batch_size(shipped)
                    slices, checked = self._decoded(report, shipped)
                    verified = partition in task.verified or checked > 0
                    for batch in slices:
                        received += 1
                        with self._lock:
                            report.add_raw(1, batch.num_rows, size)
                            report.add_shipped(batch.num_rows, size, raw=True)
                            report.count(slices_verified=int(verified))
                        yield batch
                return
            except DeviceUnavailable as error:
                self.dead.add(client.name)
                lost.append((client.name, error))
            except CorruptSlice as error:  # that copy: the rest of the partition elsewhere
                lost.append((client.name, self.rejected(report, error, client.name)))
        where = f"partition {partition} of {request.domain}/{request.dataset}"
        errors = "; ".join(str(e) for _, e in lost)
        if lost and isinstance(lost[-1][1], CorruptSlice):
            raise CorruptSlice(
                f"no other replica of {where} holds a good copy of what is left after its first "
                f"{received} slices: {errors}"
            )
        raise DeviceUnavailable(f"no replica of {where} answers after {received} slices: {errors}")

    def rejected(self, report: WorkReport, error: CorruptSlice, device: str) -> CorruptSlice:
        """A copy that failed its check: counted, logged, named as the device's. Its device
        remembers it for repair; what is read instead comes from another replica."""
        error = error.on(device)
        with self._lock:
            report.count(slices_rejected=1)
        log.warning("rejected a damaged copy, reading another replica: %s", error)
        return error

    def _expected(self, device: str) -> str:
        return self.expect(device) if self.expect is not None else ""

    def _opened(self, open_stream: Callable[[], T]) -> T:
        """A stream, once the device admitted it; how long that took is the device's queue."""
        started = time.perf_counter()
        stream = open_stream()
        with self._lock:
            self.opening.wall_s += time.perf_counter() - started
            self.streams += 1
        return stream

    def _decoded(
        self, report: WorkReport, shipped: pa.RecordBatch
    ) -> tuple[list[pa.RecordBatch], int]:
        """A batch as it arrived, or the slices in it when they came as stored: checked against
        their checksums and decompressed here, on this side's CPU, which the report counts
        (``decode_s``); and how many of them this side checked."""
        if not stored.is_stored(shipped.schema):
            return [shipped], 0
        started = time.thread_time()
        slices = stored.decode(shipped)
        with self._lock:
            report.decode_s += time.thread_time() - started
        return slices, stored.verified(shipped)

    def _complete(
        self, host: Unit, stage: Stage, batches: Iterable[pa.RecordBatch]
    ) -> Iterator[pa.RecordBatch]:
        """The host's completion, streamed as it produces (its CPU time counted by the host
        unit's context)."""
        with self._lock:
            self._hosts[id(host)] = host
        yield from host.complete(stage, batches)

    def _exchange(self, task: Task) -> Iterator[pa.RecordBatch]:
        """One task on its device; if the device stops answering, the rest on replicas."""
        try:
            if task.client.name in self.dead:
                error = DeviceUnavailable(f"device {task.client.name} does not answer")
                raise DeviceLost(error, Progress())
            yield from self._rounds(task)
        except DeviceLost as lost:
            reports = {p: self.report(task, p) for p in task.request.partitions}
            for resumed in resume(task, lost, self.dead, reports):
                if resumed.host_only:  # rebuilt from parity on the host
                    yield from self._host_only(resumed)
                else:
                    yield from self._exchange(resumed)

    def _rounds(self, task: Task) -> Iterator[pa.RecordBatch]:
        payload = task.payload
        progress = Progress()
        for _ in range(PAYLOAD_ROUNDS_MAX):
            with self._lock:
                self.requests += 1
                self.bytes_sent += len(payload)
            done = yield from self._one_exchange(task, payload, progress)
            if not done.payload_needed:
                return
            if task.deferred_payload is None or payload is task.deferred_payload:
                raise ProtocolError(f"unit {task.request.unit} needs a payload it was sent")
            payload = task.deferred_payload
        raise AssertionError("payload rounds exhausted")

    def _one_exchange(self, task: Task, payload: bytes, progress: Progress):
        """Stream one exchange; pushed-back ranges are fetched and completed while the device
        goes on deciding, so its probes and its work never hold up rows it already declined.

        Output is passed on only once it is whole (a chunk marked done, or the device's last
        word), and ``progress`` says what is, so a device that stops answering leaves a task
        that resumes on a replica with nothing lost and nothing counted twice. Returns the
        device's ``WorkDone``."""
        fetchers = threads.Bounded(FETCHERS_PER_EXCHANGE, "quarry-fetch")
        fetches: list[tuple[PushedBack, Future]] = []
        pending: list[pa.RecordBatch] = []  # output of work not yet marked whole
        passed: list[PushedBack] = []  # handed on upstream: neither fetched nor done here
        done: WorkDone | None = None
        try:
            request = task.request
            generation = self._expected(task.client.name)
            if generation:
                request = replace(request, generation=generation)
            for item in self._opened(lambda: task.client.work(request, payload, task.span)):
                if isinstance(item, pa.RecordBatch):
                    pending.append(item)
                elif isinstance(item, ChunkDone):
                    yield from self._release(task, pending)
                    pending = []
                    progress.add(item.partition, item.first, item.end)
                    if self.marks:
                        yield item
                elif isinstance(item, PushedBack):
                    if self.passes_on is not None and self.passes_on(task, item):
                        passed.append(item)
                        yield item
                        continue
                    future = fetchers.submit(self._fetch, task, item, payload)
                    fetches.append((item, future))
                else:
                    done = item
        except (DeviceUnavailable, CorruptSlice) as error:
            yield from self._fetched(fetches, progress, wait_for_all=True)
            fetchers.shutdown(cancel_futures=True)
            raise DeviceLost(self._lost(task, error), progress) from None
        except BaseException:  # a device that failed mid-stream leaves no fetch running
            fetchers.shutdown(cancel_futures=True)
            raise
        fetchers.shutdown()
        if done is None:
            raise ProtocolError(f"device {task.client.name}: the work stream ended unfinished")
        if done.payload_needed:
            return done
        if done.load is not None and self.loads_seen is not None:
            self.loads_seen({task.client.name: done.load})
        for partition in done.partitions:
            trace = list(done.trace) if done.trace is not None else None
            report = self.report(task, partition.partition)
            with self._lock:  # its pushed-back ranges may still be fetched, and counted
                report.add_device(partition, trace)
        yield from self._release(task, pending)
        for partition in done.partitions:  # the device's own work is all in, but not what
            handed_back = {  # it handed back: that counts once fetched and completed
                n
                for notice in [*(notice for notice, _ in fetches), *passed]
                if notice.partition == partition.partition
                for r in notice.ranges
                for n in r.numbers()
            }
            total = partition.metrics.counters.slices_total
            own = [n for n in range(total) if n not in handed_back]
            progress.done.setdefault(partition.partition, set()).update(own)
            if self.marks:
                yield from _marks(partition.partition, own)
        try:
            yield from self._fetched(fetches, progress, wait_for_all=False)
        except (DeviceUnavailable, CorruptSlice) as error:
            raise DeviceLost(self._lost(task, error), progress) from None
        return done

    def _lost(
        self, task: Task, error: DeviceUnavailable | CorruptSlice
    ) -> DeviceUnavailable | CorruptSlice:
        """Why a task leaves its device: it stopped answering, or read a damaged copy (counted
        in the report of the partition it names)."""
        if isinstance(error, DeviceUnavailable):
            return error
        partitions = task.request.partitions
        named = error.partition if error.partition in partitions else partitions[0]
        return self.rejected(self.report(task, named), error, task.client.name)

    def _release(self, task: Task, batches: list[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Device output now known whole: passed on, or completed first (a scan engine)."""
        if task.complete_output_from is not None and batches:
            yield from self._complete(task.host, task.complete_output_from, batches)
        else:
            yield from batches

    def _fetched(
        self, fetches: list[tuple[PushedBack, Future]], progress: Progress, wait_for_all: bool
    ) -> Iterator[pa.RecordBatch]:
        """The completed pushed-back ranges, in order, each marked done as it is passed on.
        ``wait_for_all``: the device is gone; keep what completed, drop what broke off."""
        for notice, future in fetches:
            try:
                batches = future.result()
            except (DeviceUnavailable, CorruptSlice):
                if wait_for_all:  # not done: the replica that takes over runs it again
                    continue
                raise
            yield from batches
            for r in notice.ranges:
                progress.add(notice.partition, r.first, r.end)
                if self.marks:
                    yield ChunkDone(notice.partition, r.first, r.end)

    def _fetch(self, task: Task, notice: PushedBack, payload: bytes) -> list[pa.RecordBatch]:
        """Fetch a pushed-back range and complete it on the host."""
        request = task.request
        fetch = SliceRequest(
            unit=request.unit,
            domain=request.domain,
            dataset=request.dataset,
            partition=notice.partition,
            ranges=notice.ranges,
            stage=notice.stage,
            query_id=request.query_id,
            args=request.args,
            stored=task.stored_raw and notice.stage is Stage.RAW,
        )
        report = self.report(task, notice.partition)
        raw = notice.stage is Stage.RAW
        verified = raw and notice.partition in task.verified
        if raw:  # read when fetched: counted here (a filtered range was counted by the device)
            with self._lock:  # a partition's ranges are fetched at once
                report.add_raw(notice.slices, notice.rows, notice.bytes_stored)

        def arriving() -> Iterator[pa.RecordBatch]:
            reader = self._opened(lambda: task.client.get(fetch, payload, span))
            for shipped in task.client.batches(reader):
                size = pa.ipc.get_record_batch_size(shipped)
                slices, checked = self._decoded(report, shipped)
                with self._lock:
                    report.add_shipped(sum(b.num_rows for b in slices), size, raw)
                    report.count(slices_verified=len(slices) if verified else checked)
                yield from slices

        span = task.span.child(
            "complete",
            process=task.client.name,
            partition=notice.partition,
            stage=str(notice.stage),
            slices=notice.slices,
        )
        with span:
            return list(self._complete(task.host, notice.stage, arriving()))


def _elsewhere(request: WorkRequest, partition: int) -> frozenset[int]:
    """The slices of a partition that another device ran already (a failover's)."""
    return frozenset(
        n for r in request.elsewhere if r.partition == partition for n in range(r.first, r.end)
    )


def _marks(partition: int, numbers: list[int]) -> Iterator[ChunkDone]:
    """``ChunkDone`` for each run of consecutive slice numbers."""
    first = previous = None
    for number in numbers:
        if first is None:
            first = previous = number
        elif number == previous + 1:
            previous = number
        else:
            yield ChunkDone(partition, first, previous + 1)
            first = previous = number
    if first is not None:
        yield ChunkDone(partition, first, previous + 1)
