"""quarry's errors as the Flight errors a Flight SQL client understands, message unchanged.

A Flight SQL client shows the server's message to its user (ADBC raises it as a DB-API error,
DBeaver prints it), so the message is quarry's own, not framed for quarry's clients as device
errors are: "table 'datafusion.physics.nope' not found; hint: known tables: ..." reads the same
here as from ``quarry sql``. The Flight status says what kind of failure it was: a token
refused ("unauthenticated", "unauthorized"), a device that does not answer ("unavailable": try
again), a cancelled query ("cancelled"); anything else, a query that cannot be planned included,
is a server error carrying quarry's message. An internal error (quarry's own bug: an invariant
it broke, an error it did not expect) is an internal error carrying the ``InternalError``'s
message, which names the query; its traceback goes to the log, never to the client.

Every error is raised as a Flight error: pyarrow would answer any other Python exception with
its traceback appended to the message, which is noise to a SQL client and names the server's
files.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from pyarrow import flight

from quarry.errors import (
    NOT_ERRORS,
    ClusterError,
    DeviceBusy,
    DeviceUnavailable,
    Forbidden,
    InternalError,
    QuarryError,
    QueryCancelled,
    Unauthenticated,
    internal,
)

T = TypeVar("T")


def flight_error(error: BaseException) -> BaseException:
    """The error to raise to the client for ``error``."""
    message = "; ".join(line.strip() for line in str(error).splitlines() if line.strip())
    if isinstance(error, flight.FlightError):
        return error
    if isinstance(error, QueryCancelled):
        return flight.FlightCancelledError(message)
    if isinstance(error, Unauthenticated):
        return flight.FlightUnauthenticatedError(message)
    if isinstance(error, Forbidden):
        return flight.FlightUnauthorizedError(message)
    if isinstance(error, DeviceUnavailable | DeviceBusy | ClusterError):
        return flight.FlightUnavailableError(message)
    if isinstance(error, InternalError):
        return flight.FlightInternalError(message)
    if isinstance(error, QuarryError | NotImplementedError):
        return flight.FlightServerError(message)
    return flight_error(internal(error))  # the endpoint's own bug, logged with its traceback


def mapped(method: Callable[..., T]) -> Callable[..., T]:
    """A server method whose errors reach the client as ``flight_error`` says."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return method(*args, **kwargs)
        except NOT_ERRORS:
            raise
        except BaseException as error:  # a Rust panic in DataFusion is a BaseException
            raise flight_error(error) from None

    return wrapper


def mapped_stream(batches: Iterable[T]) -> Iterator[T]:
    """A stream whose errors, raised while it runs, reach the client as ``flight_error`` says
    (as those raised before it began do)."""
    try:
        yield from batches
    except NOT_ERRORS:
        raise
    except BaseException as error:
        raise flight_error(error) from None
