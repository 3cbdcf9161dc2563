"""What the endpoint holds between calls: prepared statements, and results waiting or running.

Flight SQL spreads a query over calls: ``GetFlightInfo`` plans it and hands out a ticket,
``DoGet`` runs it and streams the answer, ``CancelFlightInfo`` may stop it from another
connection. Between them the plan waits here as a ``Result``: planned once (so a wrong query
fails at ``GetFlightInfo`` with quarry's message, and the ticket's schema is the plan's), run at
most once (a ticket is single-use: a running query holds a turn of the host, which a second
reader must not take twice), and cancellable at any point.

Everything is bounded and answers only to the token that made it: ``PREPARED_MAX`` statements
(closed after ``PREPARED_IDLE_S_MAX`` unused), ``RESULTS_MAX`` results (dropped if not fetched
within ``RESULT_UNCLAIMED_S_MAX``), each query cancelled once it has run ``query_seconds_max``.
The reaper (``reap``) enforces the times.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa

from quarry.coordinator.query.run import Query
from quarry.errors import ClusterError, QueryCancelled, QueryError
from quarry.flightsql.handles import Handle, Kind
from quarry.flightsql.messages import CancelStatus
from quarry.flightsql.parameters import Placeholders

PREPARED_MAX = 256
PREPARED_IDLE_S_MAX = 3600.0
RESULTS_MAX = 256
RESULT_UNCLAIMED_S_MAX = 300.0
QUERY_SECONDS_MAX_DEFAULT = 3600.0
PARAMETER_ROWS_MAX = 1024  # rows of one parameter batch: one query each
PARAMETER_BYTES_MAX = 16 << 20


@dataclass
class Prepared:
    handle: Handle
    owner: str
    sql: str
    placeholders: Placeholders
    parameters: pa.Table | None = None  # the last batch bound (DoPut), one query per row
    # planned at prepare (a statement without parameters): its first run need not plan again
    planned: Query | None = None
    used_at: float = field(default_factory=time.monotonic)


@dataclass
class Result:
    """A query planned for one ticket: one statement, or one per parameter row (their answers
    follow each other in one stream, in the schema of the first)."""

    handle: Handle
    owner: str
    statements: tuple[str, ...]
    first: Query  # the first statement, planned
    release: Callable[[], None]  # gives back what the result holds (its caller's session)
    created_at: float = field(default_factory=time.monotonic)
    started_at: float | None = None
    running: Query | None = None  # what a cancel stops
    cancelled: threading.Event = field(default_factory=threading.Event)
    reason: str = ""  # why it was cancelled
    released: bool = False

    @property
    def schema(self) -> pa.Schema:
        return self.first.decomposition.output_schema

    def cancel(self, reason: str) -> None:
        self.reason = self.reason or reason
        self.cancelled.set()
        running = self.running
        if running is not None:
            running.cancel()

    def check(self) -> None:
        """Raise ``QueryCancelled`` once the result has been cancelled."""
        if self.cancelled.is_set():
            raise QueryCancelled(self.reason or "the query was cancelled")


class Statements:
    def __init__(self, query_seconds_max: float = QUERY_SECONDS_MAX_DEFAULT):
        assert query_seconds_max > 0
        self.query_seconds_max = query_seconds_max
        self._prepared: dict[str, Prepared] = {}
        self._results: dict[str, Result] = {}
        self._lock = threading.Lock()

    # ---- prepared statements ------------------------------------------------------------------

    def prepare(
        self, owner: str, sql: str, placeholders: Placeholders, planned: Query | None = None
    ) -> Prepared:
        with self._lock:
            if len(self._prepared) >= PREPARED_MAX:
                raise ClusterError(
                    f"{PREPARED_MAX} prepared statements are open on this endpoint: close some "
                    f"(they close by themselves after {PREPARED_IDLE_S_MAX:.0f} s unused)"
                )
            prepared = Prepared(
                Handle.new(Kind.PREPARED), owner, sql, placeholders, planned=planned
            )
            self._prepared[prepared.handle.id] = prepared
            return prepared

    def prepared(self, owner: str, handle: Handle) -> Prepared:
        with self._lock:
            found = self._prepared.get(handle.id)
            if found is None or found.owner != owner or handle.kind is not Kind.PREPARED:
                raise QueryError(
                    "no such prepared statement (closed, or unused for "
                    f"{PREPARED_IDLE_S_MAX:.0f} s): prepare it again"
                )
            found.used_at = time.monotonic()
            return found

    def bind(self, owner: str, handle: Handle, parameters: pa.Table) -> Prepared:
        prepared = self.prepared(owner, handle)
        with self._lock:
            prepared.parameters = parameters
        return prepared

    def take_planned(self, prepared: Prepared) -> Query | None:
        """The plan made at prepare, once (a plan runs once; a second run plans again)."""
        with self._lock:
            planned, prepared.planned = prepared.planned, None
            return planned

    def close_prepared(self, owner: str, handle: Handle) -> None:
        self.prepared(owner, handle)  # only its owner may close it
        with self._lock:
            self._prepared.pop(handle.id, None)

    # ---- results ------------------------------------------------------------------------------

    def add_result(
        self,
        owner: str,
        statements: tuple[str, ...],
        first: Query,
        release: Callable[[], None],
    ) -> Result:
        """Hold a planned query until its ticket is read; ``release`` is called once, when it
        has been read, or will never be."""
        assert statements, "a result runs at least one statement"
        with self._lock:
            if len(self._results) >= RESULTS_MAX:
                raise ClusterError(
                    f"{RESULTS_MAX} results are waiting or running on this endpoint; fetch or "
                    "cancel some, or try again"
                )
            result = Result(Handle.new(Kind.RESULT), owner, statements, first, release)
            self._results[result.handle.id] = result
            return result

    def claim(self, owner: str, handle: Handle) -> Result:
        """The result a ``DoGet`` runs; it leaves the waiting ones for good (single-use)."""
        with self._lock:
            found = self._results.get(handle.id)
            if found is None or found.owner != owner or handle.kind is not Kind.RESULT:
                raise QueryError(
                    "no such result: a ticket is read once, and one not read within "
                    f"{RESULT_UNCLAIMED_S_MAX:.0f} s is dropped; execute the query again"
                )
            if found.started_at is not None:
                raise QueryError("this ticket is being read already: execute the query again")
            found.started_at = time.monotonic()
        if found.cancelled.is_set():
            self.finish(found)
            found.check()
        return found

    def finish(self, result: Result) -> None:
        """The result is done with (read, failed, or never to be read): forget it and give
        back what it holds, once."""
        with self._lock:
            self._results.pop(result.handle.id, None)
            release, result.released = not result.released, True
        if release:
            result.release()

    def cancel(self, owner: str, handle: Handle) -> CancelStatus:
        """Cancel a result that waits or runs; one that is gone (or another token's) is
        "not cancellable"."""
        with self._lock:
            found = self._results.get(handle.id)
            if found is None or found.owner != owner:
                return CancelStatus.NOT_CANCELLABLE
        found.cancel("the query was cancelled by its client")
        return CancelStatus.CANCELLED

    def running(self) -> int:
        with self._lock:
            return sum(1 for r in self._results.values() if r.started_at is not None)

    def waiting(self) -> int:
        with self._lock:
            return sum(1 for r in self._results.values() if r.started_at is None)

    # ---- the reaper ---------------------------------------------------------------------------

    def reap(self, now: float | None = None) -> None:
        """Drop what waited too long, cancel what ran too long."""
        now = time.monotonic() if now is None else now
        with self._lock:
            for key, prepared in list(self._prepared.items()):
                if now - prepared.used_at > PREPARED_IDLE_S_MAX:
                    del self._prepared[key]
            unclaimed, overdue = [], []
            for result in self._results.values():
                if result.started_at is None:
                    if now - result.created_at > RESULT_UNCLAIMED_S_MAX:
                        unclaimed.append(result)
                elif not result.cancelled.is_set() and _ran(result, now) > self.query_seconds_max:
                    overdue.append(result)
        for result in unclaimed:
            self.finish(result)
        for result in overdue:
            result.cancel(
                f"the query ran over the endpoint's bound of {self.query_seconds_max:g} s "
                "(quarry serve --query-seconds-max)"
            )


def _ran(result: Result, now: float) -> float:
    assert result.started_at is not None
    return now - result.started_at
