"""A unit of work: what the one device loop runs over slice ranges (DESIGN §3, one pipeline).

The loop (``quarry.device.loop``) owns everything every kind of work shares: it reads the
partition's metadata, asks the unit which ranges it need not run (pruned by zone maps, covered by
a cache), decides per range how much to run (forced by the request, or the controller's Eq. 1
on measured drive time), reads slices through the drive's internal link, streams output through
its external link, announces pushed-back ranges, and annotates. A unit says only what its work
is:

- ``execute(chunk)``: the whole unit (stage ``full``) over a run of slices; output batches;
- ``filter(chunk)``: scan + filter only (stage ``filter``), for units that have one;
- ``raw_slice(meta, number, batch)``: what a pushed-back slice ships (the columns the host needs);
- ``plan(meta, forced)``: ranges to skip (pruned, cached), or to answer unread (``answer``);
- ``finish_partition(meta)`` / ``finish()``: output that exists only once everything is seen.

CPU work goes through ``context.compute`` (a slot of the drive, stretched by its compute
factor), which also measures the drive's time: that is what the controller judges by, the same
for every kind of work.

A new kind of work is one module: a ``Unit`` subclass decorated with ``@register``. Modules in
``quarry.device.units`` are found by themselves; applications list theirs in ``UNIT_MODULES``.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, TypeVar

import pyarrow as pa

from quarry.auth.tokens import Role
from quarry.device.column_cache import ColumnCache, ColumnKey
from quarry.device.emulation import Emulator
from quarry.errors import KeyNotFound, QuarryError
from quarry.lazy import cached_property
from quarry.protocol.stage import Skip, Stage
from quarry.protocol.work import SliceRange, WorkRequest
from quarry.store import naming
from quarry.store import partition as partitions
from quarry.store.kv import KeyValueStore
from quarry.store.partition import PartitionMeta
from quarry.tally import Tally

T = TypeVar("T")
UNITS_PACKAGE = "quarry.device.units"
# Applications whose import registers units of their own; loaded on first use.
UNIT_MODULES = (
    "quarry.genes.device",
    "quarry.genes.axis_unit",
    "quarry.genes.hvg_unit",
    "quarry.genes.value_counts",
    "quarry.capacity.device",
    "quarry.offload.device",
)


class UnitError(QuarryError, ValueError):
    """A request a unit cannot take (unknown unit, bad arguments): the message names it."""

    code = "unit_error"


class _ThreadCounts(threading.local):
    """What one thread of a unit counted (partitions and chunks run on threads of their own):
    each thread starts from nothing."""

    def __init__(self) -> None:
        self.drive_s = 0.0
        self.computed = Tally()


@dataclass
class UnitContext:
    """What a unit may use of its device: the store (for caches), and compute slots that
    count the drive's time."""

    store: KeyValueStore | None  # None on the host
    emulator: Emulator
    device: str
    drive_s: float = 0.0
    # all compute of the unit, every thread: wall (its slots' waits and stretches too), CPU
    computed: Tally = field(default_factory=Tally)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _thread: _ThreadCounts = field(default_factory=_ThreadCounts, repr=False)

    @property
    def drive_s_here(self) -> float:
        """The drive's seconds of work this thread ran (partitions may run at once)."""
        return self._thread.drive_s

    @property
    def computed_here(self) -> Tally:
        """This thread's compute so far (a copy: subtract two to time a stretch of work)."""
        mine = self._thread.computed
        return Tally(mine.wall_s, mine.cpu_s)

    def _count(self, drive_s: float, wall_s: float, cpu_s: float) -> None:
        self._thread.drive_s += drive_s
        mine = self._thread.computed
        mine.wall_s += wall_s
        mine.cpu_s += cpu_s
        with self._lock:
            self.drive_s += drive_s
            self.computed.wall_s += wall_s
            self.computed.cpu_s += cpu_s

    def compute(self, work: Callable[[], T]) -> T:
        """Run CPU work in a slot of the drive, stretched by its compute factor (and load)."""
        wall, cpu = time.perf_counter(), time.thread_time()
        result, drive_s = self.emulator.run_timed(work)
        self._count(drive_s, time.perf_counter() - wall, time.thread_time() - cpu)
        return result

    def compute_elsewhere(self, work: Callable[[], tuple[T, float]]) -> T:
        """CPU work another process does for the drive (an offload worker), which reports the
        CPU seconds it spent: held in a slot of the drive, stretched and counted like
        ``compute``."""
        wall = time.perf_counter()
        with self.emulator.slot():
            result, work_s = work()
            drive_s = work_s + self.emulator.stretch(work_s)
        self._count(drive_s, time.perf_counter() - wall, work_s)
        return result

    # ---- a small cache of derived results in the device's own store -------------------------

    def cache_key(self, domain: str, dataset: str, *parts: str) -> str:
        return f"{naming.CACHE_PREFIX}{domain}/{dataset}/" + "/".join(parts)

    def cache_get(self, key: str) -> bytes | None:
        try:
            keys = [k for k in self.store.list(key) if k == key or k.startswith(key + ".")]
            if not keys:
                return None
            return b"".join(self.store.get_many(keys))
        except KeyNotFound:
            return None

    def cache_put(self, key: str, value: bytes) -> None:
        """Store a cached result (striped when over the value limit), replacing any older one."""
        limit = self.store.kv_bytes_max
        with self.store.transaction() as txn:
            for old in txn.list(key):
                if old == key or old.startswith(key + "."):
                    txn.delete(old)
            if len(value) <= limit:
                txn.put(key, value)
            else:
                for i in range(0, len(value), limit):
                    txn.put(naming.stripe_key(key, i // limit), value[i : i + limit])


def host_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


_HOST: dict[str, Emulator] = {}
_HOST_LOCK = threading.Lock()


def set_host_profile(profile: Any | None) -> None:
    """The host's own profile, for this process (None: the machine as it is). Its cores are
    the slots completions run in, its compute factor stretches them, and its external link is
    the host's ingress: every batch any device sends this process passes that one bucket."""
    with _HOST_LOCK:
        _HOST.pop("emulator", None)
        if profile is not None:
            cores = profile.cores or host_cores()
            _HOST["emulator"] = Emulator(replace(profile, cores=min(cores, host_cores() * 64)))


def host_emulator() -> Emulator:
    """The host's cores as slots, shared by every completion in this process: handed-back work
    runs at most one piece per core at a time, so many device streams completing at once hold
    the host's memory to a few groups instead of one per stream. With a host profile
    (``set_host_profile``), its limits too."""
    with _HOST_LOCK:
        if "emulator" not in _HOST:
            from quarry.device.profile import get_profile

            _HOST["emulator"] = Emulator(replace(get_profile("host"), cores=host_cores()))
        return _HOST["emulator"]


def host_context() -> UnitContext:
    """Where the host runs a unit to complete handed-back work: its own CPU, under the host's
    profile when one is set."""
    return UnitContext(store=None, emulator=host_emulator(), device="host")


@dataclass
class Chunk:
    """A run of slices of one partition that the loop hands to a unit. ``batches()`` reads them
    off the store as the unit consumes them, through the drive's internal link, and counts them."""

    meta: PartitionMeta
    numbers: list[int]
    store: KeyValueStore
    emulator: Emulator
    columns: list[str] | None = None
    # the rows [first, end) of a slice the unit needs (``Unit.slice_rows``; None: all of it)
    rows_of: Callable[[int], tuple[int, int] | None] | None = None
    # decoded columns in the device's memory (``device.column_cache``; None: read every time)
    cache: ColumnCache | None = None
    cache_admits: bool = True  # whether what it reads off the store enters the cache
    rows_read: int = 0
    bytes_read: int = 0  # of the slices' columns read, off the store or from the cache
    bytes_cached: int = 0  # of which from the cache
    verified: int = 0  # slices whose checksums were checked as they were read (or cached)
    preloaded: list[pa.RecordBatch] | None = None
    read_time: Tally = field(default_factory=Tally)  # off the store, through the internal link
    decode_time: Tally = field(default_factory=Tally)

    def load(self) -> Chunk:
        """Read every slice now: the loop's read-ahead does, while the unit computes the chunk
        before (a drive's reads and its cores work at once)."""
        self.preloaded = list(self._read())
        return self

    def batches(self) -> Iterator[pa.RecordBatch]:
        if self.preloaded is not None:
            return iter(self.preloaded)
        return self._read()

    def joined_batches(self) -> list[pa.RecordBatch]:
        """The chunk's rows as ``batches`` gives them, but in as few batches as the cache holds
        the columns of its slices end to end (``ColumnCache.get_runs``; one for a chunk that
        entered as one run): no copy, and whatever runs over the chunk goes once over each
        piece of a column rather than once per slice."""
        if self.preloaded is None and self.cache is not None:
            joined = self._joined()
            if joined is not None:
                return joined
        return list(self.batches())

    def _joined(self) -> list[pa.RecordBatch] | None:
        if self.rows_of is not None and any(self.rows_of(n) is not None for n in self.numbers):
            return None  # some slice is read in part
        with self.read_time.timing():
            keys = [self._cache_keys(number, None) for number in self.numbers]
            if not all(keys):
                return None
            pieces = self.cache.get_runs(keys)  # type: ignore[union-attr]
        if pieces is None:
            return None
        sizes = partitions.whole_read_bytes(self.meta, self.columns)
        read = sum(sizes[n] for n in self.numbers)
        self.rows_read += sum(len(arrays[0]) for arrays in pieces)
        self.bytes_read += read
        self.bytes_cached += read
        self.verified += len(self.numbers)
        schema = self.meta.columns([key.column for key in keys[0]]).schema
        return [pa.RecordBatch.from_arrays(arrays, schema=schema) for arrays in pieces]

    def _read(self) -> Iterator[pa.RecordBatch]:
        # One snapshot for the chunk, read in place: its batches hold it open while they live.
        snapshot = self.store.snapshot()
        missed: list[tuple[list[ColumnKey], list[pa.Array]]] = []  # enter the cache as a run
        for number in self.numbers:
            info = self.meta.slices[number]
            rows = self.rows_of(number) if self.rows_of is not None else None
            read = partitions.read_bytes(self.meta, number, self.columns, rows)
            keys = self._cache_keys(number, rows)
            if keys:
                with self.read_time.timing():
                    cached = self._cached(keys)
                if cached is not None:
                    self.rows_read += cached.num_rows
                    self.bytes_read += read
                    self.bytes_cached += read
                    self.verified += 1
                    yield cached
                    continue
            with self.read_time.timing():
                self.emulator.read(read)
                fetched = partitions.fetch_slice(
                    self.store, self.meta, number, self.columns, snapshot, rows
                )
            with self.decode_time.timing():
                batch = partitions.decode_read(self.meta, fetched)
            # Paired with the write side: each slice (or run of its blocks) holds the rows its
            # metadata promised, and what was read is what the emulated link carried.
            first, end = (
                (0, info.rows) if fetched.span is None else info.block_rows_of(fetched.span)
            )
            assert batch.num_rows == end - first, (number, batch.num_rows, first, end)
            assert fetched.bytes_read == read, (number, fetched.bytes_read, read)
            self.rows_read += batch.num_rows
            self.bytes_read += read
            self.verified += info.checksums is not None  # checked by ``decode_read``
            if keys and self.cache_admits:
                missed.append((keys, batch.columns))
            yield batch
        if missed:
            with self.decode_time.timing():
                self.cache.put_run(missed)  # type: ignore[union-attr]

    def _cache_keys(self, number: int, rows: tuple[int, int] | None) -> list[ColumnKey]:
        """The cache's keys of the columns read of a slice; none where it keeps nothing: no
        cache, a slice stored whole or without checksums, or some of its blocks wanted."""
        info = self.meta.slices[number]
        if self.cache is None or info.checksums is None or info.columns is None:
            return []
        if rows is not None and info.block_span(rows) is not None:
            return []
        meta = self.meta
        dataset = f"{meta.domain}/{meta.dataset}"
        return [
            ColumnKey(dataset, meta.partition, number, i, info.checksums[i])
            for i in self._column_indices
        ]

    @cached_property
    def _column_indices(self) -> list[int]:
        """Schema positions of the columns read: the same for every slice of the chunk."""
        return partitions.column_indices(self.meta, self.columns)

    def _cached(self, keys: list[ColumnKey]) -> pa.RecordBatch | None:
        arrays = self.cache.get(keys)  # type: ignore[union-attr]
        if arrays is None:
            return None
        schema = self.meta.columns([key.column for key in keys]).schema
        return pa.RecordBatch.from_arrays(arrays, schema=schema)

    @property
    def bytes_stored(self) -> int:
        return sum(self.meta.slices[n].bytes_stored for n in self.numbers)

    @property
    def range(self) -> SliceRange:
        return SliceRange(self.numbers[0], self.numbers[-1] + 1)


def conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """DataFusion may report nullability differently chunk to chunk; the stream's schema rules."""
    if batch.schema.equals(schema):
        return batch
    return pa.RecordBatch.from_arrays(batch.columns, schema=schema)


@dataclass(frozen=True)
class Skipped:
    """Slices a unit need not run, and why."""

    range: SliceRange
    skip: Skip
    reason: str


class Unit:
    """One kind of work near the data. Subclasses set NAME and implement ``execute``."""

    NAME: ClassVar[str] = ""
    # What the device may do with a range besides running the whole unit. A unit without RAW
    # cannot push back: the device always runs it (capacity kernels need whole partitions).
    STAGES: ClassVar[frozenset[Stage]] = frozenset({Stage.FULL, Stage.RAW})
    # Slices run together: amortises per-call setup, bounds device memory. None: a whole
    # partition is one chunk.
    CHUNK_SLICES_MAX: ClassVar[int | None] = 4
    # A chunk's output is whole once streamed (no state carries to later chunks): the loop marks
    # each chunk done, so a host can resume the rest on a replica if this device dies. A unit
    # that carries state (genes: one Combine at the end) is resumed from its start.
    RESUMABLE: ClassVar[bool] = False
    # The unit keeps no state across chunks, so a drive may run a request's chunks at once,
    # one per core, whatever partitions they come from (its ``execute`` is safe from several
    # threads; ``loop.ChunkSlots``).
    CHUNKS_AT_ONCE: ClassVar[bool] = False
    # Who may run it: reading kinds of work need a reader's token; code that computes on the
    # device beyond a query (kernels, offloaded programs) an admin's.
    ROLE: ClassVar[Role] = Role.READER

    def __init__(self, request: WorkRequest, payload: bytes, context: UnitContext):
        self.request = request
        self.payload = payload
        self.context = context

    @property
    def output_schema(self) -> pa.Schema:
        raise NotImplementedError

    def columns(self) -> list[str] | None:
        """The columns ``execute``, ``filter`` and a raw push back read off the store (None:
        all); the device reads only these byte ranges of each slice."""
        return None

    def chunk_slices(self, meta: PartitionMeta) -> int | None:
        """How many slices of this partition run together at most (None: all of them)."""
        return self.CHUNK_SLICES_MAX

    def shape(self) -> str | None:
        """What a failed stage of this work quarantines on the device for its dataset: the
        shape of its plan, constants left out (None: nothing is; its failures are its
        caller's errors, or pushed back one range at a time)."""
        return None

    def slice_rows(self, meta: PartitionMeta, number: int) -> tuple[int, int] | None:
        """The rows [first, end) of slice ``number`` that ``execute`` needs (None: all). A
        blocked slice is then read only in the blocks that hold them, so ``execute`` may be
        handed more rows than asked for, never fewer."""
        return None

    def plan(self, meta: PartitionMeta, not_here: frozenset[int]) -> list[Skipped]:
        """Ranges of this partition the unit need not run (``not_here``: slices the request
        pushes back or another replica already ran)."""
        return []

    def answer(self, meta: PartitionMeta, answered: SliceRange) -> Iterable[pa.RecordBatch]:
        """The output of a range ``plan`` said it answers unread (``Skip.ANSWERED``)."""
        raise NotImplementedError(f"unit {self.NAME} answers no range unread")

    def payload_needed(self) -> bool:
        """After ``plan`` of every partition: the unit cannot go on without its payload."""
        return False

    def execute(self, chunk: Chunk) -> Iterable[pa.RecordBatch]:
        raise NotImplementedError

    def filter(self, chunk: Chunk) -> dict[int, list[pa.RecordBatch]]:
        """Scan + filter, per slice number (units with Stage.FILTER in STAGES)."""
        raise NotImplementedError

    @property
    def raw_schema(self) -> pa.Schema | None:
        """What a raw push back ships (None: the slices whole)."""
        return None

    def raw_schema_of(self, meta: PartitionMeta) -> pa.Schema:
        return self.raw_schema or meta.schema

    def raw_slice(self, meta: PartitionMeta, number: int, batch: pa.RecordBatch) -> pa.RecordBatch:
        """A pushed-back slice as it ships: the columns the host needs (a unit may add what the
        host must know of where the rows came from)."""
        return batch.select(self.raw_schema_of(meta).names)

    def ships_as_stored(self) -> bool:
        """Whether a raw range may ship as stored, undecoded: the unit adds nothing to raw rows
        and drops none."""
        return type(self).raw_slice is Unit.raw_slice

    def finish_partition(self, meta: PartitionMeta) -> Iterable[pa.RecordBatch]:
        return ()

    def complete(self, stage: Stage, batches: Iterable[pa.RecordBatch]) -> Iterable[pa.RecordBatch]:
        """On the host: the rest of the unit over rows of ranges handed back at ``stage``."""
        raise NotImplementedError(f"unit {self.NAME} cannot be completed on the host")

    def finish(self) -> Iterable[pa.RecordBatch]:
        return ()

    def summary(self) -> dict[str, Any]:
        return {}


REGISTRY: dict[str, type[Unit]] = {}
_discovered = False


def register(cls: type[Unit]) -> type[Unit]:
    assert cls.NAME, f"{cls.__name__} has no NAME"
    assert cls.NAME not in REGISTRY or REGISTRY[cls.NAME] is cls, f"unit {cls.NAME} twice"
    REGISTRY[cls.NAME] = cls
    return cls


def _discover() -> None:
    global _discovered
    if _discovered:
        return
    package = importlib.import_module(UNITS_PACKAGE)
    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{UNITS_PACKAGE}.{info.name}")
    for module in UNIT_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as error:  # an application not installed on this device
            if error.name != module:
                raise
    _discovered = True


def lookup(name: str) -> type[Unit]:
    if name not in REGISTRY:
        _discover()
    if name not in REGISTRY:
        raise UnitError(
            f"no unit of work named {name!r}; this device runs: {', '.join(sorted(REGISTRY))}"
        )
    return REGISTRY[name]
