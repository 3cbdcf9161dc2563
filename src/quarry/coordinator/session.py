"""One query's life on the host: plan -> dispatch sub-plans -> complete -> run the super-plan.

Devices run their sub-plans in parallel; whatever a device pushes back (slice ranges, raw or
filtered) the host fetches and completes with the same sub-plan, so the super-plan always sees
exactly the fragment outputs it would have seen had every device executed everything.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from quarry import protocol
from quarry.coordinator.streams import merge
from quarry.device.query import cpu_seconds
from quarry.errors import DeviceUnavailable, PlanNotSupported, QueryError
from quarry.protocol import Exchange, Get
from quarry.store.partition import schema_to_text

if TYPE_CHECKING:
    from quarry.coordinator.catalog import DatasetEntry, PartitionEntry
    from quarry.coordinator.client import DeviceClient
    from quarry.coordinator.cluster import Cluster
    from quarry.plan.decompose import Decomposition, Fragment

PUSHDOWNS = ("never", "always", "auto")
WORKERS_PER_DEVICE = 2
STREAM_BATCHES_MAX = 16  # batches a streaming answer holds for its reader
FETCHERS_PER_EXCHANGE = 2  # concurrent fetches of pushed-back ranges per device stream
FIGURES_CACHE_MAX = 256


@dataclass
class DeviceReport:
    """What one device did for one fragment over one partition (a row of EXPLAIN ANALYZE)."""

    device: str
    fragment: str
    partition: int
    mode: str  # "subplan" (device ran it) or "scan" (raw slices; host ran it)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    bytes_shipped: int = 0  # everything this device sent the host for this fragment
    rows_shipped: int = 0
    fallback: str | None = None
    trace: list[dict[str, Any]] | None = None

    def to_json(self) -> dict[str, Any]:
        m = self.metrics
        traced = {"trace": self.trace} if self.trace is not None else {}
        return {
            **traced,
            "device": self.device,
            "fragment": self.fragment,
            "partition": self.partition,
            "mode": self.mode,
            "fallback": self.fallback,
            "decisions": self.decisions,
            "slices_total": m.get("slices_total", 0),
            "slices_pruned": m.get("slices_pruned", 0),
            "slices_scanned": m.get("slices_scanned", 0),
            "slices_executed": m.get("slices_executed", 0),
            "slices_pushed_back": m.get("slices_pushed_back", 0),
            "rows_read": m.get("rows_read", 0),
            "bytes_read": m.get("bytes_read", 0),
            "rows_shipped": self.rows_shipped,
            "bytes_shipped": self.bytes_shipped,
            "device_cpu_s": m.get("device_cpu_s", 0.0),
            "wall_s": m.get("wall_s", 0.0),
        }


def _batch_bytes(batch: pa.RecordBatch) -> int:
    return pa.ipc.get_record_batch_size(batch)


class Query:
    def __init__(
        self,
        cluster: Cluster,
        sql: str,
        pushdown: str = "always",
        decisions: dict[tuple[str, int], list[dict[str, Any]]] | None = None,
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
        self.trace = trace  # per-chunk device timings in EXPLAIN ANALYZE (experiments)
        self.chunk_slices = chunk_slices
        self.policy = policy  # overrides of the devices' decision thresholds
        self.reports: list[DeviceReport] = []
        self.query_id = uuid.uuid4().hex
        self._lock = threading.Lock()
        self.decomposition = self._plan()
        self.choices: dict[str, Any] = {}
        self.host_costs: dict[tuple[str, str], dict[str, Any]] = {}
        if pushdown == "auto":
            self._choose_cuts()
        self.started = 0.0
        self.finished = 0.0
        self.host_cpu_s = 0.0
        self.rows = 0

    def _plan(self) -> Decomposition:
        from quarry.plan.decompose import decompose
        from quarry.plan.errors import PlanError

        self.cluster.refresh()
        tables = {name: entry.schema for name, entry in self.cluster.catalog.items()}
        mode = "always" if self.pushdown == "auto" else self.pushdown
        try:
            return decompose(self.sql, tables, pushdown=mode, capabilities=self._capabilities())
        except PlanError as error:
            raise QueryError(str(error)) from None

    def _capabilities(self) -> dict[str, Any]:
        """What every device holding a dataset can evaluate (the intersection of profiles)."""
        from quarry.plan.capabilities import Capabilities

        def of(device: str) -> Capabilities:
            kind = self.cluster.info.get(device, {}).get("profile", {}).get("capabilities", "full")
            if kind == "kernels":  # an FPGA running built-in kernels evaluates no SQL
                return Capabilities(
                    "kernels", frozenset(), project_expressions=False, aggregate=False, limit=False
                )
            return Capabilities.named(kind)

        result: dict[str, Any] = {}
        for name, entry in self.cluster.catalog.items():
            devices = sorted({d for p in entry.partitions for d in p.devices})
            if not devices:
                continue
            combined = of(devices[0])
            for device in devices[1:]:
                combined = combined.intersect(of(device))
            if not combined.is_full:
                result[name] = combined
        return result

    def _choose_cuts(self) -> None:
        """pushdown="auto": the cost model picks each fragment's cut; devices start from it."""
        from quarry.coordinator.figures import device_figures, host_cores, sample_subplan
        from quarry.cost.model import choose, device_full_s_per_byte, host_share

        cores = host_cores()
        for fragment in self.decomposition.fragments:
            entry = self.cluster.entry(fragment.dataset)
            if entry.unavailable or entry.rows == 0:
                continue
            stored: dict[str, int] = {}
            for p in entry.partitions:
                device = self._device_for(entry, p).name
                stored[device] = stored.get(device, 0) + p.bytes_stored
            # Sampling costs a slice fetch and two local runs; a repeated query on unchanged
            # data reuses what it learnt (like a plan cache), so auto stays cheap.
            key = (fragment.stages["full"], entry.version)
            figures = self.cluster.figures_cache.get(key)
            if figures is None:
                figures = sample_subplan(self.cluster, fragment, entry)
                if len(self.cluster.figures_cache) >= FIGURES_CACHE_MAX:
                    self.cluster.figures_cache.clear()
                self.cluster.figures_cache[key] = figures
            devices = device_figures(self.cluster, entry, stored)
            # A fragment that only filters has identical filter and full stages: the filter
            # cut would cost an extra fetch for the same work.
            identical = fragment.stages["filter"] == fragment.stages["full"]
            allowed = ("full", "raw") if identical else ("full", "filter", "raw")
            choice = choose(devices, figures, cores, allowed)
            self.choices[fragment.name] = choice.to_json()
            share = host_share(cores, len(devices))
            for d in devices:
                self.host_costs[(fragment.name, d.name)] = {
                    "full_s_per_byte": figures.full_s_per_byte,
                    "filter_s_per_byte": figures.filter_s_per_byte,
                    "device_full_s_per_byte": device_full_s_per_byte(d, figures),
                    "raw_ratio": figures.raw_ratio,
                    "filter_ratio": figures.filter_ratio,
                    "link_bytes_per_s": d.link_bytes_per_s,
                    "host_share": share,
                    "start": choice.cut,
                }

    # ---- execution ------------------------------------------------------------------------------

    def execute(self) -> pa.RecordBatchReader:
        from quarry.plan.passthrough import passthrough_fragment
        from quarry.plan.superplan import run_super

        self.started = time.perf_counter()
        cpu_started = cpu_seconds()
        # A pass-through answer streams, so its fragment's producers wait for the reader; any
        # other super-plan may read one fragment whole before the next.
        streaming = passthrough_fragment(self.decomposition) is not None
        outputs = {
            f.name: self._fragment_output(f, STREAM_BATCHES_MAX if streaming else 0)
            for f in self.decomposition.fragments
        }
        result = run_super(self.decomposition, outputs)

        def stream() -> Iterator[pa.RecordBatch]:
            for batch in result:
                self.rows += batch.num_rows
                yield batch
            self.finished = time.perf_counter()
            self.host_cpu_s = cpu_seconds() - cpu_started

        return pa.RecordBatchReader.from_batches(result.schema, stream())

    def _fragment_output(
        self, fragment: Fragment, queue_batches_max: int
    ) -> Iterator[pa.RecordBatch]:
        entry = self.cluster.entry(fragment.dataset)
        if entry.unavailable:
            from quarry.coordinator.cluster import _unavailable_message

            raise DeviceUnavailable(_unavailable_message(entry))
        partitions = [p for p in entry.partitions if p.rows]  # an empty partition has no slices
        return merge(
            [(lambda p=p: self._run_partition(fragment, entry, p)) for p in partitions],
            workers=max(1, WORKERS_PER_DEVICE * len(self.cluster.live_devices())),
            queue_items_max=queue_batches_max,
            name=f"quarry-{fragment.name}",
        )

    def _device_for(self, entry: DatasetEntry, p: PartitionEntry) -> DeviceClient:
        for name in p.devices:
            if name not in self.cluster.down:
                return self.cluster.devices[name]
        raise DeviceUnavailable(
            f"no replica of partition {p.partition} of {entry.qualified} answers "
            f"(held by {', '.join(p.devices)})"
        )

    def _run_partition(
        self, fragment: Fragment, entry: DatasetEntry, p: PartitionEntry
    ) -> Iterator[pa.RecordBatch]:
        from quarry.plan.superplan import complete

        client = self._device_for(entry, p)
        report = DeviceReport(
            client.name,
            fragment.name,
            p.partition,
            "scan" if self.pushdown == "never" else "subplan",
        )
        with self._lock:
            self.reports.append(report)
        if self.pushdown == "never":
            yield from complete(fragment, self._scan_raw(client, entry, p, report))
            return
        try:
            yield from self._exchange(client, fragment, entry, p, report)
        except PlanNotSupported as error:
            if report.rows_shipped:
                raise
            report.mode = "scan"
            report.fallback = f"{error}; the host ran this sub-plan over raw slices"
            yield from complete(fragment, self._scan_raw(client, entry, p, report))

    def _scan_raw(
        self, client: DeviceClient, entry: DatasetEntry, p: PartitionEntry, report: DeviceReport
    ) -> Iterator[pa.RecordBatch]:
        reader = client.scan(entry.domain, entry.name, p.partition)
        while True:
            chunk = client.guard(lambda: _next(reader))
            if chunk is None:
                return
            report.bytes_shipped += _batch_bytes(chunk.data)
            report.rows_shipped += chunk.data.num_rows
            report.metrics["slices_scanned"] = report.metrics.get("slices_scanned", 0) + 1
            report.metrics["rows_read"] = report.metrics.get("rows_read", 0) + chunk.data.num_rows
            yield chunk.data

    def _exchange(
        self,
        client: DeviceClient,
        fragment: Fragment,
        entry: DatasetEntry,
        p: PartitionEntry,
        report: DeviceReport,
    ) -> Iterator[pa.RecordBatch]:
        from quarry.plan.superplan import complete

        stage_names = ["raw", "filter", "full"]
        stages, output_schema, scan_engine = self.device_stages(fragment)
        payload = b"".join(stages[s] for s in stage_names)
        header = {
            "domain": entry.domain,
            "dataset": entry.name,
            "partition": p.partition,
            "stage_bytes": {s: len(stages[s]) for s in stage_names},
            "output_schema": schema_to_text(output_schema),
            "raw_schema": schema_to_text(fragment.raw_schema),
            "predicates": fragment.predicates,
            "decisions": self.forced.get((fragment.dataset, p.partition)),
            "host": self.host_costs.get((fragment.name, client.name)),
            "query_id": f"{self.query_id}/{fragment.name}",
            "trace": self.trace,
            "policy": self.policy,
        }
        if self.chunk_slices:
            header["chunk_slices"] = self.chunk_slices
        writer, reader = client.exchange(Exchange.QUERY, header, payload)
        pushed: list[dict[str, Any]] = []
        filtered: list[pa.RecordBatch] = []
        # Pushed-back ranges are fetched and completed while the device goes on deciding, so
        # its probes and its work never hold up the raw rows it already declined.
        fetchers = ThreadPoolExecutor(FETCHERS_PER_EXCHANGE, thread_name_prefix="quarry-fetch")
        fetches = []

        def fetch(notice: dict[str, Any]) -> tuple[list[pa.RecordBatch], int, int]:
            shipped = {"bytes": 0, "rows": 0}
            batches = self._fetch_pushed(client, fragment, entry, p, notice, shipped)
            return list(complete(fragment, batches)), shipped["bytes"], shipped["rows"]

        try:
            while True:
                chunk = client.guard(lambda: _next(reader))
                if chunk is None:
                    break
                if chunk.data is not None and chunk.data.num_rows:
                    report.bytes_shipped += _batch_bytes(chunk.data)
                    report.rows_shipped += chunk.data.num_rows
                    if scan_engine:
                        filtered.append(chunk.data)
                    else:
                        yield chunk.data
                if chunk.app_metadata is not None:
                    message = protocol.decode_json(chunk.app_metadata.to_pybytes())
                    if "pushed_back" in message:
                        pushed.append(message["pushed_back"])
                        fetches.append(fetchers.submit(fetch, message["pushed_back"]))
                    if "annotation" in message:
                        report.decisions = message["annotation"]
                        report.metrics = message["metrics"]
                        report.trace = message.get("trace")
        except BaseException:  # a device that failed mid-stream leaves no fetch running
            fetchers.shutdown(wait=False, cancel_futures=True)
            raise
        fetchers.shutdown(wait=False)
        client.guard(writer.close)
        if filtered:
            yield from complete(fragment, filtered)
        for notice, future in zip(pushed, fetches, strict=True):
            batches, shipped_bytes, shipped_rows = future.result()
            report.bytes_shipped += shipped_bytes
            report.rows_shipped += shipped_rows
            m = report.metrics
            m["rows_read"] = m.get("rows_read", 0) + notice.get("rows", 0)
            m["bytes_read"] = m.get("bytes_read", 0) + notice.get("bytes_stored", 0)
            m["slices_scanned"] = m.get("slices_scanned", 0) + sum(
                b - a for a, b in notice["slices"]
            )
            yield from batches

    def device_stages(self, fragment: Fragment) -> tuple[dict[str, bytes], pa.Schema, bool]:
        """The stages a device gets, the schema of its stream, and whether it only filters."""
        stages = dict(fragment.stages)
        if "full" in fragment.device_stages:
            return stages, fragment.output_schema, False
        # A device that can only filter streams the filter stage; the host completes it.
        stages["full"] = stages["filter"]
        return stages, fragment.raw_schema, True

    def _fetch_pushed(
        self,
        client: DeviceClient,
        fragment: Fragment,
        entry: DatasetEntry,
        p: PartitionEntry,
        notice: dict[str, Any],
        shipped: dict[str, int],
    ) -> Iterator[pa.RecordBatch]:

        stage = notice["stage"]
        payload = fragment.stages["filter"] if stage == "filter" else b""
        reader = client.get(
            Get.SLICES,
            {
                "domain": entry.domain,
                "dataset": entry.name,
                "partition": p.partition,
                "slices": notice["slices"],
                "schema": schema_to_text(fragment.raw_schema),
                "query_id": f"{self.query_id}/{fragment.name}",
            },
            payload,
        )
        while True:
            chunk = client.guard(lambda: _next(reader))
            if chunk is None:
                return
            shipped["bytes"] += _batch_bytes(chunk.data)
            shipped["rows"] += chunk.data.num_rows
            yield chunk.data

    # ---- explain ---------------------------------------------------------------------------------

    def explain(self, analyze: bool) -> dict[str, Any]:
        body = {"query": self.sql, "pushdown": self.pushdown, **self.decomposition.to_json()}
        body["plan"] = self.decomposition.explain()
        if self.choices:
            body["cost_model"] = self.choices
        if analyze:
            reports = sorted(self.reports, key=lambda r: (r.fragment, r.partition))
            devices = [r.to_json() for r in reports]
            per_device: dict[str, dict[str, Any]] = {}
            for row in devices:
                agg = per_device.setdefault(
                    row["device"],
                    {
                        "device": row["device"],
                        "partitions": 0,
                        "slices_pruned": 0,
                        "slices_scanned": 0,
                        "slices_executed": 0,
                        "slices_pushed_back": 0,
                        "rows_read": 0,
                        "bytes_read": 0,
                        "rows_shipped": 0,
                        "bytes_shipped": 0,
                        "device_cpu_s": 0.0,
                        "fallbacks": [],
                    },
                )
                agg["partitions"] += 1
                for key in (
                    "slices_pruned",
                    "slices_scanned",
                    "slices_executed",
                    "slices_pushed_back",
                    "rows_read",
                    "bytes_read",
                    "rows_shipped",
                    "bytes_shipped",
                    "device_cpu_s",
                ):
                    agg[key] += row[key]
                if row["fallback"]:
                    agg["fallbacks"].append(row["fallback"])
            body["analyze"] = {
                "devices": [per_device[name] for name in sorted(per_device)],
                "partitions": devices,
                "bytes_shipped": sum(r["bytes_shipped"] for r in devices),
                "bytes_read": sum(r["bytes_read"] for r in devices),
                "host_cpu_s": self.host_cpu_s,
                "wall_s": self.finished - self.started,
                "rows": self.rows,
            }
        return body


def _next(reader: Any) -> Any:
    try:
        return reader.read_chunk()
    except StopIteration:
        return None
