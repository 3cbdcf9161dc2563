"""One query's life on the host: plan → dispatch the fragments → run the super-plan.

Devices run their sub-plans in parallel through the one host dispatch; whatever a device hands
back the host completes with the same unit of work, so the super-plan always sees exactly the
fragment outputs it would have seen had every device executed everything.
"""

from __future__ import annotations

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
from quarry.coordinator.workload import Slot
from quarry.device.loop import cpu_seconds
from quarry.device.unit import host_cores
from quarry.errors import DeviceUnavailable, ExecutionError, QuarryError, QueryError
from quarry.plan.decompose import Fragment
from quarry.plan.superplan import run_super

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
        self.cluster = cluster
        self.sql = sql
        # "auto": the largest cut is planned, the cost model picks where each fragment starts
        # (full / filter / raw) and the devices adapt from there at run time.
        self.pushdown = pushdown
        self.forced = decisions or {}
        self.options = {"trace": trace, "chunk_slices": chunk_slices, "policy": policy}
        self.query_id = uuid.uuid4().hex
        self.decomposition, self.cuts = self._plan()
        self.dispatch = Dispatch()
        self.started = self.finished = self.host_cpu_s = 0.0
        self.rows = 0
        self.turn: Slot | None = None

    def _plan(self) -> tuple[Any, planning.Cuts]:
        """The cut and, under auto, where each fragment starts. A device that stops answering
        while the cost model asks it (its load, a sample slice) is left out: plan again."""
        for attempt in range(PLAN_ATTEMPTS_MAX):
            try:
                loads = self.cluster.pulse()  # the catalog still holds, or is read again
                decomposition = planning.plan(self.cluster, self.sql, self.pushdown)
                if self.pushdown != "auto":
                    return decomposition, planning.Cuts()
                return decomposition, planning.choose_cuts(self.cluster, decomposition, loads)
            except DeviceUnavailable:
                if attempt + 1 == PLAN_ATTEMPTS_MAX:
                    raise
        raise AssertionError("unreachable")

    @property
    def choices(self) -> dict[str, Any]:
        return self.cuts.choices

    def execute(self) -> pa.RecordBatchReader:
        """Run the query once the host admits it (``workload``: a long one waits its turn);
        the turn is given back when the answer has been read, fails, or is dropped."""
        workload = self.cluster.workload
        slot = self.turn = workload.admit(self.sql)
        try:
            self.started = time.perf_counter()
            cpu_started = cpu_seconds()
            outputs = {f.name: self._fragment_output(f) for f in self.decomposition.fragments}
            result = run_super(self.decomposition, outputs, pace=planning.host_pace())
        except BaseException:
            slot.release()
            raise

        def stream() -> Iterator[pa.RecordBatch]:
            try:
                for batch in _engine_errors(result):
                    self.rows += batch.num_rows
                    yield batch
                self.finished = time.perf_counter()
                self.host_cpu_s = cpu_seconds() - cpu_started
                workload.learn(self.sql, self.finished - self.started)
            finally:
                slot.release()

        batches = stream()
        weakref.finalize(batches, slot.release)  # a reader dropped unread
        return pa.RecordBatchReader.from_batches(result.schema, batches)

    def _fragment_output(self, fragment: Fragment) -> Iterator[pa.RecordBatch]:
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
        body = explaining.explain(self.sql, self.pushdown, self.decomposition, self.choices)
        if analyze:
            reports = self.dispatch.sorted_reports()
            wall_s = self.finished - self.started
            body["analyze"] = explaining.analyze(reports, self.host_cpu_s, wall_s, self.rows)
            if self.turn is not None:  # the host's turns (coordinator/workload.py)
                body["analyze"]["host_turn"] = {
                    "long": self.turn.long,
                    "waited_s": round(self.turn.waited_s, 4),
                }
        return body


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
