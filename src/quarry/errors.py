"""Errors users can act on: each says what was wrong and what to do.

Errors cross the Flight wire as ``QUARRY|<code>|<message>`` so a client can rebuild the same
typed exception that the device raised (see ``quarry.protocol.encode_error``).
"""

from __future__ import annotations

import re


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
    """A stored slice that does not decode or does not match its metadata (damaged storage):
    the device names the slice; a replica may still hold a good copy."""

    code = "corrupt_slice"


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


class ExecutionError(QueryError):
    """A query failed while running (division by zero, a bad cast): the engine's message, and
    the device that met it. Running it elsewhere would fail the same way, so nothing retries."""

    code = "execution_error"


def error_class(code: str) -> type[QuarryError]:
    """The QuarryError subclass with this wire code (subclasses defined anywhere count)."""
    pending: list[type[QuarryError]] = [QuarryError]
    while pending:
        cls = pending.pop()
        if cls.code == code:
            return cls
        pending.extend(cls.__subclasses__())
    return QuarryError
