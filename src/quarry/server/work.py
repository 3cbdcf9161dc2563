"""A storage server's side of a work exchange: a coordinator to its drives (DESIGN §1).

The host sends a server the same ``WorkRequest`` it would send a drive. The server sends each
partition's share to the drive that holds it, completes what the drive hands back with its own
CPU (the same unit, in the server's slots under its profile: ``host_context`` in this process),
and streams the result upward as if it had run the whole unit itself: batches, a ``ChunkDone``
after the output of every slice range known whole (so the host resumes a lost server exactly
where it stopped), and one ``WorkDone`` whose partition reports carry the drive's own report one
level down (``PartitionReport.below``).

The host's decisions pass through: its forced decisions and its cost figures reach the drive,
which decides against them; what the drive declines, the server completes (POLARDB's
"CSD-based" pushdown: drives scan, the storage node checks the full condition, §3.1).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

import pyarrow as pa

from quarry import tracing
from quarry.coordinator.dispatch.dispatch import Dispatch, Task
from quarry.coordinator.dispatch.report import WorkReport
from quarry.coordinator.dispatch.streams import merge
from quarry.cost import eq1
from quarry.cost.model import CUTS, DeviceFigures, HostFigures
from quarry.device.controller import declined_for
from quarry.device.loop import cpu_seconds
from quarry.device.unit import host_context, lookup
from quarry.device.units.substrait import (
    SubstraitArgs,
    SubstraitUnit,
    split_payload,
    stages_payload,
)
from quarry.errors import DeviceUnavailable
from quarry.plan.capabilities import Capabilities
from quarry.plan.restrict import restrict_filter_stage, runs_whole_stage
from quarry.protocol.control import LoadStatus
from quarry.protocol.stage import PushBack, Stage
from quarry.protocol.work import (
    ChunkDone,
    Decision,
    HostCost,
    LevelReport,
    PartitionReport,
    PushedBack,
    WorkDone,
    WorkMetrics,
    WorkRequest,
    WorkTimes,
)
from quarry.pushdown import Pushdown
from quarry.server.costs import drive_costs
from quarry.tally import Tally

if TYPE_CHECKING:
    from pyarrow import flight

    from quarry.coordinator.membership.device_client import DeviceClient
    from quarry.coordinator.membership.membership import Membership
    from quarry.device.admission import Admission
    from quarry.device.emulation import Emulator


class StorageServer(Protocol):
    """What the work needs of the server it runs in (``quarry.server.service``)."""

    name: str
    drives: Membership
    emulator: Emulator
    admission: Admission

    def holder(self, domain: str, dataset: str, partition: int) -> DeviceClient: ...

    def capabilities(self, drive: DeviceClient) -> Capabilities: ...

    def compressed(self, domain: str, dataset: str) -> bool: ...

    def figures(self) -> HostFigures: ...

    def drive_figures(
        self, domain: str, dataset: str, partitions: tuple[int, ...]
    ) -> list[DeviceFigures]: ...


QUEUE_GROUPS_MAX = 16  # completed groups waiting for the upstream writer


SERVER_BUSY = 0.9  # under auto, a server this busy hands its drives' push-backs on upstream


@dataclass
class Group:
    """Output of one task known whole: its batches, then the ranges they complete; or a range
    handed on upstream (``notices``)."""

    batches: list[pa.RecordBatch] = field(default_factory=list)
    marks: list[ChunkDone] = field(default_factory=list)
    notices: list[PushedBack] = field(default_factory=list)


@dataclass
class Shipped:
    """What went upstream for one partition."""

    rows: int = 0
    bytes: int = 0
    passed: list[PushedBack] = field(default_factory=list)
    time: Tally = field(default_factory=Tally)  # writing it to the upstream


def run_work(
    server: StorageServer,
    request: WorkRequest,
    payload: bytes,
    writer: flight.MetadataRecordBatchWriter,
    span: tracing.Span = tracing.NO_SPAN,
) -> None:
    """Run ``request`` over the server's drives; stream its output, marks and ``WorkDone``.
    Each drive's share is traced as a ``forward`` span under the exchange's ``span``."""
    started, cpu_started = time.perf_counter(), cpu_seconds()
    unit_class = lookup(request.unit)
    schema = unit_class(request, payload, host_context()).output_schema
    passed_why: dict[tuple[int, int], PushBack] = {}  # (partition, first slice): why passed on
    dispatch = Dispatch(
        marks=True, passes_on=passes_on(server, request, passed_why), task_span="forward"
    )
    shipped = {p: Shipped() for p in request.partitions}
    costs = _drive_costs(server, request, payload)
    tasks = [
        _task(server, request, payload, p, unit_class, costs, span) for p in request.partitions
    ]
    with server.admission.exchange(small=False):
        writer.begin(schema)
        groups = merge(
            [(lambda task=task: _groups(task, dispatch.stream(task))) for task in tasks],
            workers=max(1, min(len(tasks), 2 * len(server.drives.devices))),
            queue_items_max=QUEUE_GROUPS_MAX,
            name="quarry-server-work",
        )
        try:
            for group, partition in groups:
                _write(server, writer, group, shipped[partition])
        except DeviceUnavailable as error:  # a drive stopped: this server lost the work
            raise DeviceUnavailable(f"storage server {server.name}: {error}") from None
    reports = tuple(
        _partition_report(
            server.name, dispatch, task, shipped[task.request.partitions[0]], passed_why
        )
        for task in tasks
    )
    done = WorkDone(
        partitions=reports,
        summary={"server": server.name, "drives": sorted({t.client.name for t in tasks})},
        trace=None,
        payload_needed=False,
        wall_s=time.perf_counter() - started,
        device_cpu_s=max(0.0, cpu_seconds() - cpu_started),
        load=LoadStatus(**server.emulator.load()),
    )
    writer.write_metadata(pa.py_buffer(done.encode()))
    server.metrics.work_done(done)


def level_mode(request: WorkRequest) -> Pushdown:
    """The mode this level runs a request in, as the request implies it (the mode itself does
    not travel): the host's costs mean ``auto``, where this server chooses its drives' cut
    (``server.costs``) and whether to complete what they hand back or pass it on
    (``host_cheaper``); without them, ``always``: it completes whatever its drives hand back
    (under ``server`` too, whose raw ranges the host forced). ``never`` sends it scans only."""
    return Pushdown.AUTO if request.host is not None else Pushdown.ALWAYS


def passes_on(
    server: StorageServer,
    request: WorkRequest,
    why: dict[tuple[int, int], PushBack] | None = None,
) -> Callable[[Task, PushedBack], bool]:
    """Whether a range a drive handed back goes on to the host rather than being completed
    here: the host forced it there (``ForcedDecision.to_host``), or, under auto, the host
    completes it for less (``host_cheaper``). Why each range passed on goes in ``why``, by
    (partition, first slice)."""
    upward = {(f.partition, n) for f in request.forced if f.to_host for n in range(f.first, f.end)}
    mode = level_mode(request)
    why = why if why is not None else {}

    def decide(task: Task, notice: PushedBack) -> bool:
        numbers = ((notice.partition, n) for r in notice.ranges for n in r.numbers())
        if any(number in upward for number in numbers):
            why.update({(notice.partition, r.first): PushBack.FORCED for r in notice.ranges})
            return True
        if mode is not Pushdown.AUTO or request.host is None:  # it completes what it is handed
            return False
        load = server.emulator.load()
        if not host_cheaper(request.host, notice.stage, load["cpu_busy"]):
            return False
        why.update({(notice.partition, r.first): declined_for(load) for r in notice.ranges})
        return True

    return decide


def host_cheaper(host: HostCost, stage: Stage, busy: float) -> bool:
    """ActivePy Eq. 1 one level up, per stored byte: the host path (the range crosses the
    network as it is, the host completes it on its share) against this server's (it completes
    the range on what its CPU has left, ``1 - busy``, and ships the result, about nothing for
    the partial aggregates and filters the cost model pushes). The server's own cost is the
    host's estimate of it (``device_full_s_per_byte``); without one, a server at least
    ``SERVER_BUSY`` passes on and any other completes."""
    if host.device_full_s_per_byte <= 0:
        return busy >= SERVER_BUSY
    raw = stage is Stage.RAW
    shipped = host.raw_ratio if raw else host.filter_ratio
    rest_s = host.full_s_per_byte - (0.0 if raw else host.filter_s_per_byte)
    host_s = eq1.host_path_s_per_byte(
        shipped, host.link_bytes_per_s, eq1.on_host_share(max(rest_s, 0.0), host.host_share)
    )
    here_s = eq1.device_path_s_per_byte(
        host.device_full_s_per_byte / max(1.0 - busy, eq1.HOST_SHARE_MIN),
        0.0,
        host.link_bytes_per_s,
    )
    return not eq1.pushes_down(host_s, here_s)


def _drive_costs(
    server: StorageServer, request: WorkRequest, payload: bytes
) -> dict[str, HostCost] | None:
    """Under auto, what this server tells each drive (``server.costs``); a SQL sub-plan whose
    filter is its whole work has no filter cut, as on the host."""
    if level_mode(request) is not Pushdown.AUTO or request.host is None:
        return None
    allowed = CUTS
    if request.unit == SubstraitUnit.NAME:
        stages = split_payload(SubstraitArgs.from_json(request.args), payload)
        if stages[Stage.FILTER] == stages[Stage.FULL]:
            allowed = (Stage.FULL, Stage.RAW)
    drives = server.drive_figures(request.domain, request.dataset, request.partitions)
    return drive_costs(request.host, server.figures(), drives, allowed)


def _task(
    server: StorageServer,
    request: WorkRequest,
    payload: bytes,
    partition: int,
    unit_class,
    costs: dict[str, HostCost] | None,
    span: tracing.Span,
) -> Task:
    """One partition's share, for the drive that holds it, with the costs this server tells
    it; a SQL sub-plan cut again for a drive that cannot run all of it (``for_drive``)."""
    drive = server.holder(request.domain, request.dataset, partition)
    share = replace(
        request,
        host=costs[drive.name] if costs is not None else request.host,
        partitions=(partition,),
        forced=tuple(f for f in request.forced if f.partition == partition),
        elsewhere=tuple(e for e in request.elsewhere if e.partition == partition),
    )
    task = Task(
        client=drive,
        request=share,
        host=unit_class(share, payload, host_context()),
        payload=payload,
        label=f"{request.domain}/{request.dataset}",
        stored_raw=server.compressed(request.domain, request.dataset),
        span=span,
    )
    capabilities = server.capabilities(drive)
    if request.unit == SubstraitUnit.NAME and not capabilities.is_full:
        task = for_drive(task, capabilities)
    return task


def for_drive(task: Task, capabilities: Capabilities) -> Task:
    """A scan engine's share of a SQL sub-plan (Skytether §4: each level decomposes for the one
    below): the filter stage's conjuncts it supports are its whole work, and the server
    completes its output from the filter stage on (``complete_output_from``), re-checking the
    complete condition, as the host does for scan engines it talks to directly. A sub-plan the
    drive runs whole (its filter all comparisons, its projection plain columns) goes as it is."""
    args = SubstraitArgs.from_json(task.request.args)
    stages = split_payload(args, task.payload)
    if runs_whole_stage(stages[Stage.FULL], capabilities):
        return task
    scan = restrict_filter_stage(stages[Stage.FILTER], capabilities)
    own = {Stage.RAW: stages[Stage.RAW], Stage.FILTER: scan, Stage.FULL: scan}
    own_args = replace(  # a join's key sets cut the output, which the server completes
        args,
        filter_bytes=len(scan),
        full_bytes=len(scan),
        output_schema=args.raw_schema,
        key_filters=(),
        unfiltered_bytes=0,
        statistics=(),  # its output is rows, not the aggregate statistics would answer
    )
    request = replace(task.request, args=own_args.to_json())
    return replace(
        task, request=request, payload=stages_payload(own), complete_output_from=Stage.FILTER
    )


def _groups(task: Task, items: Iterable[object]) -> Iterator[tuple[Group, int]]:
    """A task's output cut into groups that end where a range is known whole: the upstream
    releases what came before a mark, so a group must never be split by another task's."""
    group, partition = Group(), task.request.partitions[0]
    for item in items:
        if isinstance(item, ChunkDone):
            group.marks.append(item)
            yield group, partition
            group = Group()
        elif isinstance(item, PushedBack):  # fetched by the host while the work goes on
            yield Group(notices=[item]), partition
        else:
            group.batches.append(item)
    if group.batches:
        yield group, partition


def _write(
    server: StorageServer,
    writer: flight.MetadataRecordBatchWriter,
    group: Group,
    shipped: Shipped,
) -> None:
    with shipped.time.timing():
        _write_group(server, writer, group, shipped)


def _write_group(
    server: StorageServer,
    writer: flight.MetadataRecordBatchWriter,
    group: Group,
    shipped: Shipped,
) -> None:
    for batch in group.batches:
        size = pa.ipc.get_record_batch_size(batch)
        server.emulator.ship(size)  # the server's own link to the host
        writer.write_batch(batch)
        shipped.rows += batch.num_rows
        shipped.bytes += size
    for mark in group.marks:
        writer.write_metadata(pa.py_buffer(mark.encode()))
    for notice in group.notices:
        shipped.passed.append(notice)
        writer.write_metadata(pa.py_buffer(notice.encode()))


def _partition_report(
    server: str,
    dispatch: Dispatch,
    task: Task,
    shipped: Shipped,
    passed_why: dict[tuple[int, int], PushBack],
) -> PartitionReport:
    """The server's account of a partition: every slice the drive scanned was executed at this
    level (by the drive, or by the server completing it), but what it passed on to the host
    (pushed back at this level, each range for why the server passed it on), and the drive's
    own account below."""
    partition = task.request.partitions[0]
    drive = dispatch.report(task, partition)
    scanned = drive.counters.slices_scanned  # raw ranges passed on count when fetched
    filtered_on = sum(n.slices for n in shipped.passed if n.stage is Stage.FILTER)
    why = {
        (n.partition, r.first): passed_why.get((n.partition, r.first), PushBack.FORCED)
        for n in shipped.passed
        for r in n.ranges
    }
    by: dict[PushBack, int] = {}
    for n in shipped.passed:
        for r in n.ranges:
            reason = why[(n.partition, r.first)]
            by[reason] = by.get(reason, 0) + len(r)
    counters = replace(
        drive.counters.with_pushed_back(by),
        slices_executed=scanned - filtered_on,
        rows_shipped=shipped.rows,
        bytes_shipped=shipped.bytes,
        # the server's CPU completing it, and decompressing what came raw as stored
        device_cpu_s=task.host.context.drive_s + drive.decode_s,
    )
    times = _server_times(drive.times, task.host.context.computed, drive.decode_s, shipped)
    metrics = WorkMetrics(counters, wall_s=drive.wall_s, times=times)
    completed = [d for d in drive.decisions if d.stage in (Stage.RAW, Stage.FILTER)]
    passed = {(r.first, r.end): n.stage for n in shipped.passed for r in n.ranges}
    decisions = tuple(
        Decision(d.first, d.end, Stage.FULL, f"completed on storage server {server}")
        for d in completed
        if (d.first, d.end) not in passed
    ) + tuple(
        Decision(
            first,
            end,
            stage,
            f"passed on to the host by storage server {server}",
            pushed_back=why[(partition, first)],
        )
        for (first, end), stage in sorted(passed.items())
    )
    return PartitionReport(
        partition, decisions, metrics, below=(_level(drive, server), *drive.below)
    )


def _server_times(
    drive: WorkTimes, completed: Tally, decode_cpu_s: float, shipped: Shipped
) -> WorkTimes:
    """The partition's time at this level: its drive's, and this server's own on top (what
    it completed runs as execute, what it decompressed as decode, what it wrote upstream as
    ship): the host sees the level below it as one device."""
    return drive.plus(
        WorkTimes(
            decode_s=decode_cpu_s,
            decode_cpu_s=decode_cpu_s,
            execute_s=completed.wall_s,
            execute_cpu_s=completed.cpu_s,
            ship_s=shipped.time.wall_s,
            ship_cpu_s=shipped.time.cpu_s,
        )
    )


def _level(drive: WorkReport, server: str) -> LevelReport:
    metrics = WorkMetrics(drive.counters, wall_s=drive.wall_s, times=drive.times)
    return LevelReport(drive.device, tuple(drive.decisions), metrics, drive.fallback, server)
