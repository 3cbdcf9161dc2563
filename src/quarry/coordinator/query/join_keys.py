"""A join's keys, collected from its build fragment as it arrives and sent to its probe's devices.

``plan.join_filters`` names the pairs. Here a ``KeyCollector`` taps the build fragment's output
on its way to the super-plan, keeping the build column's values; the probe fragment's output is
``Deferred``: its tasks go out once every key set it waits for is in, each sent along
(``plan.keys``) if it holds at most ``KEYS_MAX`` distinct keys. The super-plan reads all
fragments at once, one thread each (``plan.spool``), so a probe waiting on its build never
holds the build up. A build that breaks off leaves its probe with nothing to send: the query is
ending with the build's error.

A pair ``through`` the host's filter (``HAVING``) keeps the build's whole rows (at most the
spool's share of the host's memory budget) and runs that part of the super-plan over them once
they are in; the keys are its output's. Pairs through the same part of the same build share one
run, and pairs of the same column of the same build one key set (``follow``). A part whose
filter compares with a subquery (TPC-DS Q6's month) also keeps the rows of the fragments that
subquery reads, tapped the same way, and runs once the last of them is in.

What each pair did (keys sent, or why not) is reported in EXPLAIN ANALYZE (``outcome``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
from substrait import plan_pb2

from quarry.errors import QueryCancelled
from quarry.plan import engine, keys, merge, tree
from quarry.plan.join_filters import JoinFilter
from quarry.plan.memory import MemoryBudget

BUILD_ROWS_MAX = 8 * keys.KEYS_MAX  # rows a collector keeps before it gives the keys up
WAIT_STEP_S = 0.1  # how often a waiting probe checks whether the query was cancelled


class KeyCollector:
    """The distinct non-null values of one output column of a build fragment."""

    def __init__(self, pair: JoinFilter, cores: int = 1, union: JoinFilter | None = None):
        self.pair = pair
        self.union = union  # the pair of several builds this one's keys are a part of
        self.united: str | None = None  # what that union sent (``_united``), shown for it
        self.cores = cores  # the host's, for the part of the super-plan a through pair runs
        self.done = threading.Event()
        self.encoded: bytes | None = None  # the keys on the wire (``plan.keys``), if sent
        # a through pair's part of the super-plan, run over the whole build: the super-plan
        # reads it instead of running the part again (``plan.computed``)
        self.computed: pa.Table | None = None
        self.outcome = "the build fragment did not finish"
        self._parts: list[pa.Array | pa.RecordBatch] | None = []
        self._rows = 0
        self._bytes = 0
        self._completed = False
        self._leader: KeyCollector | None = None
        # the other fragments a through pair's subqueries read, each tapped on its own thread;
        # the keys are taken once the last tap ends
        self._extras: dict[str, list[pa.RecordBatch]] = {n: [] for n in pair.through_reads}
        self._taps_open = 1 + len(self._extras)
        self._extras_whole = True
        self._lock = threading.Lock()

    @property
    def follows(self) -> bool:
        """Whether another collector collects this one's keys (``follow``)."""
        return self._leader is not None

    def follow(self, leader: KeyCollector) -> None:
        """Take the keys ``leader`` collects (the same build, through the same plan) instead
        of collecting them again."""
        self._leader = leader

    def tap(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """``batches`` as they are, their build column kept on the way."""
        completed = False
        try:
            for batch in batches:
                self._keep(batch)
                yield batch
            completed = self._completed = True
        finally:
            self._tap_ended()
            if not completed:
                _close(batches)

    def tap_extra(self, name: str, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """``batches`` of fragment ``name``, which a through pair's subquery reads, kept whole
        on the way (within the same bound as the build's rows)."""
        completed = False
        try:
            for batch in batches:
                with self._lock:
                    self._bytes += batch.nbytes
                    if self._bytes <= through_bytes_max():
                        self._extras[name].append(batch)
                    else:
                        self._parts = None
                yield batch
            completed = True
        finally:
            with self._lock:
                self._extras_whole &= completed
            self._tap_ended()
            if not completed:
                _close(batches)

    def _keep(self, batch: pa.RecordBatch) -> None:
        with self._lock:
            if self._parts is None:
                return
            self._rows += batch.num_rows
            self._bytes += batch.nbytes
            if self.pair.through and self._bytes > through_bytes_max():
                self._parts = None
            elif self.pair.through:
                self._parts.append(batch)
            elif self._rows > BUILD_ROWS_MAX:
                self._parts = None
            else:
                self._parts.append(batch.column(self.pair.build_column))

    def _tap_ended(self) -> None:
        """The last tap to end takes the keys (or gives them up) and wakes the probes."""
        with self._lock:
            self._taps_open -= 1
            if self._taps_open:
                return
            self._completed &= self._extras_whole
            parts, self._parts = self._parts, None
        if self._completed and parts is None:
            self.outcome = self._too_large()
        elif self._completed:
            self._distinct(parts or [])
        self._extras = {}  # the subqueries' rows: read, or given up
        self.done.set()

    def _too_large(self) -> str:
        if self.pair.through:
            return (
                f"not sent: the build's rows take more than {through_bytes_max() >> 20} MiB "
                "(the spool's share of the host's memory budget)"
            )
        return f"not sent: the build has more than {BUILD_ROWS_MAX:,} rows"

    def _distinct(self, parts: list[pa.Array | pa.RecordBatch]) -> None:
        if self.pair.through and parts:
            batches: list[pa.RecordBatch] = parts  # type: ignore[assignment]
            self.computed = run_through(self.pair, batches, self.cores, self._extras)
            parts = [self.computed.column(self.pair.through_column).combine_chunks()]
        if not parts:
            self.encoded = keys.encode(pa.array([], pa.int64()))
            self.outcome = "sent: 0 keys (the build is empty)"
            return
        unique = keys.distinct(pa.chunked_array(parts))
        if len(unique) > keys.KEYS_MAX:
            self.outcome = f"not sent: {len(unique):,} keys, over {keys.KEYS_MAX:,}"
            return
        encoded = keys.encode(unique)
        if len(encoded) > keys.KEY_SET_BYTES_MAX:
            self.outcome = (
                f"not sent: {len(unique):,} keys take {len(encoded) >> 20} MiB, over "
                f"{keys.KEY_SET_BYTES_MAX >> 20}"
            )
            return
        self.encoded = encoded
        self.outcome = f"sent: {len(unique):,} keys"

    def wait(self, stop: threading.Event, cancelled: threading.Event) -> bool:
        """Whether the build finished (False: it broke off, or the probe was stopped)."""
        source = self._leader or self
        while not source.done.wait(WAIT_STEP_S):
            if cancelled.is_set():
                raise QueryCancelled("the query was cancelled")
            if stop.is_set():
                return False
        if self._leader is not None:
            self.encoded, self.outcome = self._leader.encoded, self._leader.outcome
            self.computed = self._leader.computed
            self._completed = self._leader.completed
            self.done.set()
        return self._completed

    @property
    def completed(self) -> bool:
        """Whether the build's whole output went by."""
        return self._completed


def through_bytes_max() -> int:
    """What a build through the host's filter may hold: the spool's in-memory share."""
    return MemoryBudget.of().spool_memory_bytes_max


def run_through(
    pair: JoinFilter,
    batches: list[pa.RecordBatch],
    cores: int = 1,
    extras: Mapping[str, list[pa.RecordBatch]] | None = None,
) -> pa.Table:
    """The pair's part of the super-plan (its keys are column ``through_column``), run over the
    build fragment's rows and those of the fragments its subqueries read (in memory: they are
    at most ``through_bytes_max``) on ``cores`` partitions. Every probe waits for it and the
    devices have nothing else to do: TPC-H SF 10 Q18 merges 15 million partial sums here, 5 s
    of its 10 on one partition."""
    plan = tree.parse_plan(pair.through)
    ctx = engine.session(cores)
    merge.register_merge_functions(ctx, tuple(tree.function_names(plan).values()))
    engine.register_batches(ctx, pair.build, batches[0].schema, batches, cores)
    extras = extras or {}
    for name, schema in _extra_schemas(plan, extras).items():
        engine.register_batches(ctx, name, schema, extras[name], cores)
    frame = engine.consume(ctx, plan)
    table = frame.to_arrow_table()
    declared = frame.schema()  # the part's types as the super-plan has them (no view types)
    return table if table.schema.equals(declared) else table.cast(declared)


def _extra_schemas(
    plan: plan_pb2.Plan, extras: Mapping[str, list[pa.RecordBatch]]
) -> dict[str, pa.Schema]:
    """Each extra fragment's schema: its batches', or, where none came, the plan's read's."""
    schemas = {name: batches[0].schema for name, batches in extras.items() if batches}
    for rel in tree.iter_rels(plan):
        name = tree.named_table(rel)
        table = ".".join(name) if name is not None else None
        if table in extras and table not in schemas:
            typed = engine.read_arrow_schema(rel.read)
            schemas[table] = pa.schema([(n, t or pa.null()) for n, t in typed.items()])
    return schemas


def _close(batches: Iterable[pa.RecordBatch]) -> None:
    close = getattr(batches, "close", None)
    if close is not None:
        close()


@dataclass
class Deferred(Iterator[pa.RecordBatch]):
    """A probe fragment's output: ``start`` (its tasks, with these key sets) runs once every
    collector it waits for is done."""

    collectors: Sequence[KeyCollector]
    start: Callable[[list[tuple[int, bytes]]], Iterator[pa.RecordBatch]]
    cancelled: threading.Event

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._started: Iterator[pa.RecordBatch] | None = None
        self._items = self._run()

    def _run(self) -> Iterator[pa.RecordBatch]:
        for collector in self.collectors:
            if not collector.wait(self._stop, self.cancelled):
                return
        key_sets = []
        unions: dict[JoinFilter, list[KeyCollector]] = {}
        for collector in self.collectors:
            if collector.union is not None:
                unions.setdefault(collector.union, []).append(collector)
            elif collector.encoded is not None:
                key_sets.append((collector.pair.probe_column, collector.encoded))
        for union, members in unions.items():
            encoded = _united(members)
            if encoded is not None:
                key_sets.append((union.probe_column, encoded))
        self._started = self.start(key_sets)
        yield from self._started

    def __next__(self) -> pa.RecordBatch:
        return next(self._items)

    def close(self) -> None:
        self._stop.set()
        close = getattr(self._started, "close", None)
        if close is not None:
            close()


def _united(members: Sequence[KeyCollector]) -> bytes | None:
    """One key set of the keys of every member of a union (each member's ``united`` says so:
    its own outcome stays its own, for a collector that follows it); None, and no cut, unless
    every member's keys are in and together few enough to send: a cut by some of them would
    drop rows another read of the probe joins."""
    if any(m.encoded is None for m in members):
        told = next(m.outcome for m in members if m.encoded is None)
        outcome = f"not sent: a set with {len(members) - 1} more builds' keys, one {told}"
    else:
        parts = [keys.decode(m.encoded) for m in members]  # type: ignore[arg-type]
        if len({part.type for part in parts}) > 1:  # 32- and 64-bit integers: as 64
            parts = [part.cast(pa.int64()) for part in parts]
        unique = keys.distinct(pa.chunked_array(parts))
        encoded = keys.encode(unique)
        if len(unique) > keys.KEYS_MAX or len(encoded) > keys.KEY_SET_BYTES_MAX:
            outcome = f"not sent: {len(unique):,} keys with {len(members) - 1} more builds'"
        else:
            outcome = f"sent: {len(unique):,} keys, one set with {len(members) - 1} more builds'"
            for member in members:
                member.united = outcome
            return encoded
    for member in members:
        member.united = outcome
    return None


def wire(
    outputs: dict[str, Iterator[pa.RecordBatch]],
    pairs: Sequence[JoinFilter],
    start_probe: Callable[[str, list[tuple[int, bytes]]], Iterator[pa.RecordBatch]],
    cancelled: threading.Event,
    cores: int = 1,
) -> list[KeyCollector]:
    """Put each probe's output in ``outputs`` as ``Deferred`` (``start_probe`` sends its tasks
    with the key sets), and a collector on each build's output (a build may itself be a probe
    whose own keys come first); one through the host's filter runs it on ``cores``. Returns
    the collectors, for EXPLAIN ANALYZE."""
    collectors = [
        KeyCollector(member, cores, pair if pair.also else None)
        for pair in pairs
        for member in pair.members()
    ]
    _share_runs(collectors)
    waits: dict[str, list[KeyCollector]] = {}
    for collector in collectors:
        waits.setdefault(collector.pair.probe, []).append(collector)
    for probe, waiting in waits.items():
        outputs[probe] = Deferred(
            waiting, lambda key_sets, probe=probe: start_probe(probe, key_sets), cancelled
        )
    for collector in collectors:
        if not collector.follows:
            outputs[collector.pair.build] = collector.tap(outputs[collector.pair.build])
            for name in collector.pair.through_reads:
                outputs[name] = collector.tap_extra(name, outputs[name])
    return collectors


def _share_runs(collectors: Sequence[KeyCollector]) -> None:
    """Collectors of the same keys follow the first of them, which collects them once: those
    through the same part of the same build (the part runs once: Q18 cuts orders and lineitem
    by the same HAVING), and those of the same column of the same build (Q21 cuts two lineitem
    fragments by the order keys of a third: at SF 10, 1.4 million keys made distinct twice, one
    after the other, 0.1 and 0.4 s before the second probe could start)."""
    leaders: dict[tuple[str, bytes, int], KeyCollector] = {}
    for collector in collectors:
        pair = collector.pair
        column = pair.through_column if pair.through else pair.build_column
        leader = leaders.setdefault((pair.build, pair.through, column), collector)
        if leader is not collector:
            collector.follow(leader)
