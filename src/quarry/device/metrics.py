"""Prometheus metrics of a device or a storage server, served at ``--metrics-port``.

What a process already counts for its callers is what it exposes: the work counters of every
``WorkDone`` it sent (the one declaration, ``WorkCounters``: each field is a counter here, its
name made from the field's by the rule in ``work_metric``, so a counter added there shows up
here), its admission (``Admission.status``), its store and its drive's links. Nothing is kept
twice: gauges are read from the process's state when Prometheus scrapes, and the only figures
kept for metrics alone are the totals of work done and a latency histogram per kind of call.

Names follow Prometheus's conventions (docs/operations.md lists every one): the one prefix
``quarry_``, the base unit last (``_bytes``, ``_seconds``, ``_slices``), ``_total`` on
counters, and no label but the kind of call, of which there are a few dozen, fixed by the
protocol, and why slices were pushed back (``PushBack``'s seven reasons: the counters per
reason are one family, ``quarry_pushed_back_slices_total{reason=...}``); a per-dataset or
per-query label would grow without bound.

``prometheus_client`` is imported only by a process that serves metrics: one that does not
pays nothing for them, not even the timing of its calls.

The endpoint listens where the server does (loopback by default). Anywhere else the server
runs under TLS, and so does the endpoint, with the server's certificate (and, with
``--verify-clients``, it requires a certificate the cluster's CA signed of the scraper). It
checks no token: it reads counts, never data.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quarry.protocol.counters import COUNTERS, PUSHED_BACK_BY, WorkCounters
from quarry.protocol.work import WorkDone

if TYPE_CHECKING:
    from prometheus_client.core import Metric

PREFIX = "quarry_"
# A WorkCounters field names its unit first (bytes_read); Prometheus wants it last.
UNITS_FIRST = ("slices", "rows", "bytes")
# Request latencies from a pulse (a millisecond) to a long scan's stream (minutes).
LATENCY_BUCKETS_S = (0.001, 0.005, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 15.0, 60.0, 300.0)


def work_metric(counter: str) -> str:
    """A work counter's metric name, without ``_total``: ``bytes_read`` ->
    ``quarry_work_read_bytes``, ``slices_total`` -> ``quarry_work_slices``, ``drive_s`` ->
    ``quarry_work_drive_seconds``."""
    words = counter.split("_")
    if words[-1] == "s":
        words[-1] = "seconds"
    if words[0] in UNITS_FIRST:
        words = [*words[1:], words[0]]
    if words[0] == "total":  # slices_total: every slice a request named
        words = words[1:]
    return PREFIX + "work_" + "_".join(words)


# each counter its own family, but those per push-back reason: one family, labeled by reason
WORK_METRICS: dict[str, str] = {
    counter: work_metric(counter) for counter in COUNTERS if counter not in PUSHED_BACK_BY.values()
}
assert len(set(WORK_METRICS.values())) == len(WORK_METRICS), WORK_METRICS
PUSHED_BACK_METRIC = PREFIX + "pushed_back_slices"


@dataclass(frozen=True)
class Gauge:
    """One figure read at scrape time: its name (with its unit), what it means, its value."""

    name: str
    why: str
    value: float
    counter: bool = False  # it only grows (exposed with ``_total``)


class ServerMetrics:
    """A server process's metrics: the work totals it adds to as ``WorkDone`` messages go out
    (kept always: ``StatsReply`` carries them), and once it serves them (``serve``), the
    latency of each kind of call and ``figures``, read when Prometheus scrapes. Until then it
    times nothing and ``prometheus_client`` is not even imported."""

    def __init__(self, figures: Callable[[], Iterable[Gauge]]):
        self._figures = figures
        self._lock = threading.Lock()
        self._work = WorkCounters()
        self._latency: Any = None  # prometheus_client's Histogram, once served
        self.port: int | None = None

    def work_done(self, done: WorkDone) -> None:
        """The counts of a work stream, exactly as its ``WorkDone`` tells them to the caller
        (EXPLAIN ANALYZE's figures of this device come from the same message)."""
        counted = WorkCounters.sum(p.metrics.counters for p in done.partitions)
        with self._lock:
            self._work = self._work.plus(counted)

    def work_total(self) -> WorkCounters:
        """Every work stream's counts since the process started (``StatsReply.work``)."""
        with self._lock:
            return self._work

    def timed(self, call: str) -> contextlib.AbstractContextManager:
        """A context in which ``call``'s time is measured into its histogram (served only)."""
        if self._latency is None:
            return contextlib.nullcontext()
        return self._latency.labels(call).time()

    def timed_stream(self, call: str, batches: Iterable) -> Iterator:
        """``batches``, the call's time observed when the last is sent (or the stream ends)."""
        with self.timed(call):
            yield from batches

    def work_families(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily

        with self._lock:
            work = self._work
        for counter, name in WORK_METRICS.items():
            family = CounterMetricFamily(name, f"Work streams: {counter} (WorkCounters)")
            family.add_metric([], getattr(work, counter))
            yield family
        family = CounterMetricFamily(
            PUSHED_BACK_METRIC,
            "Slices pushed back to the caller, by why (PushBack)",
            labels=["reason"],
        )
        for reason, counter in PUSHED_BACK_BY.items():
            family.add_metric([reason.value], getattr(work, counter))
        yield family

    def figure_families(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        for figure in self._figures():
            kind = CounterMetricFamily if figure.counter else GaugeMetricFamily
            yield kind(PREFIX + figure.name, figure.why, value=figure.value)

    def serve(
        self,
        host: str,
        port: int,
        tls: tuple[bytes, bytes] | None,
        client_ca: bytes | None,
        folder: Path,
    ) -> int:
        """Listen on ``host``:``port`` (0: any free port) in a thread of its own; the port.
        Under ``tls`` (certificate, key as PEM) the endpoint is HTTPS, and with ``client_ca``
        it requires a client certificate that CA signed."""
        from prometheus_client import (
            CollectorRegistry,
            Histogram,
            disable_created_metrics,
            start_http_server,
        )

        # A histogram's ``_created`` gauge (when its series began) names no unit and says
        # nothing a scrape's timestamps do not: this process exposes none.
        disable_created_metrics()
        registry = CollectorRegistry(auto_describe=False)
        self._latency = Histogram(
            PREFIX + "request_duration_seconds",
            "Time a call took to answer (a stream: until its last batch), by kind of call",
            ["call"],
            registry=registry,
            buckets=LATENCY_BUCKETS_S,
        )
        registry.register(_Collector(self))
        files: dict[str, str] = {}
        if tls is not None:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            files["certfile"] = _private(folder, "metrics-cert.pem", tls[0])
            files["keyfile"] = _private(folder, "metrics-key.pem", tls[1])
            if client_ca is not None:
                files["client_cafile"] = _private(folder, "metrics-ca.pem", client_ca)
        server, _thread = start_http_server(
            port,
            addr=host,
            registry=registry,
            client_auth_required=client_ca is not None and tls is not None,
            **files,
        )
        self.port = int(server.server_port)
        return self.port


def _private(folder: Path, name: str, content: bytes) -> str:
    """``content`` in a file only this user reads (the TLS key among them), its path."""
    with tempfile.NamedTemporaryFile(dir=folder, prefix=name, delete=False) as file:
        file.write(content)
    path = Path(file.name)
    path.chmod(0o600)
    return str(path.replace(folder / name))


class _Collector:
    def __init__(self, metrics: ServerMetrics):
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        yield from self.metrics.work_families()
        yield from self.metrics.figure_families()


def admission_figures(status: dict[str, int]) -> list[Gauge]:
    """``Admission.status()``: work running, the bound, refused as busy, output queued."""
    return [
        Gauge(
            "work_running_exchanges",
            "Streams of work running now (both lanes)",
            status["running"] + status["running_small"],
        ),
        Gauge(
            "work_limit_exchanges",
            "Streams of work it runs at once in each lane",
            status["exchanges_max"],
        ),
        Gauge("work_admitted_exchanges", "Streams of work admitted", status["admitted"], True),
        Gauge(
            "work_refused_busy_exchanges",
            "Streams of work refused as busy (the caller backs off and retries)",
            status["refused"],
            True,
        ),
        Gauge(
            "admission_queued_bytes",
            "Output computed but not yet sent (it refuses new work beyond a bound)",
            status["queued_bytes"],
        ),
    ]


def link_figures(read_bytes: int, shipped_bytes: int) -> list[Gauge]:
    """Every byte through the drive's internal link (read) and its external one (shipped):
    work, scans, fetches of pushed-back ranges, calibration and scrubs alike."""
    return [
        Gauge("drive_read_bytes", "Bytes read from the store, whatever for", read_bytes, True),
        Gauge("link_shipped_bytes", "Bytes sent to callers, whatever for", shipped_bytes, True),
    ]


def space_figures(data: Path, store_bytes: int) -> list[Gauge]:
    usage = shutil.disk_usage(data)
    return [
        Gauge("store_size_bytes", "Size of the key-value store's file", store_bytes),
        Gauge("filesystem_free_bytes", "Free space on the data folder's file system", usage.free),
    ]
