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
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from quarry.coordinator import explain as explaining
from quarry.coordinator import planning
from quarry.coordinator.dispatch import Dispatch
from quarry.coordinator.fragments import Forced, fragment_tasks
from quarry.coordinator.report import WorkReport
from quarry.coordinator.streams import Merged
from quarry.coordinator.timing import HostClocks, QueryTime, query_time
from quarry.coordinator.workload import Slot
from quarry.device.loop import cpu_seconds
from quarry.device.unit import host_cores
from quarry.errors import DeviceUnavailable, ExecutionError, QuarryError, QueryError
from quarry.plan.decompose import Fragment
from quarry.plan.superplan import run_super
from quarry.tally import Tally, process_seconds

if TYPE_CHECKING:
    from quarry.coordinator.membership import Membership

# never: the host reads raw slices and does everything; server: drives read and hand every
# slice back raw, whatever fronts them completes it (a storage server's CPU, POLARDB's
# "CPU-based" pushdown; the host on a flat cluster); always: drives run all they can ("CSD-
# based"); auto: the cost model and the devices decide.
PUSHDOWNS = ("never", "server", "always", "auto")
WORKERS_PER_DEVICE = 2
STREAM_BATCHES_MAX = 16  # batches of a fragment waiting for the super-plan
PLAN_ATTEMPTS_MAX = 2  # planning again once refreshes the catalog without a dead device


class Query:
    def __init__(
        self,
        cluster: Membership,
        sql: str,
        pushdown: str = "always",
        decisions: Forced | None = None,
        trace: bool = False,
        chunk_slices: int | None = None,
        policy: dict[str, Any] | None = None,
    ):
        if pushdown not in PUSHDOWNS:
            raise QueryError(f"pushdown must be one of {', '.join(PUSHDOWNS)}, got {pushdown!r}")
        self.asked = time.perf_counter()
        self.cpu_asked = cpu_seconds()
        self.cluster = cluster
        self.sql = sql
        # "auto": the largest cut is planned, the cost model picks where each fragment starts
        # (full / filter / raw) and the devices adapt from there at run time.
        self.pushdown = pushdown
        self.forced = decisions or {}
        self.options = {"trace": trace, "chunk_slices": chunk_slices, "policy": policy}
        self.query_id = uuid.uuid4().hex
        self.dispatch = Dispatch()
        self.started = self.finished = self.host_cpu_s = self.cpu_finished = 0.0
        self.rows = 0
        self.turn: Slot | None = None
        self.clocks = _Clocks()
        with self.clocks.planning.timing():
            # the catalog is checked while the query plans on it and starts (CatalogCheck)
            self.check = cluster.check()
            self.decomposition, self.cuts = self._plan()

    def _plan(self) -> tuple[Any, planning.Cuts]:
        """The cut and, under auto, where each fragment starts, on the catalog as it is while
        its check is under way. A failure on a catalog the check then finds changed is planned
        again on the catalog read anew; so is one where a device stopped answering while the
        cost model asked it (its load, a sample slice): it is left out."""
        for attempt in range(PLAN_ATTEMPTS_MAX):
            try:
                return self._cut()
            except QuarryError as error:
                if attempt + 1 == PLAN_ATTEMPTS_MAX:
                    raise
                held = self._confirmed()
                if held and not isinstance(error, DeviceUnavailable):
                    raise  # the catalog held: the error is the query's own
                if held:  # a device stopped answering after its pulse: read which answer
                    self.cluster.refresh()
                    self.check = self.cluster.checked()
        raise AssertionError("unreachable")

    def _cut(self) -> tuple[Any, planning.Cuts]:
        if self.pushdown != "auto":
            return planning.plan(self.cluster, self.sql, self.pushdown), planning.Cuts()
        # the cost model reads each device's load: a recent pulse's, or this query's own
        loads = self.cluster.recent_loads()
        if loads is None:
            self._confirmed()  # waits for the check, and plans on the catalog it leaves
            loads = self.check.loads()
        decomposition = planning.plan(self.cluster, self.sql, self.pushdown)
        return decomposition, planning.choose_cuts(self.cluster, decomposition, loads)

    def _confirmed(self) -> bool:
        """Wait for the catalog's check: True if the catalog planned on holds. If not, it was
        read again (``CatalogCheck.holds``), and what was planned must be planned again."""
        if self.check.holds():
            return True
        self.check = self.cluster.checked()
        return False

    def _planned_on_catalog(self) -> bool:
        """The plan, confirmed, or made again on the catalog read anew; False if made again
        (counted as planning time)."""
        with self.clocks.planning.timing():
            if self._confirmed():
                return True
            self.decomposition, self.cuts = self._plan()
            return False

    @property
    def choices(self) -> dict[str, Any]:
        self._planned_on_catalog()
        return self.cuts.choices

    def execute(self) -> pa.RecordBatchReader:
        """Run the query once the host admits it (``workload``: a long one waits its turn);
        the turn is given back when the answer has been read, fails, or is dropped."""
        workload = self.cluster.workload
        slot = self.turn = workload.admit(self.sql)
        try:
            self.started = time.perf_counter()
            cpu_started = cpu_seconds()
            result = self._run_checked()
        except BaseException:
            slot.release()
            raise

        def stream() -> Iterator[pa.RecordBatch]:
            try:
                for batch in _engine_errors(result):
                    self.rows += batch.num_rows
                    yield batch
                self.finished = time.perf_counter()
                self.cpu_finished = cpu_seconds()
                self.host_cpu_s = self.cpu_finished - cpu_started
                workload.learn(self.sql, self.finished - self.started)
            finally:
                slot.release()

        batches = stream()
        weakref.finalize(batches, slot.release)  # a reader dropped unread
        return pa.RecordBatchReader.from_batches(result.schema, batches)

    def _run_checked(self) -> pa.RecordBatchReader:
        """The run, started at once on the plan; returned only once the catalog's check says
        the catalog it was planned on holds. If it does not, the run is stopped (none of its
        rows has left) and the query planned and started again on the catalog read anew."""
        try:
            outputs, result = self._start()
        except QuarryError:
            if self._planned_on_catalog():
                raise
        else:
            if self._planned_on_catalog():
                return result
            for output in outputs.values():
                output.close()  # the devices' streams stop at their next batch
        self.dispatch = Dispatch()
        self.clocks.reset_run()
        return self._start()[1]

    def _start(self) -> tuple[dict[str, Merged], pa.RecordBatchReader]:
        self.clocks.run_started(len(self.decomposition.fragments))
        outputs = {f.name: self._fragment_output(f) for f in self.decomposition.fragments}
        timed = {name: self.clocks.fragment_output(output) for name, output in outputs.items()}
        pace, clock = planning.host_pace(), self.clocks.super_plan
        return outputs, run_super(self.decomposition, timed, pace=pace, clock=clock)

    def _fragment_output(self, fragment: Fragment) -> Merged:
        entry = self.cluster.entry(fragment.dataset)
        if entry.unavailable:
            raise DeviceUnavailable(entry.unavailable_message())
        tasks = fragment_tasks(
            self.cluster,
            fragment,
            self.pushdown,
            self.query_id,
            self.cuts,
            self.forced,
            self.options,
        )
        workers = WORKERS_PER_DEVICE * len(self.cluster.live_devices())
        if self.pushdown == "never":
            # The host does all the work: more streams than its cores only hold more rows at
            # once (5 M rows: 8 streams +370 MiB, no faster than 3 at +5 MiB), but every device
            # streams at once, or slow links would leave the host waiting.
            workers = max(host_cores() + 1, len(self.cluster.live_devices()))
        return self.dispatch.run(tasks, workers, STREAM_BATCHES_MAX, f"quarry-{fragment.name}")

    def explain(self, analyze: bool) -> dict[str, Any]:
        if not analyze and not self.started:
            self._planned_on_catalog()  # shown as it would run on the catalog as it is
        body = explaining.explain(self.sql, self.pushdown, self.decomposition, self.cuts.choices)
        if analyze:
            reports = self.dispatch.sorted_reports()
            wall_s = self.finished - self.started
            body["analyze"] = explaining.analyze(reports, self.host_cpu_s, wall_s, self.rows)
            if self.turn is not None:  # the host's turns (coordinator/workload.py)
                body["analyze"]["host_turn"] = {
                    "long": self.turn.long,
                    "waited_s": round(self.turn.waited_s, 4),
                }
            body["analyze"]["time"] = self.breakdown(reports).to_json()
        return body

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
    meanwhile) and the super-plan's own run (``run_super``'s clock)."""

    def __init__(self) -> None:
        self.planning = Tally()
        self.reset_run()

    def reset_run(self) -> None:
        self.fragments = Tally()
        self.super_plan = Tally()
        self._lock = threading.Lock()
        self._open = 0
        self._started = self._cpu_started = 0.0

    def run_started(self, fragments: int) -> None:
        self._open = fragments
        self._started, self._cpu_started = time.perf_counter(), process_seconds()

    def fragment_output(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """``batches``, and when the last fragment's end: the fragments' span."""
        yield from batches
        with self._lock:
            self._open -= 1
            if self._open == 0:
                self.fragments.wall_s = time.perf_counter() - self._started
                self.fragments.cpu_s = process_seconds() - self._cpu_started


def _engine_errors(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The super-plan's own run-time errors (a division by zero in a final projection) as the
    query's error, in one line; quarry's errors (a device that died, say) as they are."""
    try:
        yield from batches
    except QuarryError:
        raise
    except Exception as error:
        lines = [line for line in str(error).splitlines() if line.strip()]
        raise ExecutionError(
            f"the query failed on the host: {lines[0] if lines else type(error).__name__}"
        ) from None
