"""One query's life on the host: plan → dispatch the fragments → run the super-plan.

Devices run their sub-plans in parallel through the one host dispatch; whatever a device hands
back the host completes with the same unit of work, so the super-plan always sees exactly the
fragment outputs it would have seen had every device executed everything.
"""

from __future__ import annotations

import threading
import time
import uuid
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from quarry import tracing
from quarry.coordinator.dispatch.dispatch import Dispatch, Task
from quarry.coordinator.dispatch.report import WorkReport
from quarry.coordinator.dispatch.streams import Merged
from quarry.coordinator.query import explain as explaining
from quarry.coordinator.query import join_keys, planning
from quarry.coordinator.query.fragments import Forced, fragment_tasks
from quarry.coordinator.query.host_admission import Slot
from quarry.coordinator.query.timing import HostClocks, QueryTime, query_time
from quarry.device.loop import cpu_seconds
from quarry.device.unit import host_cores
from quarry.errors import (
    CatalogChanged,
    DeviceUnavailable,
    ExecutionError,
    QuarryError,
    only_quarry_errors,
    only_quarry_errors_in,
)
from quarry.plan import repeats
from quarry.plan.decompose import Fragment
from quarry.plan.explain import RuleFired
from quarry.plan.join_filters import JoinFilter
from quarry.plan.superplan import SortMergeRerun, run_super
from quarry.plan.superplan import streams as planning_streams
from quarry.pushdown import Pushdown
from quarry.tally import Tally, process_seconds

if TYPE_CHECKING:
    from quarry.coordinator.membership.freshness import CatalogCheck
    from quarry.coordinator.membership.membership import Membership

WORKERS_PER_DEVICE = 2
STREAM_BATCHES_MAX = 16  # batches of a fragment waiting for the super-plan
PLAN_ATTEMPTS_MAX = 2  # planning again once refreshes the catalog without a dead device
# A run refused for a changed catalog runs again, on the catalog read anew, up to this many
# runs in all. Each change is an event (an ingest committed, a dataset dropped, a partition
# moved off a device: a rebalance makes one per partition, at its bounded rate), so a query
# meets a few at most; the bound only stops a query chasing changes for ever.
RUNS_MAX = 6


class Query:
    def __init__(
        self,
        cluster: Membership,
        sql: str,
        pushdown: Pushdown | str = Pushdown.ALWAYS,
        decisions: Forced | None = None,
        trace: bool = False,
        chunk_slices: int | None = None,
        policy: dict[str, Any] | None = None,
        join_filters: bool = True,
    ):
        self.asked = time.perf_counter()
        self.cpu_asked = cpu_seconds()
        self.cluster = cluster
        self.sql = sql
        # auto: the largest cut is planned, the cost model picks where each fragment starts
        # (full / filter / raw) and the devices adapt from there at run time.
        self.pushdown = Pushdown.parse(pushdown)
        self.forced = decisions or {}
        self.options = {"trace": trace, "chunk_slices": chunk_slices, "policy": policy}
        # a join's build keys cut its probe fragment on the devices (``join_keys``); never
        # stays the baseline of no pushdown at all
        self.join_filters = join_filters and self.pushdown is not Pushdown.NEVER
        self.collectors: list[join_keys.KeyCollector] = []
        self.pairs: tuple[JoinFilter, ...] = ()
        self.query_id = uuid.uuid4().hex
        # the query's trace, whole across processes (``tracing``; NO_SPAN when off): it ends
        # when the answer has been read, or the query is dropped
        self.span = tracing.query(
            "query", sql=sql, pushdown=str(self.pushdown), query_id=self.query_id
        )
        if self.span.recording:
            weakref.finalize(self, self.span.end)
        self.cancelled = threading.Event()  # ``cancel``: every run of this query stops
        self.dispatch = Dispatch(cancelled=self.cancelled)
        self.started = self.finished = self.host_cpu_s = self.cpu_finished = 0.0
        self.rows = 0
        self.turn: Slot | None = None
        self.clocks = _Clocks()
        # The catalog as it was last read, checked as the query goes (freshness.py): by the
        # devices it sends work to, and by the pulses of ``check``; read again first if a
        # device went silent or came back since (``Membership.settle``).
        cluster.settle()
        self.state = cluster.state
        self.check: CatalogCheck | None = None
        with self.clocks.planning.timing(), only_quarry_errors(sql), self.span.child("plan"):
            self.decomposition, self.cuts = self._plan()

    # ---- the plan -----------------------------------------------------------------------------

    def _plan(self) -> tuple[Any, planning.Cuts]:
        """The cut and, under auto, where each fragment starts. A failure on a catalog that no
        longer holds is planned again on the catalog read anew; so is one where a device
        stopped answering while the cost model asked it (its load, a sample slice)."""
        for attempt in range(PLAN_ATTEMPTS_MAX):
            try:
                return self._cut()
            except QuarryError as error:
                if attempt + 1 == PLAN_ATTEMPTS_MAX:
                    raise
                held = self._catalog_holds()
                if held and not isinstance(error, DeviceUnavailable):
                    raise  # the catalog held: the error is the query's own
                if held:  # a device stopped answering after its pulse: read which answer
                    self.cluster.refresh()
                    self.state = self.cluster.state
        raise AssertionError("unreachable")

    def _cut(self) -> tuple[Any, planning.Cuts]:
        """The cut, alike fragments read once where no join's keys cut them apart (and the
        pairs that cut them: ``pairs``), and under auto where each fragment starts."""
        if self.pushdown is not Pushdown.AUTO:
            plan = self._shared(planning.plan(self.cluster, self.sql, self.pushdown, self.state))
            return plan, planning.Cuts()
        # the cost model reads each device's load: as it said it lately, or its pulse now
        loads = self.cluster.recent_loads()
        if loads is None:
            self._catalog_holds()
            loads = self.check.loads() if self.check is not None else {}
        plan = self._shared(planning.plan(self.cluster, self.sql, self.pushdown, self.state))
        return plan, planning.choose_cuts(self.cluster, plan, loads)

    def _shared(self, decomposition: Any) -> Any:
        decomposition, self.pairs = planning.shared(self.cluster, decomposition, self.join_filters)
        return decomposition

    def _catalog_holds(self, again: bool = False) -> bool:
        """Every device's pulse against the catalog planned on (asked once per catalog, or
        ``again``): True if it holds; if not, it was read anew and ``state`` is the new one."""
        if again or self.check is None or self.check.state is not self.state:
            self.check = self.cluster.check(state=self.state)
        if self.check.holds():
            return True
        self.state = self.cluster.state
        self.check = self.cluster.checked()
        return False

    def _planned_on_catalog(self, running: bool = False, again: bool = False) -> bool:
        """The plan, confirmed, or made again on the catalog read anew; False if made again.
        Planning time counts the wait for the pulses, unless the run is under way
        (``running``: the fragments' time covers it)."""
        with (Tally() if running else self.clocks.planning).timing():
            held = self._catalog_holds(again)
        if not held:
            with self.clocks.planning.timing():
                self.decomposition, self.cuts = self._plan()
        return held

    @property
    def choices(self) -> dict[str, explaining.CutChosen]:
        if not self.started:
            self._planned_on_catalog()
        return self.cuts.choices

    # ---- the run ------------------------------------------------------------------------------

    def execute(self) -> pa.RecordBatchReader:
        """Run the query once the host admits it (``host_admission``: a long one waits its turn);
        the turn is given back when the answer has been read, fails, or is dropped."""
        workload = self.cluster.workload
        slot = self.turn = workload.admit(self.sql)
        try:
            self.started = time.perf_counter()
            cpu_started = cpu_seconds()
            with only_quarry_errors(self.sql):
                result = self._run()
        except BaseException as error:
            slot.release()
            self.span.end(error)
            raise

        def stream() -> Iterator[pa.RecordBatch]:
            try:
                yield from only_quarry_errors_in(self._rows(result), self.sql)
                self.finished = time.perf_counter()
                self.cpu_finished = cpu_seconds()
                self.host_cpu_s = self.cpu_finished - cpu_started
                workload.learn(self.sql, self.finished - self.started)
                self._learn_cuts()
                self.span.set(rows=self.rows)
            except BaseException as error:
                self.span.end(error)
                raise
            finally:
                slot.release()
                self.span.end()

        batches = stream()
        weakref.finalize(batches, slot.release)  # a reader dropped unread
        return pa.RecordBatchReader.from_batches(result.schema, batches)

    def _learn_cuts(self) -> None:
        """Where each fragment's devices settled: its next run starts there (``settled_cuts``)."""
        reports: dict[str, list[WorkReport]] = {}
        for report in self.dispatch.sorted_reports():
            reports.setdefault(report.label, []).append(report)
        for name, (key, model_cut) in self.cuts.model_cuts.items():
            self.cluster.settled.learn(key, model_cut, reports.get(name, []))

    def cancel(self) -> None:
        """Stop the query from any thread: the devices' streams end at their next batch and
        the reader of ``execute`` raises ``QueryCancelled``; before ``execute``, the query
        stops as soon as it starts. Its host turn is given back when its reader goes."""
        self.cancelled.set()

    def _rows(self, result: pa.RecordBatchReader) -> Iterator[pa.RecordBatch]:
        """The answer. A device that finds the catalog changed refuses its work before running
        any, and a super-plan that reads its inputs whole lets nothing out before they are all
        in and the catalog checked: then the query runs again on the catalog read anew. So
        does one that failed before any row left on a catalog its pulses find changed (a
        device listed down that is back, a dataset dropped)."""
        for attempt in range(RUNS_MAX):
            released = False
            try:
                for batch in _engine_errors(result):
                    released = True
                    self.rows += batch.num_rows
                    yield batch
                return
            except QuarryError as error:
                if released or attempt + 1 == RUNS_MAX:
                    raise
                changed = isinstance(error, CatalogChanged)
                if not changed and self._catalog_holds(again=True):
                    raise  # the catalog held: the error is the query's own
                again = self._rerun(refresh=changed)
                if not again.schema.equals(result.schema):
                    raise CatalogChanged(
                        "a dataset this query reads was ingested again with other columns as "
                        "it started: run it again"
                    ) from None
                result = again

    def _run(self) -> pa.RecordBatchReader:
        """Start the devices on the plan. A super-plan that lets rows out as they come waits,
        before any does, for every device's pulse to say the catalog held (else it is planned
        and started again); one that reads its inputs whole is checked by the devices its work
        goes to, and the others' pulses once its inputs are in (``_rows``)."""
        streaming = planning_streams(self.decomposition)
        try:
            if streaming:  # the pulses under way as the run starts
                self.check = self.cluster.check(state=self.state)
            outputs, result = self._started(checked_by_devices=not streaming)
        except QuarryError:
            if self._planned_on_catalog(running=True, again=not streaming):
                raise
        else:
            if not streaming or self._planned_on_catalog(running=True):
                return result
            for output in outputs.values():
                output.close()  # the devices' streams stop at their next batch
        self._restart_clean()
        return self._start(checked_by_devices=not planning_streams(self.decomposition))

    def _rerun(self, refresh: bool) -> pa.RecordBatchReader:
        """The run again, on the catalog read anew (``refresh``: a device said it changed)."""
        if refresh and self.cluster.state.version == self.state.version:  # not read since
            self.cluster.refresh()
        self.state = self.cluster.state
        self.check = self.cluster.checked()
        with self.clocks.planning.timing(), self.span.child("plan", again=True):
            self.decomposition, self.cuts = self._plan()
        self._restart_clean()
        return self._start(checked_by_devices=not planning_streams(self.decomposition))

    def _restart_clean(self) -> None:
        self.dispatch = Dispatch(cancelled=self.cancelled)
        self.clocks.reset_run()

    def _start(self, checked_by_devices: bool) -> pa.RecordBatchReader:
        return self._started(checked_by_devices)[1]

    def _started(
        self, checked_by_devices: bool
    ) -> tuple[dict[str, Iterator[pa.RecordBatch]], pa.RecordBatchReader]:
        state = self.state
        self.dispatch = Dispatch(
            expect=state.expected if checked_by_devices else None,
            loads_seen=self.cluster.loads_seen,
            cancelled=self.cancelled,
            down=self.cluster.down,
        )
        self.clocks.run_started(len(self.decomposition.fragments))
        pairs = self._pairs()
        probes = {pair.probe for pair in pairs}
        self.cuts.scanned(probes)
        tasks = {f.name: self._tasks(f) for f in self.decomposition.fragments}
        inputs_in = None
        if checked_by_devices:
            # the devices that get work check the catalog at the door; the others are pulsed
            checking = {t.client.name for ts in tasks.values() for t in ts}
            checking = {name for name in checking if state.expected(name)}
            self.check = self.cluster.check(set(self.cluster.devices) - checking, state)
            inputs_in = self._inputs_in
        outputs = {name: self._output(name, ts) for name, ts in tasks.items() if name not in probes}

        dispatch = self.dispatch

        def start_probe(name: str, key_sets: list[tuple[int, bytes]]) -> Iterator[pa.RecordBatch]:
            if self.dispatch is not dispatch:  # this run was abandoned while the keys came in
                return iter(())
            fragment = self.decomposition.fragment(name)
            return self._output(name, self._tasks(fragment, key_sets))

        pace, clock = planning.host_pace(), self.clocks.super_plan
        self.collectors = join_keys.wire(outputs, pairs, start_probe, self.cancelled, pace.cores)
        timed = {name: self.clocks.fragment_output(output) for name, output in outputs.items()}
        result = run_super(
            self.decomposition,
            timed,
            pace=pace,
            clock=clock,
            inputs_in=inputs_in,
            reran=self.clocks.super_plan_reran,
            computed=self._computed,
            cut=probes,
        )
        return outputs, result

    def _computed(self) -> dict[bytes, pa.Table]:
        """The parts of the super-plan the host ran for a build's keys, with their output."""
        return {
            c.pair.through: c.computed
            for c in self.collectors
            if c.pair.through and c.computed is not None
        }

    def _inputs_in(self) -> None:
        """Every fragment's output is in: the devices that sent none of it must say the catalog
        held before the super-plan lets anything out."""
        assert self.check is not None
        if not self.check.holds():
            raise CatalogChanged("the catalog changed while the query ran: it runs again")

    def _pairs(self) -> tuple[JoinFilter, ...]:
        """Which fragments a join cuts by another's keys (found as the cut was: ``_shared``)."""
        return self.pairs

    def _tasks(
        self, fragment: Fragment, key_sets: list[tuple[int, bytes]] | None = None
    ) -> list[Task]:
        entry = self.cluster.entry(fragment.dataset)
        if entry.unavailable:
            raise DeviceUnavailable(entry.unavailable_message())
        return fragment_tasks(
            self.cluster,
            fragment,
            self.pushdown,
            self.query_id,
            self.cuts,
            self.forced,
            self.options,
            key_sets or (),
            distinct=fragment.name in self._repeat_blind(),
        )

    def _repeat_blind(self) -> frozenset[str]:
        """The fragments whose devices may drop repeated rows (none under a DuckDB super-plan);
        of the decomposition as it is now (judged once per super-plan: ``repeats``)."""
        if self.decomposition.host_sql:
            return frozenset()
        return repeats.repeat_blind(self.decomposition.super_plan)

    def _output(self, name: str, tasks: list[Task]) -> Merged:
        """A fragment's output: its tasks run by the dispatch (under a span of the fragment's,
        when the query is traced, that ends with its last batch)."""
        span = self.span.child("fragment", fragment=name, tasks=len(tasks))
        if span.recording:
            tasks = [replace(task, span=span) for task in tasks]
            return self._dispatched(name, tasks).through(span.around)
        return self._dispatched(name, tasks)

    def _dispatched(self, name: str, tasks: list[Task]) -> Merged:
        workers = WORKERS_PER_DEVICE * len(self.cluster.live_devices())
        if self.pushdown is Pushdown.NEVER:
            # The host does all the work: more streams than its cores only hold more rows at
            # once (5 M rows: 8 streams +370 MiB, no faster than 3 at +5 MiB), but every device
            # streams at once, or slow links would leave the host waiting.
            workers = max(host_cores() + 1, len(self.cluster.live_devices()))
        return self.dispatch.run(tasks, workers, STREAM_BATCHES_MAX, f"quarry-{name}")

    # ---- what it did --------------------------------------------------------------------------

    def explain(self, analyze: bool, verbose: bool = False) -> explaining.Explain:
        """The cut; with ``analyze``, what each device did; with ``verbose``, the rules that
        fired, in order, each with the cut after it (kept with the plan: a plan from the plan
        cache shows them too)."""
        with only_quarry_errors(self.sql):
            return self._explain(analyze, verbose)

    def _explain(self, analyze: bool, verbose: bool) -> explaining.Explain:
        if not analyze and not self.started:
            self._planned_on_catalog()  # shown as it would run on the catalog as it is
            self.cuts.scanned({pair.probe for pair in self._pairs()})
        cut = self.decomposition.explained()
        assert cut.pushdown is self.pushdown, (cut.pushdown, self.pushdown)
        # rendered now, from the bytes each rule left: only when asked
        fired = self.decomposition.fired if verbose else ()
        rules = tuple(RuleFired(f.rule, f.plan) for f in fired)
        return explaining.Explain(
            query=self.sql,
            cut=cut,
            plan=self.decomposition.explain(),
            cost_model=dict(self.cuts.choices),
            join_filters=self._join_filters_shown(analyze),
            rules=rules,
            analyze=self._analyzed() if analyze else None,
        )

    def _analyzed(self) -> explaining.Analyze:
        reports = self.dispatch.sorted_reports()
        sort_merge = self.clocks.sort_merge  # a join did not fit: the super-plan again
        turn = self.turn  # the host's turns (coordinator/query/host_admission.py)
        return explaining.analyze(
            reports,
            self.host_cpu_s,
            self.finished - self.started,
            self.rows,
            self.breakdown(reports),
            servers={n for n, info in self.cluster.info.items() if info.is_server},
            super_plan_rerun=sort_merge.describe() if sort_merge is not None else None,
            host_turn=explaining.HostTurn.of(turn) if turn is not None else None,
        )

    def _join_filters_shown(self, analyze: bool) -> tuple[explaining.JoinFilterShown, ...]:
        """Which fragments a join cuts by another's keys; run, what each sent."""
        fragments = {f.name: f for f in self.decomposition.fragments}
        if analyze and self.started:
            return tuple(
                explaining.JoinFilterShown(c.pair.describe(fragments), c.united or c.outcome)
                for c in self.collectors
            )
        return tuple(explaining.JoinFilterShown(p.describe(fragments)) for p in self._pairs())

    def breakdown(self, reports: list[WorkReport] | None = None) -> QueryTime:
        """Where this query's time went (once it has been read to its end)."""
        reports = self.dispatch.sorted_reports() if reports is None else reports
        finished = self.finished or time.perf_counter()
        clocks = HostClocks(
            planning=self.clocks.planning,
            fragments=self.clocks.fragments,
            super_plan=self.clocks.super_plan,
            host_completion=self.dispatch.host_completed(),
            opening=self.dispatch.opening,
            streams=self.dispatch.streams,
        )
        cpu_s = (self.cpu_finished or cpu_seconds()) - self.cpu_asked
        return query_time(finished - self.asked, cpu_s, clocks, reports)


class _Clocks:
    """What the host counts of a query as it goes: its planning, the wait for its fragments'
    outputs (from the start of the run to the last of them in, and the process's CPU
    meanwhile) and the super-plan's own run (``run_super``'s clock, and whether it ran again
    with sort-merge joins). A run started again starts its counts again; an abandoned run's
    outputs count for nothing."""

    def __init__(self) -> None:
        self.planning = Tally()
        self._lock = threading.Lock()
        self.reset_run()

    def reset_run(self) -> None:
        self.fragments = Tally()
        self.super_plan = Tally()
        self.sort_merge: SortMergeRerun | None = None
        self._run: list[float] = [0, 0.0, 0.0]  # outputs still open, started, CPU then

    def super_plan_reran(self, rerun: SortMergeRerun) -> None:
        self.sort_merge = rerun

    def run_started(self, fragments: int) -> None:
        self._run = [fragments, time.perf_counter(), process_seconds()]

    def fragment_output(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """``batches``, and when the last fragment's end: the fragments' span."""
        run = self._run
        yield from batches
        with self._lock:
            run[0] -= 1
            if run[0] == 0 and run is self._run:
                self.fragments.wall_s = time.perf_counter() - run[1]
                self.fragments.cpu_s = process_seconds() - run[2]


def _engine_errors(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The super-plan's own run-time errors (a division by zero in a final projection) as the
    query's error, in one line; quarry's errors (a device that died, say) as they are."""
    try:
        yield from batches
    except (QuarryError, AssertionError):  # an invariant of quarry's own is not the query's
        raise
    except Exception as error:
        lines = [line for line in str(error).splitlines() if line.strip()]
        raise ExecutionError(
            f"the query failed on the host: {lines[0] if lines else type(error).__name__}"
        ) from None
