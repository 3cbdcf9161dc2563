"""A query can be cancelled, waiting or running, and a cancelled query stops: its stream ends
at once, the devices stop working for it, and the endpoint holds nothing of it afterwards."""

from __future__ import annotations

import time

import pytest
from pyarrow import flight

from quarry.auth.tokens import Role
from quarry.flightsql import messages
from quarry.flightsql.messages import CancelStatus
from quarry.flightsql.serve import Options, start

# About 3.6e9 rows, made lazily by the host's cross join: it never ends by itself in a test.
ENDLESS = "SELECT a.id AS a, b.id AS b FROM physics.particles a, physics.particles b"
SETTLE_S_MAX = 10.0

pytestmark = pytest.mark.timeout(120)


def _info(client, options, sql: str) -> flight.FlightInfo:
    command = messages.pack(messages.CommandStatementQuery(query=sql))
    return client.get_flight_info(flight.FlightDescriptor.for_command(command), options)


def _cancel(client, options, info: flight.FlightInfo) -> CancelStatus:
    request = messages.CancelFlightInfoRequest(info=info.serialize())
    (result,) = client.do_action(
        flight.Action("CancelFlightInfo", request.SerializeToString()), options
    )
    reply = messages.parse(messages.CancelFlightInfoResult, result.body.to_pybytes())
    return CancelStatus(reply.status)


def _settled(endpoint) -> None:
    """Nothing of the query is left: no result on the endpoint, no work on any device."""
    deadline = time.monotonic() + SETTLE_S_MAX
    while time.monotonic() < deadline:
        busy = [row.stats.running for row in endpoint.cluster.status() if row.stats]
        if endpoint.server.statements.running() == 0 and not any(busy):
            return
        time.sleep(0.1)
    raise AssertionError(
        f"still running after {SETTLE_S_MAX} s: {endpoint.server.statements.running()} results, "
        f"device work {busy}"
    )


def _read_until_error(reader) -> tuple[int, BaseException]:
    rows = 0
    while True:
        try:
            rows += reader.read_chunk().data.num_rows
        except StopIteration as end:
            raise AssertionError("the cancelled stream ended as if complete") from end
        except flight.FlightError as error:
            return rows, error


def test_cancel_flight_info_stops_a_running_query(endpoint):
    client, options = endpoint.client()
    info = _info(client, options, ENDLESS)
    reader = client.do_get(info.endpoints[0].ticket, options)
    first = sum(reader.read_chunk().data.num_rows for _ in range(3))
    assert first > 0 and endpoint.server.statements.running() == 1
    started = time.monotonic()
    assert _cancel(client, options, info) is CancelStatus.CANCELLED
    _, error = _read_until_error(reader)
    assert isinstance(error, flight.FlightCancelledError), error
    assert "cancelled by its client" in str(error)
    assert time.monotonic() - started < 5.0
    _settled(endpoint)
    assert _cancel(client, options, info) is CancelStatus.NOT_CANCELLABLE  # nothing left


def test_the_legacy_cancel_query_action_cancels_a_waiting_query(endpoint):
    client, options = endpoint.client()
    info = _info(client, options, ENDLESS)
    request = messages.ActionCancelQueryRequest(info=info.serialize())
    (result,) = client.do_action(flight.Action("CancelQuery", messages.pack(request)), options)
    reply = messages.unpack(result.body.to_pybytes())
    assert CancelStatus(reply.result) is CancelStatus.CANCELLED
    with pytest.raises(flight.FlightCancelledError):
        client.do_get(info.endpoints[0].ticket, options).read_chunk()
    assert endpoint.server.statements.waiting() == 0
    _settled(endpoint)


def test_a_client_cancelling_its_fetch_frees_the_stream(endpoint):
    import adbc_driver_manager

    with endpoint.connect() as connection, connection.cursor() as cursor:
        cursor.execute(ENDLESS)
        reader = cursor.fetch_record_batch()
        assert reader.read_next_batch().num_rows > 0
        cursor.adbc_cancel()
        with pytest.raises((adbc_driver_manager.Error, OSError)):
            for _ in range(10_000):
                reader.read_next_batch()
        _settled(endpoint)
        cursor.execute("SELECT count(*) FROM lab.runs")  # the connection goes on
        assert cursor.fetchall() == [(200,)]


@pytest.mark.slow
def test_a_query_over_the_endpoints_time_bound_is_cancelled(endpoint):
    bounded = start(endpoint.cluster.cluster_file, Options(query_seconds_max=1.0))
    try:
        client, options = endpoint.client()
        client = flight.connect(f"grpc://127.0.0.1:{bounded.port}")
        info = _info(client, options, ENDLESS)
        reader = client.do_get(info.endpoints[0].ticket, options)
        started = time.monotonic()
        rows, error = _read_until_error(reader)
        elapsed = time.monotonic() - started
        assert isinstance(error, flight.FlightCancelledError) and "bound of 1 s" in str(error)
        assert rows > 0 and 1.0 <= elapsed < 5.0, (rows, elapsed)
        assert bounded.statements.running() == 0
    finally:
        bounded.shutdown()
    _settled(endpoint)


def test_a_ticket_is_read_once_and_by_its_token_only(endpoint):
    client, options = endpoint.client()
    other_token = endpoint.credentials.token(Role.READER)
    _, other = endpoint.client(other_token)
    info = _info(client, options, "SELECT count(*) AS n FROM lab.runs")
    ticket = info.endpoints[0].ticket
    assert _cancel(client, other, info) is CancelStatus.NOT_CANCELLABLE
    with pytest.raises(flight.FlightServerError, match="no such result"):
        client.do_get(ticket, other).read_all()
    assert client.do_get(ticket, options).read_all().to_pylist() == [{"n": 200}]
    with pytest.raises(flight.FlightServerError, match="read once"):
        client.do_get(ticket, options).read_all()
