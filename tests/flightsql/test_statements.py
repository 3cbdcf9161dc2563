"""What the endpoint holds between calls is bounded, answers only to its token, is read once,
and is given back exactly once, however it ends."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pyarrow as pa
import pytest

from quarry.errors import ClusterError, QueryCancelled, QueryError
from quarry.flightsql import statements as statements_module
from quarry.flightsql.handles import Handle, Kind
from quarry.flightsql.messages import CancelStatus
from quarry.flightsql.parameters import find
from quarry.flightsql.statements import RESULT_UNCLAIMED_S_MAX, Statements


class FakeQuery:
    def __init__(self):
        self.decomposition = SimpleNamespace(output_schema=pa.schema([("n", pa.int64())]))
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


def _result(statements: Statements, owner: str = "me"):
    released = []
    result = statements.add_result(owner, ("SELECT 1",), FakeQuery(), lambda: released.append(1))
    return result, released


def test_a_result_is_read_once_by_its_owner_and_released_once():
    statements = Statements()
    result, released = _result(statements)
    with pytest.raises(QueryError, match="no such result"):
        statements.claim("someone else", result.handle)
    assert statements.claim("me", result.handle) is result
    with pytest.raises(QueryError, match="being read"):
        statements.claim("me", result.handle)
    statements.finish(result)
    statements.finish(result)
    assert released == [1]
    with pytest.raises(QueryError, match="read once"):
        statements.claim("me", result.handle)


def test_a_cancel_reaches_the_running_query_and_a_waiting_one_is_not_run():
    statements = Statements()
    running, _ = _result(statements)
    statements.claim("me", running.handle)
    running.running = running.first
    assert statements.cancel("someone else", running.handle) is CancelStatus.NOT_CANCELLABLE
    assert statements.cancel("me", running.handle) is CancelStatus.CANCELLED
    assert running.first.cancelled
    with pytest.raises(QueryCancelled, match="by its client"):
        running.check()
    waiting, released = _result(statements)
    statements.cancel("me", waiting.handle)
    with pytest.raises(QueryCancelled):
        statements.claim("me", waiting.handle)
    assert released == [1] and statements.waiting() == 0


def test_the_reaper_drops_unread_results_and_cancels_long_queries():
    statements = Statements(query_seconds_max=10.0)
    unread, released = _result(statements)
    long_running, _ = _result(statements)
    statements.claim("me", long_running.handle)
    long_running.running = long_running.first
    now = time.monotonic()
    statements.reap(now + 5.0)
    assert released == [] and not long_running.cancelled.is_set()
    statements.reap(now + max(RESULT_UNCLAIMED_S_MAX, 10.0) + 1.0)
    assert released == [1] and statements.waiting() == 0
    assert long_running.first.cancelled and "bound of 10 s" in long_running.reason


def test_bounds_refuse_rather_than_grow(monkeypatch):
    monkeypatch.setattr(statements_module, "RESULTS_MAX", 2)
    monkeypatch.setattr(statements_module, "PREPARED_MAX", 1)
    statements = Statements()
    _result(statements)
    _result(statements)
    with pytest.raises(ClusterError, match="results are waiting"):
        _result(statements)
    statements.prepare("me", "SELECT ?", find("SELECT ?"))
    with pytest.raises(ClusterError, match="prepared statements are open"):
        statements.prepare("me", "SELECT 1", find("SELECT 1"))


def test_a_prepared_statement_answers_its_owner_and_keeps_its_plan_once():
    statements = Statements()
    planned = FakeQuery()
    prepared = statements.prepare("me", "SELECT 1", find("SELECT 1"), planned)
    with pytest.raises(QueryError, match="no such prepared statement"):
        statements.prepared("someone else", prepared.handle)
    with pytest.raises(QueryError, match="no such prepared statement"):
        statements.prepared("me", Handle(Kind.RESULT, prepared.handle.id))
    assert statements.take_planned(statements.prepared("me", prepared.handle)) is planned
    assert statements.take_planned(prepared) is None
    statements.close_prepared("me", prepared.handle)
    with pytest.raises(QueryError):
        statements.prepared("me", prepared.handle)
