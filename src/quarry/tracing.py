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

**Cheap when on.** A span is a few plain fields while it runs (ids, name, start, attributes)
and, ended, is written to the file as it is (``_FileExport``) or becomes OpenTelemetry's
``ReadableSpan`` for its OTLP exporter (``_Sink`` says why not its ``Tracer``). Bounded: spans
wait for export in a queue (2048 at most; beyond, they are dropped, never the query's time), and
an attribute's text is cut at ``TEXT_CHARS_MAX``.
"""

from __future__ import annotations

import atexit
import collections
import json
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pyarrow import flight

from quarry import settings

logger = logging.getLogger(__name__)

TRACEPARENT = "traceparent"  # the W3C header every traced Flight call carries
MIDDLEWARE = "quarry-trace"  # the server middleware that reads it
OTLP_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
FILE_EXPORT_DELAY_MS = 500  # a file is read on this machine: spans there within half a second
SPANS_WAITING_MAX = 2048  # for the file's writer (OpenTelemetry's processor's queue: the same)
TEXT_CHARS_MAX = 1000  # an attribute's text (a query's SQL), an error's, is cut here

Attribute = str | int | float | bool
INTERNAL, SERVER = 0, 1  # OpenTelemetry's SpanKind values, without importing it
SAMPLED = 1  # the W3C trace flag: quarry records every span of a traced query
UNSET = '{"status_code":"UNSET"}'  # a span's status in the trace file unless it failed
_random_bits = random.getrandbits  # as OpenTelemetry's own ids are drawn


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
    """A span being recorded: its ids, name, start and attributes, kept as plain fields until
    it ends, then handed to the export as OpenTelemetry's ``ReadableSpan``."""

    recording = True

    def __init__(
        self,
        sink: _Sink,
        name: str,
        trace_id: int,
        parent: Any,  # the parent's SpanContext; None: a root
        attributes: dict[str, Attribute],
        kind: int = INTERNAL,
    ):
        self._sink = sink
        self._name = name
        self._trace_id = trace_id
        self._span_id = _random_bits(64)
        self._parent = parent
        self._attributes = _attributes(attributes)
        self._kind = kind
        self._start_ns = time.time_ns()
        self._end_ns = 0
        self._error = ""
        self._ended = False
        self._headers: list[tuple[bytes, bytes]] | None = None
        self._span_context: Any = None  # OpenTelemetry's SpanContext of it, made once asked

    def child(self, name: str, **attributes: Attribute) -> Span:
        return _Recording(self._sink, name, self._trace_id, self._context(), attributes)

    def set(self, **attributes: Attribute) -> None:
        self._attributes.update(_attributes(attributes))

    def headers(self) -> list[tuple[bytes, bytes]]:
        if self._headers is None:  # a span's calls all carry the same: made once
            parent = f"00-{self._trace_id:032x}-{self._span_id:016x}-01"
            self._headers = [(TRACEPARENT.encode(), parent.encode())]
        return self._headers

    def end(self, error: BaseException | None = None) -> None:
        if self._ended:
            return
        self._ended = True
        if error is not None and not isinstance(error, GeneratorExit):
            self._error = f"{type(error).__name__}: {error}"[:TEXT_CHARS_MAX]
        self._sink.ended(self, time.time_ns())

    def around(self, items: Iterable[Any]) -> Iterator[Any]:
        try:
            yield from items
        except BaseException as error:
            self.end(error)
            raise
        finally:
            self.end()

    def _context(self) -> Any:
        if self._span_context is None:  # asked by each child and by the export: made once
            self._span_context = _otel.SpanContext(
                self._trace_id, self._span_id, False, _otel.sampled
            )
        return self._span_context

    @property
    def context(self) -> Any:
        """What OpenTelemetry's batch processor asks of a span it takes (is it sampled)."""
        return self._context()

    def line(self, resource: str) -> str:
        """This span, ended, as a line of the trace file (``_FileExport``), its process's
        ``resource`` already JSON."""
        parent = self._parent
        parent_id = f'"0x{parent.span_id:016x}"' if parent is not None else "null"
        kind = "SpanKind.SERVER" if self._kind == SERVER else "SpanKind.INTERNAL"
        status = {"status_code": "ERROR", "description": self._error} if self._error else None
        return (
            f'{{"name":"{self._name}","context":{{"trace_id":"0x{self._trace_id:032x}",'
            f'"span_id":"0x{self._span_id:016x}"}},"kind":"{kind}","parent_id":{parent_id},'
            f'"start_time_unix_nano":{self._start_ns},"end_time_unix_nano":{self._end_ns},'
            f'"status":{json.dumps(status) if status else UNSET},'
            f'"attributes":{json.dumps(self._attributes, separators=(",", ":"))},'
            f'"resource":{resource}}}\n'
        )

    def readable(self, end_ns: int, resource: Any) -> Any:
        """This span, ended, as OpenTelemetry's exporters take it."""
        status = _otel.Status(_otel.StatusCode.ERROR, self._error) if self._error else _otel.ok
        return _otel.ReadableSpan(
            name=self._name,
            context=self._context(),
            parent=self._parent,
            resource=resource,
            attributes=self._attributes,
            kind=_otel.kinds[self._kind],
            status=status,
            start_time=self._start_ns,
            end_time=end_ns,
        )


_NAMES: dict[str, str] = {}  # an attribute's name as exported (a few dozen, fixed in code)


def _attributes(attributes: dict[str, Attribute]) -> dict[str, Attribute]:
    named = {}
    for key, value in attributes.items():
        name = _NAMES.get(key) or _NAMES.setdefault(key, f"quarry.{key}")
        named[name] = value[:TEXT_CHARS_MAX] if isinstance(value, str) else value
    return named


# ---- this process's exporter -------------------------------------------------------------------

_lock = threading.Lock()
_service = ("quarry-host", f"{socket.gethostname()}:{os.getpid()}")
_installed: tuple[tuple[str, str], _Sink] | None = None  # its configuration, its exports


def _forget_exports() -> None:
    """A forked child starts its own exports: its parent's writer thread is not in it, and the
    spans its parent had waiting are the parent's to write (not twice, at the child's exit)."""
    global _installed, _lock
    if _installed is not None:
        sink = _installed[1]
        atexit.unregister(sink.shutdown)
        if sink.file is not None:
            sink.file.forget()
    _installed, _lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_exports)


def name_process(service: str, instance: str) -> None:
    """What this process's spans say it is (``service.name``, ``service.instance.id``): a
    device or server names itself as it starts, before its first span."""
    global _service
    _service = (service, instance)


_read: tuple[tuple[str, ...], tuple[str, str] | None] = ((), None)  # the variables, as parsed


def configured() -> tuple[str, str] | None:
    """Where spans go, as the environment says now (the trace file, the OTLP endpoint), or None:
    tracing is off. Read at every query: parsed again only when the variables changed."""
    global _read
    names = (settings.TRACE_FILE.name, *OTLP_ENDPOINTS)
    raw = tuple(os.environ.get(name, "") for name in names)
    if raw != _read[0]:
        _read = (raw, _parse_configuration())
    return _read[1]


def _parse_configuration() -> tuple[str, str] | None:
    path = settings.TRACE_FILE.get()
    endpoint = next((os.environ[n] for n in OTLP_ENDPOINTS if os.environ.get(n, "").strip()), "")
    if path is None and not endpoint:
        return None
    return (str(path) if path is not None else "", endpoint)


class _OpenTelemetry:
    """The few names of OpenTelemetry a span needs, imported once the process traces (an
    import in a function costs a lookup at every call: a dozen per span)."""

    def __init__(self) -> None:
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

        self.ReadableSpan, self.SpanContext = ReadableSpan, SpanContext
        self.Status, self.StatusCode = Status, StatusCode
        self.sampled = TraceFlags(SAMPLED)
        self.ok = Status()
        self.kinds = {INTERNAL: SpanKind.INTERNAL, SERVER: SpanKind.SERVER}


_otel: Any = None  # an _OpenTelemetry once the process traces


def _opentelemetry() -> _OpenTelemetry:
    global _otel
    _otel = _otel or _OpenTelemetry()
    return _otel


class _Sink:
    """Where this process's ended spans go: to OTLP through OpenTelemetry's batch processor, to
    the file through ``_FileExport`` (each a bounded queue, exported from a thread of its own,
    flushed at exit).

    Why not OpenTelemetry's own ``Tracer``: its live spans (locks, bounded attributes, a
    sampler and the processors called at start and end) cost about 20 µs each, and a span's
    ``to_json`` 45 more, which on a small query (a few ms, a dozen spans) was 8-13% of its
    time. A span here is a few plain fields; ended, it becomes a ``ReadableSpan`` for OTLP,
    and goes as it is to the file's exporter, which writes its line from those fields."""

    def __init__(self, path: str, endpoint: str):
        from opentelemetry.sdk.resources import Resource

        _opentelemetry()
        service, instance = _service
        self.resource = Resource.create({"service.name": service, "service.instance.id": instance})
        self.processors: list[Any] = []
        self.otlp = None  # takes ReadableSpans
        self.file = None  # takes quarry's spans as they are: its exporter writes their lines
        if endpoint:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            self.otlp = BatchSpanProcessor(OTLPSpanExporter())
            self.processors.append(self.otlp)
        if path:
            resource = json.dumps({"attributes": dict(self.resource.attributes)})
            self.file = _FileExport(Path(path).resolve(), resource)
            self.processors.append(self.file)
        atexit.register(self.shutdown)

    def ended(self, span: _Recording, end_ns: int) -> None:
        span._end_ns = end_ns
        if self.file is not None:
            self.file.on_end(span)
        if self.otlp is not None:
            self.otlp.on_end(span.readable(end_ns, self.resource))

    def flush(self, timeout_s: float) -> None:
        for processor in self.processors:
            processor.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        """Every span ended so far exported, then no more (at exit, or a new configuration)."""
        atexit.unregister(self.shutdown)
        for processor in self.processors:
            processor.shutdown()


def _sink(wanted: tuple[str, str] | None = None) -> _Sink | None:
    """This process's exports for the configuration in force (``wanted``, else the environment
    now), or None (off). Read at each query: a process may be told to trace after it started
    (a test, a benchmark's turns)."""
    global _installed
    wanted = wanted or configured()
    if wanted is None:
        return None
    with _lock:
        if _installed is None or _installed[0] != wanted:
            if _installed is not None:
                _installed[1].shutdown()  # its spans exported where they were meant to go
            _installed = (wanted, _Sink(*wanted))
        return _installed[1]


def flush(timeout_s: float = 10.0) -> None:
    """Every span this process ended, exported now (a test reads them; a command that ends)."""
    with _lock:
        installed = _installed
    if installed is not None:
        installed[1].flush(timeout_s)


class _FileExport:
    """Spans as JSON lines, appended to a file that several processes share: each batch is one
    ``write`` to a file opened for appending, so lines of two processes never mix.

    A line has the fields of OpenTelemetry's own JSON of a span (``ReadableSpan.to_json``) but
    its events and links, which quarry makes none of, and its times as OTLP's JSON has them
    (nanoseconds since the epoch, ``start_time_unix_nano``), written compactly from quarry's
    span (``_Recording.line``), the process's resource encoded once.

    Batched here, not by OpenTelemetry's batch processor: ending a span is one append to a
    bounded deque, where that processor's ``on_end`` asks the span's sampling, the process's
    id and its queue's length (a few µs a span, which a small query's dozen spans feel). A
    thread of its own writes what waits every ``FILE_EXPORT_DELAY_MS``; past
    ``SPANS_WAITING_MAX`` waiting, the oldest are dropped (counted), never the query's time."""

    def __init__(self, path: Path, resource: str):
        self.path = path
        self.resource = resource
        self.dropped = 0
        self._waiting: collections.deque[_Recording] = collections.deque(maxlen=SPANS_WAITING_MAX)
        self._writing = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="quarry-trace-file", daemon=True)
        self._thread.start()

    def on_end(self, span: _Recording) -> None:
        if len(self._waiting) == SPANS_WAITING_MAX:
            self.dropped += 1
            if self.dropped == 1:
                logger.warning(
                    "trace file %s: spans come faster than written; oldest dropped", self.path
                )
        self._waiting.append(span)

    def forget(self) -> None:
        """No span waiting (a forked child's copy of its parent's)."""
        self._waiting.clear()

    def _run(self) -> None:
        while not self._stop.wait(FILE_EXPORT_DELAY_MS / 1000):
            self.force_flush()

    def force_flush(self, timeout_millis: int = 0) -> bool:
        """Every span waiting, written now (``timeout_millis``: as the processors take it)."""
        with self._writing:
            spans = [self._waiting.popleft() for _ in range(len(self._waiting))]
            if not spans:
                return True
            text = "".join(span.line(self.resource) for span in spans).encode()
            descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                return os.write(descriptor, text) == len(text)
            finally:
                os.close(descriptor)

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=FILE_EXPORT_DELAY_MS / 1000 * 4)
        self.force_flush()


# ---- where spans begin ---------------------------------------------------------------------


def query(name: str, **attributes: Attribute) -> Span:
    """A query's root span on the host (``NO_SPAN`` while tracing is off): a new trace."""
    sink = _sink()
    if sink is None:
        return NO_SPAN
    return _Recording(sink, name, _random_bits(128), None, attributes)


def server_middleware() -> dict[str, flight.ServerMiddlewareFactory]:
    """The middleware a server takes to read its callers' ``traceparent`` (none while tracing
    is off: a call then costs nothing more)."""
    wanted = configured()
    return {MIDDLEWARE: _Reader(wanted)} if wanted is not None else {}


def served(context: flight.ServerCallContext, name: str, **attributes: Attribute) -> Span:
    """The span of a call a server answers, under its caller's; ``NO_SPAN`` if the call carries
    no trace (or this server does not trace)."""
    carried = context.get_middleware(MIDDLEWARE)
    if carried is None:
        return NO_SPAN
    sink = _sink(carried.wanted)  # as configured when the server started: no lookup per call
    if sink is None:
        return NO_SPAN
    parent = carried.parent
    return _Recording(sink, name, parent.trace_id, parent, attributes, SERVER)


def _parent(traceparent: str) -> Any:
    """A caller's span from its ``traceparent`` (``00-<trace>-<span>-<flags>``, hex), or None
    where it is not one: a call with a broken header is answered, untraced."""
    parts = traceparent.strip().split("-")
    if len(parts) != 4 or [len(p) for p in parts] != [2, 32, 16, 2] or parts[0] == "ff":
        return None
    try:
        trace_id, span_id, flags = (int(p, 16) for p in parts[1:])
    except ValueError:
        return None
    if trace_id == 0 or span_id == 0 or not flags & SAMPLED:  # 0: W3C's invalid ids
        return None  # not sampled by the caller: nothing here is either
    return _opentelemetry().SpanContext(trace_id, span_id, True, _otel.sampled)


class _Carried(flight.ServerMiddleware):
    def __init__(self, parent: Any, wanted: tuple[str, str]):
        self.parent = parent  # the caller's span (an OpenTelemetry SpanContext)
        self.wanted = wanted


class _Reader(flight.ServerMiddlewareFactory):
    def __init__(self, wanted: tuple[str, str]):
        self.wanted = wanted  # where the server's spans go, as configured when it started

    def start_call(self, info: flight.CallInfo, headers: dict) -> _Carried | None:
        values = headers.get(TRACEPARENT)
        parent = _parent(values[0]) if values else None
        return _Carried(parent, self.wanted) if parent is not None else None
