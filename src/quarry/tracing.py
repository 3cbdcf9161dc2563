"""Traces of a query across every process it runs in (OpenTelemetry, W3C trace context).

EXPLAIN ANALYZE sums what each device did; a trace says *when*: the host's planning, each
fragment, each device's exchange and the stages it ran, the ranges it pushed back and the
host's completion of them, a storage server forwarding to its drives. One trace per query:
the host opens its root span, and every Flight call the query makes carries the caller's span
in a ``traceparent`` header (W3C trace context), under which the device or server that answers
opens its own. So the spans every process exports join into one tree.

**Off unless configured, and then free.** A process traces when ``QUARRY_TRACE_FILE`` is set
(every process appends its spans to that file, one JSON line a span) or
``OTEL_EXPORTER_OTLP_ENDPOINT`` is (OTLP over HTTP, with OpenTelemetry's own variables for the
rest). Otherwise every function here returns ``NO_SPAN``, whose methods do nothing: no
``opentelemetry`` import, no header on a call, no middleware on a server. A device traces only
the calls that carry a ``traceparent``: its spans always belong to a query's trace.

**Explicit parents.** quarry's work runs on pools of kept threads and in generators resumed by
whichever thread reads them, where OpenTelemetry's "current span" (a context variable) set in
one place is not the one read in another. So a span is handed to whoever opens its children
(a dispatch ``Task`` carries its fragment's, the device loop its exchange's), and nothing here
reads or sets the current span.

Bounded: spans wait for export in OpenTelemetry's batch processor (2048 at most; beyond, they
are dropped, never the query's time), and an attribute's text is cut at ``TEXT_CHARS_MAX``.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from pyarrow import flight

from quarry import settings

TRACEPARENT = "traceparent"  # the W3C header every traced Flight call carries
MIDDLEWARE = "quarry-trace"  # the server middleware that reads it
OTLP_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
FILE_EXPORT_DELAY_MS = 500  # a file is read on this machine: spans there within half a second
TEXT_CHARS_MAX = 1000  # an attribute's text (a query's SQL), an error's, is cut here

Attribute = str | int | float | bool


class Span:
    """A span of a trace, or (this class itself, ``NO_SPAN``) none: every method does nothing
    and ``child`` returns ``NO_SPAN`` again, so code that traces reads the same on or off."""

    recording = False

    def child(self, name: str, **attributes: Attribute) -> Span:
        """A span under this one (ended by ``end``, or a ``with`` block)."""
        return self

    def set(self, **attributes: Attribute) -> None:
        """Attributes learnt as the span goes (rows, bytes)."""

    def headers(self) -> list[tuple[bytes, bytes]]:
        """This span as a Flight call's headers: the callee's spans go under it."""
        return []

    def end(self, error: BaseException | None = None) -> None:
        """The span ends now (once: a second end does nothing); ``error`` marks it failed."""

    def around(self, items: Iterable[Any]) -> Iterable[Any]:
        """``items``, the span ended when the last is taken (or the stream stops)."""
        return items

    def __enter__(self) -> Span:
        return self

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> None:
        self.end(error)


NO_SPAN = Span()


class _Recording(Span):
    recording = True

    def __init__(self, tracer: Any, span: Any):
        self._tracer = tracer
        self._span = span
        self._ended = False
        self._headers: list[tuple[bytes, bytes]] | None = None

    def child(self, name: str, **attributes: Attribute) -> Span:
        from opentelemetry import trace

        context = trace.set_span_in_context(self._span)
        return _Recording(self._tracer, self._tracer.start_span(name, context, **_kw(attributes)))

    def set(self, **attributes: Attribute) -> None:
        self._span.set_attributes(_attributes(attributes))

    def headers(self) -> list[tuple[bytes, bytes]]:
        if self._headers is None:  # a span's calls all carry the same: made once
            context = self._span.get_span_context()
            parent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
            self._headers = [(TRACEPARENT.encode(), parent.encode())]
        return self._headers

    def end(self, error: BaseException | None = None) -> None:
        if self._ended:
            return
        self._ended = True
        if error is not None and not isinstance(error, GeneratorExit):
            from opentelemetry.trace import Status, StatusCode

            text = f"{type(error).__name__}: {error}"[:TEXT_CHARS_MAX]
            self._span.set_status(Status(StatusCode.ERROR, text))
        self._span.end()

    def around(self, items: Iterable[Any]) -> Iterator[Any]:
        try:
            yield from items
        except BaseException as error:
            self.end(error)
            raise
        finally:
            self.end()


def _attributes(attributes: dict[str, Attribute]) -> dict[str, Attribute]:
    return {
        f"quarry.{key}": value[:TEXT_CHARS_MAX] if isinstance(value, str) else value
        for key, value in attributes.items()
    }


def _kw(attributes: dict[str, Attribute]) -> dict[str, Any]:
    return {"attributes": _attributes(attributes)} if attributes else {}


# ---- this process's exporter -------------------------------------------------------------------

_lock = threading.Lock()
_service = ("quarry-host", f"{socket.gethostname()}:{os.getpid()}")
_installed: tuple[tuple[str, str], Any, Any] | None = None  # configuration, provider, tracer


def name_process(service: str, instance: str) -> None:
    """What this process's spans say it is (``service.name``, ``service.instance.id``): a
    device or server names itself as it starts, before its first span."""
    global _service
    _service = (service, instance)


def configured() -> tuple[str, str] | None:
    """Where spans go, as the environment says now (the trace file, the OTLP endpoint), or None:
    tracing is off."""
    path = settings.TRACE_FILE.get()
    endpoint = next((os.environ[n] for n in OTLP_ENDPOINTS if os.environ.get(n, "").strip()), "")
    if path is None and not endpoint:
        return None
    return (str(path) if path is not None else "", endpoint)


def _tracer() -> Any:
    """This process's tracer for the configuration in force, or None (off). Read at each
    query: a process may be told to trace after it started (a test, a benchmark's turns)."""
    global _installed
    wanted = configured()
    if wanted is None:
        return None
    with _lock:
        if _installed is None or _installed[0] != wanted:
            if _installed is not None:
                _installed[1].shutdown()  # its spans exported where they were meant to go
            provider = _provider(*wanted)
            _installed = (wanted, provider, provider.get_tracer("quarry"))
        return _installed[2]


def _provider(path: str, endpoint: str) -> Any:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    service, instance = _service
    resource = Resource.create({"service.name": service, "service.instance.id": instance})
    provider = TracerProvider(resource=resource)
    if endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    if path:
        exporter = _FileExporter(Path(path).resolve())
        processor = BatchSpanProcessor(exporter, schedule_delay_millis=FILE_EXPORT_DELAY_MS)
        provider.add_span_processor(processor)
    return provider


def flush(timeout_s: float = 10.0) -> None:
    """Every span this process ended, exported now (a test reads them; a command that ends)."""
    with _lock:
        installed = _installed
    if installed is not None:
        installed[1].force_flush(int(timeout_s * 1000))


class _FileExporter:
    """Spans as JSON lines, appended to a file that several processes share: each batch is one
    ``write`` to a file opened for appending, so lines of two processes never mix.

    A line has the fields of OpenTelemetry's own JSON of a span (``ReadableSpan.to_json``) but
    its events and links, which quarry makes none of, written compactly: ``to_json`` took
    three times a span's own cost (its resource encoded again for every span)."""

    def __init__(self, path: Path):
        self.path = path
        self._resources: dict[int, str] = {}  # a resource's JSON, by id: the same every line

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        text = "".join(self._line(span) for span in spans).encode()
        descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            written = os.write(descriptor, text)
        finally:
            os.close(descriptor)
        return SpanExportResult.SUCCESS if written == len(text) else SpanExportResult.FAILURE

    def _line(self, span: Any) -> str:
        from opentelemetry.sdk.util import ns_to_iso_str

        context, parent, status = span.context, span.parent, span.status
        resource = self._resources.get(id(span.resource))
        if resource is None:
            attributes = dict(span.resource.attributes)
            resource = self._resources[id(span.resource)] = json.dumps({"attributes": attributes})
        state = {"status_code": status.status_code.name}
        if status.description:
            state["description"] = status.description
        line = {
            "name": span.name,
            "context": {
                "trace_id": f"0x{context.trace_id:032x}",
                "span_id": f"0x{context.span_id:016x}",
            },
            "kind": str(span.kind),
            "parent_id": f"0x{parent.span_id:016x}" if parent is not None else None,
            "start_time": ns_to_iso_str(span.start_time),
            "end_time": ns_to_iso_str(span.end_time),
            "status": state,
            "attributes": dict(span.attributes),
        }
        return json.dumps(line, separators=(",", ":"))[:-1] + ',"resource":' + resource + "}\n"

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


# ---- where spans begin ---------------------------------------------------------------------


def query(name: str, **attributes: Attribute) -> Span:
    """A query's root span on the host (``NO_SPAN`` while tracing is off)."""
    tracer = _tracer()
    if tracer is None:
        return NO_SPAN
    return _Recording(tracer, tracer.start_span(name, **_kw(attributes)))


def server_middleware() -> dict[str, flight.ServerMiddlewareFactory]:
    """The middleware a server takes to read its callers' ``traceparent`` (none while tracing
    is off: a call then costs nothing more)."""
    return {MIDDLEWARE: _Reader()} if configured() is not None else {}


def served(context: flight.ServerCallContext, name: str, **attributes: Attribute) -> Span:
    """The span of a call a server answers, under its caller's; ``NO_SPAN`` if the call carries
    no trace (or this server does not trace)."""
    carried = context.get_middleware(MIDDLEWARE)
    if carried is None:
        return NO_SPAN
    tracer = _tracer()
    if tracer is None:
        return NO_SPAN
    from opentelemetry import trace

    parent = trace.set_span_in_context(trace.NonRecordingSpan(carried.parent))
    span = tracer.start_span(name, parent, kind=trace.SpanKind.SERVER, **_kw(attributes))
    return _Recording(tracer, span)


def _parent(traceparent: str) -> Any:
    """A caller's span from its ``traceparent`` (``00-<trace>-<span>-<flags>``, hex), or None
    where it is not one: a call with a broken header is answered, untraced."""
    from opentelemetry.trace import INVALID_SPAN_ID, INVALID_TRACE_ID, SpanContext, TraceFlags

    parts = traceparent.strip().split("-")
    if len(parts) != 4 or [len(p) for p in parts] != [2, 32, 16, 2] or parts[0] == "ff":
        return None
    try:
        trace_id, span_id, flags = (int(p, 16) for p in parts[1:])
    except ValueError:
        return None
    if trace_id == INVALID_TRACE_ID or span_id == INVALID_SPAN_ID or not flags & 1:
        return None  # not sampled by the caller: nothing here is either
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags))


class _Carried(flight.ServerMiddleware):
    def __init__(self, parent: Any):
        self.parent = parent  # the caller's span (an OpenTelemetry SpanContext)


class _Reader(flight.ServerMiddlewareFactory):
    def start_call(self, info: flight.CallInfo, headers: dict) -> _Carried | None:
        values = headers.get(TRACEPARENT)
        parent = _parent(values[0]) if values else None
        return _Carried(parent) if parent is not None else None
