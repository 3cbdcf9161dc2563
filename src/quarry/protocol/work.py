"""Work near the data: one request for every kind of work, and what comes back.

A ``WorkRequest`` names a *unit of work* (``substrait`` for a SQL sub-plan, ``genes.accumulate``,
``capacity.count``, ``sample`` ...) and the partitions to run it over; the unit's own arguments
travel in ``args`` (decoded by the unit with its own message class) and its binary part (Substrait
stages, a grouping) as the frame's payload. The device answers on the same ``do_exchange``:

- record batches: the unit's output, as it is produced;
- ``PushedBack`` notices (stream metadata), as soon as the device declines slice ranges, so the
  host fetches them (``SliceRequest``) while the device goes on;
- one ``WorkDone`` last: per partition the decisions (the annotated sub-plan) and the metrics,
  and the unit's summary.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from quarry.protocol import frame
from quarry.protocol.control import (
    GENERATION_CHARS_MAX,
    NAME_CHARS_MAX,
    PARTITION_MAX,
    LoadStatus,
)
from quarry.protocol.counters import WorkCounters
from quarry.protocol.frame import Exchange, Get
from quarry.protocol.message import Message, bounded
from quarry.protocol.stage import PushBack, Skip, Stage

REQUEST_PARTITIONS_MAX = 4096
DECISIONS_MAX = 1 << 20
CHUNK_SLICES_MAX = 64
SLICE_MAX = 1 << 24
UNIT_CHARS_MAX = 128
QUERY_ID_CHARS_MAX = 256
REASON_CHARS_MAX = 4096
EXTERNAL_TRANSFER_BYTES_MAX = 4 << 30


@dataclass(frozen=True)
class SliceRange(Message):
    """Slices [first, end) of one partition."""

    first: int = bounded(low=0, high=SLICE_MAX)
    end: int = bounded(low=0, high=SLICE_MAX)

    def __post_init__(self) -> None:
        assert self.first <= self.end, f"first {self.first} after end {self.end}"

    def __len__(self) -> int:
        return self.end - self.first

    def numbers(self) -> range:
        return range(self.first, self.end)


def ranges_of(numbers: list[int]) -> list[SliceRange]:
    """[1, 2, 3, 7, 8] -> [1, 4), [7, 9)"""
    out: list[list[int]] = []
    for n in sorted(numbers):
        if out and out[-1][1] == n:
            out[-1][1] = n + 1
        else:
            out.append([n, n + 1])
    return [SliceRange(a, b) for a, b in out]


@dataclass(frozen=True)
class ForcedDecision(Message):
    """A decision dictated by the request (tests and experiments force push-back this way)."""

    partition: int = bounded(low=0, high=PARTITION_MAX)
    first: int = bounded(low=0, high=SLICE_MAX)
    end: int = bounded(low=0, high=SLICE_MAX)
    stage: Stage = Stage.RAW
    # behind a storage server: the range goes on to the host rather than being completed by the
    # server (a forced push-back at the server's level as well as the drive's)
    to_host: bool = False


@dataclass(frozen=True)
class PartitionRange(Message):
    """Slices [first, end) of one partition."""

    partition: int = bounded(low=0, high=PARTITION_MAX)
    first: int = bounded(low=0, high=SLICE_MAX)
    end: int = bounded(low=0, high=SLICE_MAX)

    def __post_init__(self) -> None:
        assert self.first <= self.end, f"first {self.first} after end {self.end}"


@dataclass(frozen=True)
class HostCost(Message):
    """What the host told the device about doing the work itself (ActivePy Eq. 1 inputs)."""

    full_s_per_byte: float = bounded(low=0.0)  # host CPU s per stored byte, whole unit
    raw_ratio: float = bounded(low=0.0)  # bytes shipped raw per stored byte (needed columns)
    filter_ratio: float = bounded(low=0.0)  # bytes shipped after the filter per stored byte
    link_bytes_per_s: float = bounded(low=1.0)  # device -> host
    host_share: float = bounded(low=0.0, high=1.0)  # of the host this device's completion gets
    start: Stage = Stage.FULL  # the cut the host chose; the device starts there
    filter_s_per_byte: float = bounded(low=0.0, default=0.0)  # host s per byte, scan + filter
    # the host's estimate of this device's s per stored byte for the whole unit (its compute
    # factor and load applied): what a probe would cost before any is measured
    device_full_s_per_byte: float = bounded(low=0.0, default=0.0)
    # the rest of the host's figures, so a storage server can choose its drives' cut with the
    # same model on its own figures (``quarry.server.costs``): the host's compute factor (its
    # s per s of this machine's), the sub-plan's output and read per stored byte (None: not a
    # sub-plan whose cut is chosen; the server keeps the host's)
    compute_factor: float = bounded(low=1e-6, high=1e6, default=1.0)
    output_ratio: float | None = bounded(low=0.0, default=None)
    read_ratio: float = bounded(low=0.0, default=1.0)


@dataclass(frozen=True)
class Policy(Message):
    """Thresholds of the device's run-time decision (docs/adaptive.md)."""

    warmup_chunks: int = bounded(low=0, high=1000, default=1)  # first measurements ignored
    sample_chunks: int = bounded(low=1, high=1000, default=2)  # measured before deciding
    window: int = bounded(low=1, high=1000, default=4)  # recent measurements (median)
    probe_after_s: float = bounded(low=0.0, high=3600.0, default=0.5)  # re-measure after ...
    probe_after_s_max: float = bounded(low=0.0, high=3600.0, default=8.0)  # ... doubling to
    hysteresis: float = bounded(low=0.0, high=10.0, default=0.10)  # switch only when cheaper
    probe_budget: float = bounded(low=0.0, high=1.0, default=0.10)  # share of the work left
    warmup_factor: float = bounded(low=1.0, high=1000.0, default=5.0)  # a first execution


@dataclass(frozen=True)
class WorkRequest(Message):
    KIND = Exchange.WORK

    unit: str = bounded(chars_max=UNIT_CHARS_MAX)
    domain: str = bounded(chars_max=NAME_CHARS_MAX)
    dataset: str = bounded(chars_max=NAME_CHARS_MAX)
    partitions: tuple[int, ...] = bounded(
        low=0, high=PARTITION_MAX, items_max=REQUEST_PARTITIONS_MAX
    )
    forced: tuple[ForcedDecision, ...] = bounded(items_max=DECISIONS_MAX, default=())
    host: HostCost | None = None  # present: the device adapts (pushdown auto)
    policy: Policy = Policy()
    query_id: str | None = bounded(chars_max=QUERY_ID_CHARS_MAX, default=None)
    trace: bool = False  # per-chunk timings in the answer (experiments)
    chunk_slices: int | None = bounded(low=1, high=CHUNK_SLICES_MAX, default=None)
    args: dict[str, Any] = bounded(default_factory=dict)  # the unit's own, decoded by it
    # ranges another replica finished before it stopped answering: not run again here
    elsewhere: tuple[PartitionRange, ...] = bounded(items_max=DECISIONS_MAX, default=())
    # the device's generation the host's catalog was read under (``PulseReply``): a device
    # whose own differs refuses the work (CatalogChanged) before it runs any; "": not asked
    generation: str = bounded(chars_max=GENERATION_CHARS_MAX, default="")

    def __post_init__(self) -> None:
        assert self.partitions, "a work request names at least one partition"
        assert len(set(self.partitions)) == len(self.partitions), "a partition listed twice"


@dataclass(frozen=True)
class PushedBack(Message):
    """Slice ranges a device declined, announced at once so the host fetches them early."""

    KIND = "pushed_back"

    partition: int = bounded(low=0, high=PARTITION_MAX)
    ranges: tuple[SliceRange, ...]
    stage: Stage
    rows: int = bounded(low=0)  # the host reads these through another stream; it accounts
    bytes_stored: int = bounded(low=0)  # them with these

    def __post_init__(self) -> None:
        assert self.stage.pushed_back, "a pushed-back range is raw or filtered"

    @property
    def slices(self) -> int:
        return sum(len(r) for r in self.ranges)


@dataclass(frozen=True)
class ChunkDone(Message):
    """The batches streamed since the last such message are the whole output of slices
    [first, end) of a partition (units whose chunks carry no state: SQL stages, samples,
    kernels). Had the device died before it, the host would run that range again elsewhere."""

    KIND = "chunk_done"

    partition: int = bounded(low=0, high=PARTITION_MAX)
    first: int = bounded(low=0, high=SLICE_MAX)
    end: int = bounded(low=0, high=SLICE_MAX)


@dataclass(frozen=True)
class Decision(Message):
    """What the device did with slices [first, end), and why (an entry of the annotation)."""

    first: int = bounded(low=0, high=SLICE_MAX)
    end: int = bounded(low=0, high=SLICE_MAX)
    stage: Stage | Skip
    reason: str = bounded(chars_max=REASON_CHARS_MAX)
    retry_after_s: float | None = bounded(low=0.0, default=None)  # QoS hint with a decline
    # why a range handed back went back (the reason in words is ``reason``); None otherwise
    pushed_back: PushBack | None = None

    def __post_init__(self) -> None:
        assert self.first <= self.end, (self.first, self.end)
        assert self.pushed_back is None or self.stage in (Stage.RAW, Stage.FILTER), self


@dataclass(frozen=True)
class WorkTimes(Message):
    """Where one partition's time went on the device, wall and CPU seconds of the threads that
    did it (EXPLAIN ANALYZE's ``time``): slices read off the store (through the drive's internal
    link), decoded, the unit run over them (its slot, stretched as the drive's profile says),
    and the output written to the host (through the drive's external link). Reads ahead of the
    compute, and partitions run at once, overlap: the parts may add up to more than ``wall_s``.
    A device that does not say leaves them 0."""

    read_s: float = bounded(low=0.0, default=0.0)
    read_cpu_s: float = bounded(low=0.0, default=0.0)
    decode_s: float = bounded(low=0.0, default=0.0)
    decode_cpu_s: float = bounded(low=0.0, default=0.0)
    execute_s: float = bounded(low=0.0, default=0.0)
    execute_cpu_s: float = bounded(low=0.0, default=0.0)
    ship_s: float = bounded(low=0.0, default=0.0)
    ship_cpu_s: float = bounded(low=0.0, default=0.0)

    def plus(self, other: WorkTimes) -> WorkTimes:
        return WorkTimes(
            **{name: getattr(self, name) + getattr(other, name) for name in _TIME_FIELDS}
        )


_TIME_FIELDS = tuple(f.name for f in fields(WorkTimes))


@dataclass(frozen=True)
class WorkMetrics(Message):
    """What one partition cost the device: its counters (``WorkCounters``), and the wall time
    it took and where that went (not counters: see ``protocol.counters``)."""

    counters: WorkCounters = WorkCounters()
    wall_s: float = bounded(low=0.0, default=0.0)
    times: WorkTimes = WorkTimes()

    def flat_json(self) -> dict[str, Any]:
        """The counters beside the rest, as EXPLAIN ANALYZE has always shown them."""
        body = self.to_json()
        return {**body.pop("counters"), **body}


@dataclass(frozen=True)
class LevelReport(Message):
    """What a device below a storage server did for one partition: a drive, or a server with
    its own below it (every level under the host's device, flat, each naming the server it
    answered to: ``above``)."""

    device: str = bounded(chars_max=NAME_CHARS_MAX)
    decisions: tuple[Decision, ...] = bounded(items_max=DECISIONS_MAX)
    metrics: WorkMetrics
    fallback: str | None = bounded(chars_max=REASON_CHARS_MAX, default=None)
    above: str = bounded(chars_max=NAME_CHARS_MAX, default="")


@dataclass(frozen=True)
class PartitionReport(Message):
    """One partition's account: the decisions and metrics of the device that answered, and,
    when it is a storage server, those of every level below it (``below``)."""

    partition: int = bounded(low=0, high=PARTITION_MAX)
    decisions: tuple[Decision, ...] = bounded(items_max=DECISIONS_MAX)
    metrics: WorkMetrics
    below: tuple[LevelReport, ...] = bounded(items_max=64, default=())


@dataclass(frozen=True)
class TraceEntry(Message):
    partition: int
    first: int
    end: int
    seconds: float
    drive_s: float
    bytes_stored: int
    bytes_shipped: int


@dataclass(frozen=True)
class WorkDone(Message):
    """The last message of a work stream."""

    KIND = "work_done"

    partitions: tuple[PartitionReport, ...] = bounded(items_max=REQUEST_PARTITIONS_MAX)
    summary: dict[str, Any] = bounded(default_factory=dict)  # the unit's own
    trace: tuple[TraceEntry, ...] | None = None
    # the unit needs its payload to go on (genes ask first without the grouping, hoping the
    # cache holds everything); nothing was read but metadata
    payload_needed: bool = False
    wall_s: float = bounded(low=0.0, default=0.0)
    device_cpu_s: float = bounded(low=0.0, default=0.0)
    # the device's load as the work ended: ``auto``'s cost model reads it for the next query
    # instead of asking (None: a device that does not say)
    load: LoadStatus | None = None


def decode_stream_message(data: bytes | memoryview) -> PushedBack | ChunkDone | WorkDone:
    """A work stream's metadata message, by its kind."""
    kind, header, _ = frame.decode(bytes(data))
    for cls in (PushedBack, ChunkDone, WorkDone):
        if kind == cls.KIND:
            return cls.from_json(header)
    from quarry.errors import ProtocolError

    raise ProtocolError(f"unexpected message {kind!r} in a work stream")


@dataclass(frozen=True)
class SliceRequest(Message):
    """Slice ranges a device pushed back, fetched by the host: raw (the unit's raw columns) or
    after the unit's filter (the device may have parked them already). The frame's payload is
    the work request's payload."""

    KIND = Get.SLICES

    unit: str = bounded(chars_max=UNIT_CHARS_MAX)
    domain: str = bounded(chars_max=NAME_CHARS_MAX)
    dataset: str = bounded(chars_max=NAME_CHARS_MAX)
    partition: int = bounded(low=0, high=PARTITION_MAX)
    ranges: tuple[SliceRange, ...] = bounded(items_max=DECISIONS_MAX)
    stage: Stage = Stage.RAW
    query_id: str | None = bounded(chars_max=QUERY_ID_CHARS_MAX, default=None)
    args: dict[str, Any] = bounded(default_factory=dict)
    # raw slices as stored, undecoded (``quarry.store.stored``): the receiver decompresses
    stored: bool = False

    def __post_init__(self) -> None:
        assert self.stage.pushed_back, "only raw or filtered slices are fetched"


@dataclass(frozen=True)
class ScanRequest(Message):
    """A partition's slices as stored (optionally a slice range and some columns)."""

    KIND = Get.SCAN

    domain: str = bounded(chars_max=NAME_CHARS_MAX)
    dataset: str = bounded(chars_max=NAME_CHARS_MAX)
    partition: int = bounded(low=0, high=PARTITION_MAX)
    first: int = bounded(low=0, high=SLICE_MAX, default=0)
    end: int | None = bounded(low=0, high=SLICE_MAX, default=None)  # None: to the last slice
    columns: tuple[str, ...] | None = bounded(items_max=100_000, default=None)
    stored: bool = False  # as stored, undecoded (``quarry.store.stored``)
    generation: str = bounded(chars_max=GENERATION_CHARS_MAX, default="")  # as WorkRequest's


@dataclass(frozen=True)
class CalibrationTransfer(Message):
    """N bytes through the device's external link, for the host to time."""

    KIND = Get.CALIBRATION

    bytes: int = bounded(low=1, high=EXTERNAL_TRANSFER_BYTES_MAX)
