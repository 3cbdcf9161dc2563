"""Errors users can act on: each says what was wrong and what to do.

Errors cross the Flight wire as ``QUARRY|<code>|<message>`` so a client can rebuild the same
typed exception that the device raised (see ``quarry.protocol.encode_error``).
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterable, Iterator


class QuarryError(Exception):
    """Base of every error quarry raises on purpose. ``code`` names it on the wire."""

    code = "error"


class InvalidName(QuarryError, ValueError):
    code = "invalid_name"


class DatasetExists(QuarryError):
    code = "dataset_exists"


class DatasetNotFound(QuarryError, KeyError):
    code = "dataset_not_found"

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class InvalidOption(QuarryError, ValueError):
    """An option outside its choices (a compression, a mode); the message lists them."""

    code = "invalid_option"


class SchemaMismatch(QuarryError, ValueError):
    code = "schema_mismatch"


class SourceError(QuarryError, ValueError):
    """A file to ingest is missing, unreadable or malformed."""

    code = "source_error"


class SettingError(QuarryError, ValueError):
    """A ``QUARRY_*`` environment variable whose value is not of its type or is out of its
    bounds: the message names the variable, the value and what is allowed
    (``quarry.settings``, docs/configuration.md)."""

    code = "setting_error"


class ValueTooLarge(QuarryError, ValueError):
    code = "value_too_large"


class VersionConflict(QuarryError):
    """A compare-and-swap lost: another writer changed the key first; nothing was written."""

    code = "version_conflict"


class KeyNotFound(QuarryError, KeyError):
    code = "key_not_found"

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class UnknownProfile(QuarryError, ValueError):
    code = "unknown_profile"


class DeviceUnavailable(QuarryError, ConnectionError):
    """A device does not answer (down, wrong address, or died mid-request)."""

    code = "device_unavailable"


class DeviceSilent(DeviceUnavailable):
    """A device that sent nothing for ``QUARRY_DEVICE_SILENCE_S`` (not even the answer to a
    ping): a partition, a dead switch port, a powered-off host, where nothing resets the
    connection. Handled as any device that stopped answering; told apart so that a device
    listed down for silence is not waited for again on every query."""

    code = "device_silent"


class CatalogChanged(QuarryError):
    """What a device holds changed since the coordinator's catalog was read (another
    coordinator ingested or dropped, the device restarted): it refused the work before running
    any of it. The coordinator reads the catalog again and runs the query again."""

    code = "catalog_changed"


class DeviceBusy(QuarryError):
    """A device at its bound of concurrent work refused a request before starting it; it says
    when to come back (``retry_after_ms``). The coordinator backs off and retries."""

    code = "device_busy"

    def __init__(self, message: str, retry_after_ms: int | None = None):
        super().__init__(message)
        if retry_after_ms is None:  # rebuilt from the wire: the figure is in the message
            match = re.search(r"retry after (\d+) ms", message)
            retry_after_ms = int(match.group(1)) if match else 100
        self.retry_after_ms = retry_after_ms


class ProtocolMismatch(QuarryError):
    code = "protocol_mismatch"


class Unauthenticated(QuarryError):
    """A call without a valid token of this cluster."""

    code = "unauthenticated"


class Forbidden(QuarryError):
    """A valid token whose role may not make this call; nothing was changed."""

    code = "forbidden"


class CorruptSlice(QuarryError):
    """A stored value that fails its checksum, is cut short, does not decode or does not match
    its metadata (a flipped bit on a disk or in a DIMM, a torn write): never an answer. The
    message names the copy, "slice 3 of partition 0 of test/ones on device dev1" (or "the
    metadata slice of ...", "the catalog entry of ..."), and the fields are read back from it
    on the far side of the wire. A replica may hold a good copy: a query reads it there, and
    ``quarry scrub`` (or ``quarry repair``) mends this one from it."""

    code = "corrupt_slice"
    _COPY = re.compile(
        r"(?:slice (?P<slice>\d+)|the (?P<part>metadata slice|catalog entry)) of partition "
        r"(?P<partition>\d+) of (?P<dataset>\w+/\w+)(?: on device (?P<device>[\w.-]+))?"
    )

    def __init__(self, message: str) -> None:
        super().__init__(message)
        match = self._COPY.search(message)
        self.dataset: str | None = match["dataset"] if match else None  # domain/name
        self.partition: int | None = int(match["partition"]) if match else None
        self.slice: int | None = int(match["slice"]) if match and match["slice"] else None
        self.part = ("slice" if match["slice"] else match["part"].split()[0]) if match else None
        self.device: str | None = match["device"] if match else None
        self._end = match.end() if match else 0

    def on(self, device: str) -> CorruptSlice:
        """The same error naming ``device`` as the one holding the copy (unless it names one
        already, or no copy at all)."""
        if self.device is not None or self.dataset is None:
            return self
        text = str(self)
        return CorruptSlice(f"{text[: self._end]} on device {device}{text[self._end :]}")


class ProtocolError(QuarryError, ValueError):
    """A message that does not decode: a field of the wrong type or out of bounds, named."""

    code = "protocol_error"


class IngestFailed(QuarryError):
    code = "ingest_failed"


class ClusterError(QuarryError):
    code = "cluster_error"


class QueryError(QuarryError, ValueError):
    """SQL that cannot be planned: syntax, unknown table or column, type error."""

    code = "query_error"


class HostMemoryExceeded(QueryError):
    """The super-plan needs more host memory than its budget, for something that cannot spill."""

    code = "host_memory_exceeded"


class QueryCancelled(QuarryError):
    """A query stopped because its client (or a bound on its time) cancelled it: what it had
    started on the devices stops at their next batch, and nothing more is read."""

    code = "query_cancelled"


class PlanNotSupported(QuarryError):
    """A device cannot decode or plan a sub-plan; the host runs that part itself."""

    code = "plan_not_supported"


class StageFailed(QuarryError):
    """A stage failed on a device for the device's own reasons, not its rows': its engine
    panicked, ran out of memory, or met a fault. The device hands the range back for the host
    to run and quarantines the plan's shape there (docs/operations.md, "Quarantine"); only a
    unit that cannot hand work back lets the error reach its caller."""

    code = "stage_failed"

    def __init__(self, message: str, memory: bool = False) -> None:
        super().__init__(message)
        self.memory = memory  # out of memory: the range goes back, nothing is quarantined


class ExecutionError(QueryError):
    """A query failed while running (division by zero, a bad cast): the engine's message, and
    the device that met it. Running it elsewhere would fail the same way, so nothing retries."""

    code = "execution_error"


class InternalError(QuarryError):
    """quarry broke one of its own invariants, or met an error it does not know, while it ran a
    query: a bug, not the query's fault. The message names the query and what went wrong; the
    traceback goes to the log (``internal``), and the error it wraps is its ``__cause__``."""

    code = "internal_error"

    def __init__(self, message: str, query: str | None = None) -> None:
        self.what = message
        self.query = query
        super().__init__(message if query is None else f"{message}\nquery: {shown(query)}")


QUERY_CHARS_SHOWN_MAX = 300  # of a query's text, in an error that names it
# What stops the interpreter or a generator, not an error: never wrapped.
NOT_ERRORS = (KeyboardInterrupt, SystemExit, GeneratorExit)
log = logging.getLogger("quarry.errors")


def shown(query: str) -> str:
    """A query's text on one line, cut at ``QUERY_CHARS_SHOWN_MAX`` characters."""
    text = " ".join(query.split())
    if len(text) <= QUERY_CHARS_SHOWN_MAX:
        return text
    return text[: QUERY_CHARS_SHOWN_MAX - 3] + "..."


def internal(error: BaseException, query: str | None = None) -> InternalError:
    """``error``, which quarry did not raise on purpose, as the ``InternalError`` a user gets:
    its kind and first line, what to do, and the query; logged with its traceback."""
    if isinstance(error, InternalError):  # an invariant quarry checks itself, named there
        what = error.what
    else:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        what = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
    log.error("internal error%s", f" in query {shown(query)}" if query else "", exc_info=error)
    return InternalError(
        f"internal error in quarry ({what}); this is a bug: please report it with the query "
        "(the log holds the traceback)",
        query,
    )


@contextlib.contextmanager
def only_quarry_errors(query: str | None = None) -> Iterator[None]:
    """At an edge users hold (``Cluster``, the CLI, the Flight SQL endpoint): whatever is not
    a ``QuarryError`` leaves as an ``InternalError`` naming ``query`` (``internal``)."""
    try:
        yield
    except InternalError as error:
        if error.query is not None or query is None:
            raise
        raise internal(error, query) from error  # one raised where the query was not known
    except QuarryError:
        raise
    except BaseException as error:
        if isinstance(error, NOT_ERRORS):
            raise
        raise internal(error, query) from error


def only_quarry_errors_in(items: Iterable, query: str | None = None) -> Iterator:
    """``items`` as they come, under ``only_quarry_errors``: a stream's errors are raised where
    it is read, past the call that made it."""
    with only_quarry_errors(query):
        yield from items


def error_class(code: str) -> type[QuarryError]:
    """The QuarryError subclass with this wire code (subclasses defined anywhere count)."""
    pending: list[type[QuarryError]] = [QuarryError]
    while pending:
        cls = pending.pop()
        if cls.code == code:
            return cls
        pending.extend(cls.__subclasses__())
    return QuarryError
