"""The one device loop, in process: prune → decide → execute → stream → push back → annotate."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import pyarrow as pa
import pytest

from quarry.device import loop
from quarry.device.admission import Admission
from quarry.device.controller import Controllers
from quarry.device.emulation import Emulator
from quarry.device.parked import Parked
from quarry.device.profile import get_profile
from quarry.device.quarantine import Quarantine
from quarry.device.unit import Chunk, Skipped, Unit, UnitError
from quarry.errors import PlanNotSupported, StageFailed
from quarry.protocol.stage import PushBack, Skip, Stage
from quarry.protocol.work import (
    ForcedDecision,
    PushedBack,
    SliceRange,
    SliceRequest,
    WorkDone,
    WorkRequest,
    decode_stream_message,
)
from quarry.store import partition as partitions
from quarry.store.kv import KeyValueStore

ROWS = 20_000


class Writer:
    """What a Flight exchange writer receives, kept for the test."""

    def __init__(self) -> None:
        self.schema: pa.Schema | None = None
        self.batches: list[pa.RecordBatch] = []
        self.messages: list[PushedBack | WorkDone] = []

    def begin(self, schema: pa.Schema) -> None:
        self.schema = schema

    def write_batch(self, batch: pa.RecordBatch) -> None:
        self.batches.append(batch)

    def write_metadata(self, buffer: pa.Buffer) -> None:
        self.messages.append(decode_stream_message(buffer.to_pybytes()))

    @property
    def done(self) -> WorkDone:
        assert isinstance(self.messages[-1], WorkDone)
        return self.messages[-1]

    @property
    def notices(self) -> list[PushedBack]:
        return [m for m in self.messages if isinstance(m, PushedBack)]


class Echo(Unit):
    """A test unit: ships the ids of what it ran; filter keeps even ids; prunes slice 0 when
    asked. Every method records what the loop asked of it."""

    NAME = "test.echo"
    STAGES = frozenset({Stage.FULL, Stage.FILTER, Stage.RAW})
    CHUNK_SLICES_MAX = 3
    SCHEMA = pa.schema([("id", pa.int64())])
    busy_s = 0.0

    def __init__(self, request, payload, context):
        super().__init__(request, payload, context)
        self.chunks: list[list[int]] = []
        self.finished: list[int] = []

    @property
    def output_schema(self) -> pa.Schema:
        return self.SCHEMA

    def plan(self, meta, forced):
        if self.request.args.get("prune_first"):
            return [Skipped(SliceRange(0, 1), Skip.PRUNED, "test prunes slice 0")]
        return []

    def payload_needed(self) -> bool:
        return bool(self.request.args.get("needs_payload")) and not self.payload

    def shape(self) -> str | None:
        return self.request.args.get("shape")

    def execute(self, chunk: Chunk):
        self.chunks.append(list(chunk.numbers))
        batches = list(chunk.batches())
        return self.context.compute(lambda: self._work([b.select(["id"]) for b in batches]))

    def _work(self, out):
        end = time.thread_time() + self.busy_s
        while time.thread_time() < end:
            pass
        return out

    def filter(self, chunk: Chunk):
        return {
            n: [b.filter(pa.compute.equal(pa.compute.bit_wise_and(b["id"], 1), 0))]
            for n, b in zip(chunk.numbers, chunk.batches(), strict=True)
        }

    def finish_partition(self, meta):
        self.finished.append(meta.partition)
        return []


@pytest.fixture
def runtime(tmp_path):
    store = KeyValueStore(tmp_path, kv_bytes_max=16 * 1024)
    table = pa.table({"id": pa.array(range(ROWS), pa.int64()), "v": pa.array([1.0] * ROWS)})
    meta = partitions.PartitionMeta(
        domain="d",
        dataset="t",
        partition=0,
        ingest={
            "id": "i",
            "first_partition": 0,
            "partitions": 1,
            "replicas": 1,
            "mode": "create",
            "created_at": 0.0,
        },
        schema=table.schema,
        compression="none",
    )
    writer = partitions.PartitionWriter(store, meta)
    writer.write(table.to_batches()[0])
    writer.finish()
    partitions.commit(store, "i", "dev0")
    admission = Admission("dev0", exchanges_max=4, queued_bytes_max=1 << 30)
    return loop.Runtime(
        store, Emulator(get_profile("host")), "dev0", admission, Controllers(), Parked()
    )


@pytest.fixture(autouse=True)
def echo_unit(monkeypatch):
    from quarry.device import unit

    monkeypatch.setitem(unit.REGISTRY, Echo.NAME, Echo)
    Echo.busy_s = 0.0
    yield


def _run(runtime, **fields) -> Writer:
    request = WorkRequest(unit=Echo.NAME, domain="d", dataset="t", partitions=(0,))
    writer = Writer()
    loop.run_work(runtime, replace(request, **fields), b"", writer)
    return writer


def _slices(runtime) -> int:
    return len(partitions.read_meta(runtime.store, "d", "t", 0).slices)


def test_everything_runs_in_chunks_and_every_row_ships_once(runtime):
    writer = _run(runtime)
    ids = pa.concat_arrays([b["id"] for b in writer.batches])
    assert sorted(ids.to_pylist()) == list(range(ROWS))
    (report,) = writer.done.partitions
    m = report.metrics.counters
    assert m.slices_total == m.slices_scanned == m.slices_executed == _slices(runtime)
    assert m.rows_read == m.rows_shipped == ROWS
    assert [d.stage for d in report.decisions] == [Stage.FULL]
    assert writer.notices == []


def test_chunks_are_bounded_by_the_unit_and_the_request(runtime):
    from quarry.device import unit

    instances = []

    class Spy(Echo):
        def __init__(self, *args):
            super().__init__(*args)
            instances.append(self)

    unit.REGISTRY[Echo.NAME] = Spy
    _run(runtime)
    sizes = [len(c) for c in instances[-1].chunks]
    limit = Echo.CHUNK_SLICES_MAX
    assert sum(sizes) == _slices(runtime) and all(size == limit for size in sizes[:-1])
    # the last takes a remainder under half a chunk with it rather than run it on its own
    assert limit // 2 < sizes[-1] <= limit * 3 // 2 or len(sizes) == 1
    _run(runtime, chunk_slices=2)
    assert max(len(c) for c in instances[-1].chunks) == 2
    assert instances[-1].finished == [0]


def test_forced_push_back_is_announced_and_each_slice_counted_once(runtime):
    slices = _slices(runtime)
    assert slices >= 6
    forced = (ForcedDecision(0, 1, 3, Stage.RAW), ForcedDecision(0, 3, 5, Stage.FILTER))
    writer = _run(runtime, forced=forced, query_id="q")
    raw, filtered = writer.notices
    assert (raw.stage, raw.ranges) == (Stage.RAW, (SliceRange(1, 3),))
    assert (filtered.stage, filtered.ranges) == (Stage.FILTER, (SliceRange(3, 5),))
    assert raw.rows > 0 and filtered.rows == 0  # the device read the filtered range itself
    (report,) = writer.done.partitions
    m = report.metrics.counters
    assert m.slices_pushed_back == 4 and m.slices_executed == slices - 4
    assert m.pushed_back_by() == {PushBack.FORCED: 4}  # each slice counted under its reason
    assert {d.pushed_back for d in report.decisions if d.stage != Stage.FULL} == {"forced"}
    # the device read what it ran and what it filtered; the raw range is read when fetched
    assert m.slices_scanned == slices - 2
    assert [(d.first, d.end, d.stage) for d in report.decisions][:3] == [
        (0, 1, Stage.FULL),
        (1, 3, Stage.RAW),
        (3, 5, Stage.FILTER),
    ]
    parked = runtime.parked.take(("q", 0, 3))
    assert parked is not None and all(v % 2 == 0 for b in parked for v in b["id"].to_pylist())


def test_pruned_ranges_are_annotated_and_never_read(runtime):
    writer = _run(runtime, args={"prune_first": True})
    (report,) = writer.done.partitions
    assert report.decisions[0].stage is Skip.PRUNED
    assert report.metrics.counters.slices_pruned == 1
    assert report.metrics.counters.slices_scanned == _slices(runtime) - 1


def test_a_unit_that_needs_its_payload_reads_nothing_and_says_so(runtime):
    writer = _run(runtime, args={"needs_payload": True})
    assert writer.done.payload_needed and writer.batches == []
    assert writer.done.partitions == ()


def test_a_unit_without_push_back_refuses_to_be_pushed_back(runtime, monkeypatch):
    monkeypatch.setattr(Echo, "STAGES", frozenset({Stage.FULL}))
    with pytest.raises(UnitError, match="cannot push back"):
        _run(runtime, forced=(ForcedDecision(0, 0, 1, Stage.RAW),))


def test_the_drive_time_is_the_emulated_compute(runtime):
    """A drive three times slower than the host takes three times the CPU work it does; that,
    not the wall clock (slot waits, reads), is what the controller judges by."""
    runtime.emulator = Emulator(replace(get_profile("host"), name="slow", compute_factor=3.0))
    Echo.busy_s = 0.002
    writer = _run(runtime)
    (report,) = writer.done.partitions
    chunks = -(-_slices(runtime) // Echo.CHUNK_SLICES_MAX)
    assert report.metrics.counters.drive_s == pytest.approx(3 * Echo.busy_s * chunks, rel=0.35)


def test_a_chunk_every_row_of_which_passes_runs_without_the_filter(runtime, monkeypatch):
    """``id`` rises through the slices: the chunks past the threshold run the unfiltered stage,
    the one across it the whole sub-plan, and the sum is every passing row's."""
    from quarry.coordinator.query.fragments import _args
    from quarry.device.units.substrait import SubstraitUnit, stages_payload
    from quarry.plan import decompose

    meta = partitions.read_meta(runtime.store, "d", "t", 0)
    low = ROWS // 3 + 7
    (fragment,) = decompose(
        f"SELECT count(*) AS n FROM d.t WHERE id >= {low}", {"d/t": meta.schema}, "always"
    ).fragments
    stages = {Stage(name): data for name, data in fragment.stages.items()}
    args = _args(fragment, stages, fragment.output_schema, (), fragment.unfiltered)
    payload = stages_payload(stages, (), fragment.unfiltered)
    chosen: list[bool] = []
    full_for = SubstraitUnit._full_for

    def spy(self, chunk):
        stage = full_for(self, chunk)
        chosen.append(stage == self.unfiltered)
        return stage

    monkeypatch.setattr(SubstraitUnit, "_full_for", spy)
    request = WorkRequest(
        unit=SubstraitUnit.NAME, domain="d", dataset="t", partitions=(0,), args=args.to_json()
    )
    writer = Writer()
    loop.run_work(runtime, replace(request, chunk_slices=2), payload, writer)
    counts = pa.concat_arrays([b.column(0) for b in writer.batches])
    assert sum(counts.to_pylist()) == ROWS - low
    assert True in chosen and False in chosen


@pytest.mark.parametrize(
    "sql, placed",
    [
        ("SELECT id, count(*) AS n FROM d.t GROUP BY id", True),  # a group key: cut below
        ("SELECT id + 0 AS id, count(*) AS n FROM d.t GROUP BY id + 0", False),  # computed
    ],
)
def test_a_key_set_on_a_stored_group_key_cuts_the_rows_before_they_are_aggregated(
    runtime, monkeypatch, sql, placed
):
    """TPC-H Q17 asks for lineitem's average quantity per part for 204 of 200,000 parts: the
    device aggregates the rows of those parts only. A key on a computed column still cuts the
    output. The answer is the same either way."""
    from quarry.coordinator.query.fragments import _args
    from quarry.device.units import substrait
    from quarry.plan import decompose
    from quarry.plan import keys as key_sets

    meta = partitions.read_meta(runtime.store, "d", "t", 0)
    (fragment,) = decompose(sql, {"d/t": meta.schema}, "always").fragments
    stages = {Stage(name): data for name, data in fragment.stages.items()}
    wanted = [3, 4_000, ROWS - 1, ROWS + 5]
    encoded = key_sets.encode(pa.array(wanted, pa.int64()))
    key_set = [(0, encoded)]
    args = _args(fragment, stages, fragment.output_schema, key_set, b"")
    payload = substrait.stages_payload(stages, [encoded])
    engine_rows: list[int] = []
    run = substrait._run

    def counted(stage, schema, batches):
        batches = list(batches)
        engine_rows.append(sum(b.num_rows for b in batches))
        return run(stage, schema, batches)

    monkeypatch.setattr(substrait, "_run", counted)
    request = WorkRequest(
        unit=substrait.SubstraitUnit.NAME,
        domain="d",
        dataset="t",
        partitions=(0,),
        args=args.to_json(),
    )
    writer = Writer()
    loop.run_work(runtime, request, payload, writer)
    got = pa.Table.from_batches(writer.batches)
    got = got.sort_by(got.schema.names[0])
    assert got.column(0).to_pylist() == [3, 4_000, ROWS - 1]
    assert got.column(1).to_pylist() == [1, 1, 1]
    assert sum(engine_rows) == (3 if placed else ROWS)


@pytest.mark.parametrize("stage", [Stage.RAW, Stage.FILTER])
def test_a_range_handed_back_ships_only_the_rows_a_key_set_keeps(runtime, stage):
    """The host fetches a range a device handed back: raw or filtered, its rows are cut by the
    join's key set on the device, not shipped whole for the host to cut."""
    from quarry.coordinator.query.fragments import _args
    from quarry.device.units import substrait
    from quarry.plan import decompose
    from quarry.plan import keys as key_sets

    meta = partitions.read_meta(runtime.store, "d", "t", 0)
    sql = "SELECT id, v FROM d.t WHERE v > 0"
    (fragment,) = decompose(sql, {"d/t": meta.schema}, "always").fragments
    stages = {Stage(name): data for name, data in fragment.stages.items()}
    encoded = key_sets.encode(pa.array([5, 6, ROWS - 2], pa.int64()))
    args = _args(fragment, stages, fragment.output_schema, [(0, encoded)], b"")
    payload = substrait.stages_payload(stages, [encoded])
    request = SliceRequest(
        unit=substrait.SubstraitUnit.NAME,
        domain="d",
        dataset="t",
        partition=0,
        ranges=(SliceRange(0, len(meta.slices)),),
        stage=stage,
        args=args.to_json(),
        stored=True,
    )
    _, batches = loop.fetch_slices(runtime, request, payload)
    shipped = pa.Table.from_batches(list(batches))
    assert sorted(shipped.column("id").to_pylist()) == [5, 6, ROWS - 2]


class Together(Echo):
    """Echo whose chunks may run at once; each waits, a bounded time, for another to run beside
    it, so a loop that ran them one at a time fails here instead of passing slowly."""

    NAME = "test.together"
    CHUNKS_AT_ONCE = True
    met = None
    fail_at = None
    error: Callable[[str], Exception] = ValueError
    # chunks after the failing one wait for this (the quarantine entered): on a loaded machine
    # the other lane could otherwise run every later chunk before the failure is seen
    after_failure: Callable[[], bool] | None = None
    failed = False  # the failing chunk raised

    def execute(self, chunk: Chunk):
        if chunk.numbers[0] == self.fail_at:
            type(self).failed = True
            raise type(self).error(f"chunk at slice {chunk.numbers[0]} broke")
        after_failure = type(self).after_failure
        if after_failure is not None and chunk.numbers[0] > self.fail_at:
            deadline = time.monotonic() + 10
            while not after_failure() and time.monotonic() < deadline:
                time.sleep(0.005)
            time.sleep(0.05)  # the loop marks the rest declined just after the entry
        if chunk.numbers[0] < 2 * self.CHUNK_SLICES_MAX:  # the first two chunks meet
            type(self).met.wait(timeout=10)
        return super().execute(chunk)


@pytest.fixture
def together(runtime, monkeypatch):
    import threading

    from quarry.device import unit

    monkeypatch.setitem(unit.REGISTRY, Together.NAME, Together)
    Together.met = threading.Barrier(2)
    Together.fail_at = None
    Together.error = ValueError
    Together.after_failure = None
    Together.failed = False
    runtime.emulator = Emulator(replace(get_profile("host"), name="two-cores", cores=2))
    return runtime


def test_a_drive_runs_chunks_of_one_partition_on_all_its_cores(together):
    """One partition on a two-core drive: its chunks run two at once (the first two wait for
    each other), and every row still ships once with every slice counted once."""
    writer = _run(together, unit=Together.NAME)
    assert not Together.met.broken
    ids = pa.concat_arrays([b["id"] for b in writer.batches])
    assert sorted(ids.to_pylist()) == list(range(ROWS))
    (report,) = writer.done.partitions
    m = report.metrics.counters
    assert m.slices_total == m.slices_scanned == m.slices_executed == _slices(together)
    assert m.rows_read == m.rows_shipped == ROWS
    assert [(d.first, d.end, d.stage) for d in report.decisions] == [
        (0, _slices(together), Stage.FULL)
    ]


def test_a_chunk_that_fails_among_others_fails_the_work_with_its_error(together):
    """A chunk that breaks while others run: the work ends with its error, after the others
    have stopped writing, and no WorkDone claims the partition done."""
    Together.fail_at = 3 * Together.CHUNK_SLICES_MAX
    writer = Writer()
    request = WorkRequest(unit=Together.NAME, domain="d", dataset="t", partitions=(0,))
    with pytest.raises(ValueError, match="chunk at slice 9 broke"):
        loop.run_work(together, request, b"", writer)
    assert not any(isinstance(m, WorkDone) for m in writer.messages)


def _every_slice_once(report, slices: int) -> None:
    """The annotation covers each slice once, and the counts agree with it."""
    ranges = sorted((d.first, d.end) for d in report.decisions)
    assert ranges[0][0] == 0 and ranges[-1][1] == slices, ranges
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:])), ranges
    m = report.metrics.counters
    assert m.slices_executed + m.slices_pushed_back == slices
    assert sum(m.pushed_back_by().values()) == m.slices_pushed_back


def test_a_stage_that_fails_goes_back_and_its_shape_into_quarantine(together):
    """A chunk whose stage fails on the device (among others running) goes back raw for
    ``failed_stage`` and every range after it for ``quarantine``; no row is lost or sent twice.
    The next request of that shape goes back whole, unread, until the quarantine is lifted;
    a device that restarts still holds it."""
    together.quarantine = Quarantine(together.store.path, "dev0", quarantine_s=60.0)
    Together.fail_at, Together.error = 3 * Together.CHUNK_SLICES_MAX, StageFailed
    Together.after_failure = lambda: bool(together.quarantine.held())
    slices = _slices(together)
    writer = _run(together, unit=Together.NAME, args={"shape": "s1"})
    (report,) = writer.done.partitions
    _every_slice_once(report, slices)
    by = report.metrics.counters.pushed_back_by()
    assert by[PushBack.FAILED_STAGE] == Together.CHUNK_SLICES_MAX and by[PushBack.QUARANTINE] > 0
    failed = [d for d in report.decisions if d.pushed_back is PushBack.FAILED_STAGE]
    assert [(d.first, d.stage) for d in failed] == [(Together.fail_at, Stage.RAW)]
    shipped = sum(b.num_rows for b in writer.batches) + sum(n.rows for n in writer.notices)
    assert shipped == ROWS  # what ran here, and what the host reads back
    (held,) = together.quarantine.held()
    assert (held.dataset, held.unit, held.shape, held.cause) == (
        "d/t",
        Together.NAME,
        "s1",
        "failed_stage",
    )
    assert held in Quarantine(together.store.path, "dev0").held()  # kept across a restart

    Together.fail_at = Together.after_failure = None  # the stage would run now: the quarantine
    # holds it back all the same
    again = _run(together, unit=Together.NAME, args={"shape": "s1"})
    (report,) = again.done.partitions
    m = report.metrics.counters
    assert m.pushed_back_by() == {PushBack.QUARANTINE: slices} and m.slices_scanned == 0
    assert again.batches == [] and "quarantined here" in report.decisions[0].reason
    other = _run(together, unit=Together.NAME, args={"shape": "s2"})  # another shape runs
    assert other.done.partitions[0].metrics.counters.slices_executed == slices

    assert together.quarantine.clear() == 1
    lifted = _run(together, unit=Together.NAME, args={"shape": "s1"})
    assert lifted.done.partitions[0].metrics.counters.slices_executed == slices


def _out_of_memory(message: str) -> StageFailed:
    return StageFailed(message, memory=True)


@pytest.mark.parametrize(
    ("error", "why", "rest"),
    [(PlanNotSupported, PushBack.CAPABILITY, True), (_out_of_memory, PushBack.MEMORY, False)],
)
def test_a_plan_the_device_cannot_run_goes_back_and_the_rest_with_it(together, error, why, rest):
    """The device cannot run the plan (``PlanNotSupported``): that chunk and the rest of the work
    go back for ``capability`` (those decided before it was seen still run). Its engine ran out
    of memory: that chunk alone goes back, for ``memory``. Neither is quarantined."""
    together.quarantine = Quarantine(together.store.path, "dev0")
    Together.fail_at, Together.error = 3 * Together.CHUNK_SLICES_MAX, error
    # the chunks after it wait for the failure: on a loaded machine the other lane could run
    # every later chunk before it is seen, and nothing would be left to go back (one run in ~50)
    Together.after_failure = lambda: Together.failed
    slices = _slices(together)
    writer = _run(together, unit=Together.NAME, args={"shape": "s1"})
    (report,) = writer.done.partitions
    _every_slice_once(report, slices)
    by = report.metrics.counters.pushed_back_by()
    assert list(by) == [why] and (by[why] > Together.CHUNK_SLICES_MAX) == rest, by
    last = max(report.decisions, key=lambda d: d.first)
    assert last.end == slices and (last.pushed_back is why) == rest
    assert together.quarantine.held() == ()
