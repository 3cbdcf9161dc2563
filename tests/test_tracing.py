"""Traces: one per query, whole across the host and every device it ran on; exported to a file
of JSON lines, or over OTLP where it is configured; and nothing at all where it is not."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import quarry
from quarry import settings, tracing
from quarry.samples import particles

SPANS_WAIT_S = 20.0  # devices export every half second; a loaded machine takes longer


def spans_of(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def chain(span: dict, by_id: dict[str, dict]) -> list[str]:
    """The names from a span up through its parents, as far as the exported spans go."""
    names = [span["name"]]
    while span["parent_id"] is not None and span["parent_id"] in by_id:
        span = by_id[span["parent_id"]]
        names.append(span["name"])
    return names


@pytest.mark.slow
def test_a_query_is_one_trace_with_every_device_s_stages_under_its_root(tmp_path, monkeypatch):
    """Three devices, one of which filters a range and hands it back: every device's stage
    spans, the range it pushed back and the host's completion of it all hang from the query's
    root span."""
    trace_file = tmp_path / "spans.jsonl"
    monkeypatch.setenv(settings.TRACE_FILE.name, str(trace_file))
    with quarry.local(devices=3) as cluster:
        cluster.ingest(particles.table(30_000, seed=11), "trace/particles", partitions=3)
        back = {("trace/particles", 0): [{"first": 0, "end": 1, "stage": "filter"}]}
        planned = cluster.query(
            "SELECT count(*) FROM particles WHERE ke > 2", pushdown="always", decisions=back
        )
        assert planned.execute().read_all().num_rows == 1
        devices = sorted(cluster.devices)
        tracing.flush()
        deadline = time.monotonic() + SPANS_WAIT_S
        while True:  # the devices export on their own clocks
            spans = spans_of(trace_file)
            stages = [s for s in spans if s["name"] == "stage"]
            if {s["attributes"]["quarry.process"] for s in stages} >= set(devices):
                break
            assert time.monotonic() < deadline, sorted({s["name"] for s in spans})
            time.sleep(0.2)
    [root] = [s for s in spans if s["name"] == "query"]
    assert root["attributes"]["quarry.query_id"] == planned.query_id
    assert root["parent_id"] is None and root["resource"]["attributes"]["service.name"] == (
        "quarry-host"
    )
    trace_id = root["context"]["trace_id"]
    mine = [s for s in spans if s["context"]["trace_id"] == trace_id]
    by_id = {s["context"]["span_id"]: s for s in mine}
    services = {s["resource"]["attributes"]["service.instance.id"] for s in mine}
    assert set(devices) <= services  # every device exported spans of this trace
    for device in devices:
        own = [s for s in mine if s["name"] == "stage"]
        own = [s for s in own if s["attributes"]["quarry.process"] == device]
        assert own, f"{device}: no stage span in the query's trace"
        for stage in own:
            assert chain(stage, by_id) == ["stage", "work", "fragment", "query"]
            assert stage["resource"]["attributes"]["service.instance.id"] == device
    [pushed] = [s for s in mine if s["name"] == "push_back"]
    assert pushed["attributes"]["quarry.slices"] == 1
    assert chain(pushed, by_id)[-1] == "query"
    [completed] = [s for s in mine if s["name"] == "complete"]
    assert chain(completed, by_id) == ["complete", "fragment", "query"]
    [fetched] = [s for s in mine if s["name"] == "fetch"]  # the device's side of it
    assert chain(fetched, by_id) == ["fetch", "complete", "fragment", "query"]
    assert [s["name"] for s in mine if s["parent_id"] is None] == ["query"]


@pytest.mark.slow
def test_a_drive_s_stages_hang_from_its_storage_server_s_forward(tmp_path, monkeypatch):
    """Behind a storage server the trace goes one level deeper: each drive's stage sits under
    the drive's work, under the server's forward of it, under the server's work, the host's
    fragment and the query, and each span names the process that made it."""
    trace_file = tmp_path / "spans.jsonl"
    monkeypatch.setenv(settings.TRACE_FILE.name, str(trace_file))
    with quarry.local(servers=1, drives_per_server=2) as cluster:
        cluster.ingest(particles.table(20_000, seed=3), "trace/served", partitions=2)
        [server] = cluster.specs
        drives = sorted(drive.name for drive in server.drives)
        planned = cluster.query("SELECT count(*) FROM served WHERE ke > 2", pushdown="always")
        assert planned.execute().read_all().num_rows == 1
        tracing.flush()
        deadline = time.monotonic() + SPANS_WAIT_S
        while True:
            stages = [s for s in spans_of(trace_file) if s["name"] == "stage"]
            if len(stages) >= 2:
                break
            assert time.monotonic() < deadline, "the drives exported no stage span"
            time.sleep(0.2)
    spans = spans_of(trace_file)
    by_id = {s["context"]["span_id"]: s for s in spans}

    def process(span: dict) -> str:
        return span["resource"]["attributes"]["service.instance.id"]

    for stage in stages:
        names = chain(stage, by_id)
        assert names == ["stage", "work", "forward", "work", "fragment", "query"], names
        ancestors = [stage]
        while ancestors[-1]["parent_id"] in by_id:
            ancestors.append(by_id[ancestors[-1]["parent_id"]])
        owners = [process(span) for span in ancestors]
        assert owners[0] == owners[1] and owners[0] in drives
        assert owners[2] == owners[3] == server.name
    assert {process(s) for s in stages} == set(drives)


def test_tracing_off_opens_no_span_sends_no_header_and_adds_no_middleware(monkeypatch):
    for name in (settings.TRACE_FILE.name, *tracing.OTLP_ENDPOINTS):
        monkeypatch.delenv(name, raising=False)
    assert tracing.configured() is None
    span = tracing.query("query", sql="SELECT 1")
    assert span is tracing.NO_SPAN and span.child("plan") is tracing.NO_SPAN
    assert span.headers() == [] and tracing.server_middleware() == {}
    items = [1, 2]
    assert span.around(items) is items
    env = {k: v for k, v in os.environ.items() if k not in (settings.TRACE_FILE.name, *OTLP)}
    imported = subprocess.run(  # a process that does not trace never imports opentelemetry
        [sys.executable, "-c", OFF_IMPORTS],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert imported.stdout.split() == ["False"], imported.stdout + imported.stderr


OTLP = tracing.OTLP_ENDPOINTS
OFF_IMPORTS = """
import sys
from quarry import tracing
tracing.query("query").child("plan").end()
print(any(name.startswith("opentelemetry") for name in sys.modules))
"""


def test_only_the_tracing_module_imports_opentelemetry_and_only_once_it_traces():
    """Every other module reaches OpenTelemetry through ``quarry.tracing``, whose imports of
    it are inside the functions that run only when tracing is on."""
    source = Path(tracing.__file__).parent
    for path in source.rglob("*.py"):
        text = path.read_text()
        if "opentelemetry" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            if any(name.startswith("opentelemetry") for name in names):
                assert path == Path(tracing.__file__), f"{path}:{node.lineno}"
                assert node.col_offset > 0, f"{path}:{node.lineno}: imported at the top"


class _Collector(BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver that keeps what it is sent."""

    received: list[tuple[str, str, bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((self.path, self.headers["Content-Type"], body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_spans_go_to_the_otlp_endpoint_when_one_is_configured(monkeypatch):
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.delenv(settings.TRACE_FILE.name, raising=False)
        monkeypatch.setenv(tracing.OTLP_ENDPOINTS[0], f"http://127.0.0.1:{server.server_port}")
        with tracing.query("query", sql="SELECT 1") as root:
            root.child("plan").end()
        tracing.flush()
    finally:
        server.shutdown()
        server.server_close()
    [(path, kind, body)] = _Collector.received
    assert path == "/v1/traces" and kind == "application/x-protobuf"
    sent = ExportTraceServiceRequest.FromString(body)
    names = {s.name for r in sent.resource_spans for ss in r.scope_spans for s in ss.spans}
    assert names == {"query", "plan"}


def test_a_device_traces_only_a_well_formed_sampled_traceparent():
    """A broken header, or a caller that does not sample, leaves the call untraced (answered)."""
    good = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    parent = tracing._parent(good)
    assert parent is not None and parent.is_remote
    assert f"{parent.trace_id:032x}" == good.split("-")[1]
    unsampled = good[:-2] + "00"
    for header in ("", "garbage", good.replace("0af7", "zzzz"), "ff" + good[2:], unsampled):
        assert tracing._parent(header) is None, header


def test_spans_past_the_file_writer_s_queue_are_dropped_and_counted(tmp_path, monkeypatch):
    """A process ending spans faster than its file is written keeps the newest
    ``SPANS_WAITING_MAX`` and counts the rest: the query never waits for its trace."""
    trace_file = tmp_path / "spans.jsonl"
    monkeypatch.setattr(tracing, "SPANS_WAITING_MAX", 8)
    monkeypatch.setattr(tracing, "FILE_EXPORT_DELAY_MS", 60_000)  # only the flush below writes
    monkeypatch.setenv(settings.TRACE_FILE.name, str(trace_file))
    for number in range(20):
        tracing.query("query", number=number).end()
    sink = tracing._sink()
    assert sink is not None and sink.file is not None
    tracing.flush()
    assert [s["attributes"]["quarry.number"] for s in spans_of(trace_file)] == list(range(12, 20))
    assert sink.file.dropped == 12
    sink.shutdown()


def test_a_forked_child_writes_none_of_its_parent_s_waiting_spans(tmp_path, monkeypatch):
    trace_file = tmp_path / "spans.jsonl"
    monkeypatch.setattr(tracing, "FILE_EXPORT_DELAY_MS", 60_000)
    monkeypatch.setenv(settings.TRACE_FILE.name, str(trace_file))
    tracing.query("query", number=1).end()
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # the child writes its own span, and only that
        os.close(reader)
        tracing.query("query", number=2).end()
        tracing.flush()
        os.write(writer, b"done")
        os._exit(0)
    os.close(writer)
    assert os.read(reader, 4) == b"done"
    os.waitpid(child, 0)
    os.close(reader)
    assert [s["attributes"]["quarry.number"] for s in spans_of(trace_file)] == [2]
    tracing.flush()
    assert sorted(s["attributes"]["quarry.number"] for s in spans_of(trace_file)) == [1, 2]
    sink = tracing._sink()
    assert sink is not None
    sink.shutdown()
