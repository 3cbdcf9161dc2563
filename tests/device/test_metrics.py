"""A device's Prometheus endpoint: what a scrape shows, named by Prometheus's conventions, and
its work counters moved by exactly what EXPLAIN ANALYZE reports of the device."""

from __future__ import annotations

import json
import re
import socket
import ssl
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import quarry
from quarry.coordinator.processes import spawn
from quarry.device.metrics import WORK_METRICS, work_metric
from quarry.protocol.counters import COUNTERS, PUSHED_BACK_BY
from quarry.samples import particles

# the base unit a quarry metric's name ends with (before _total, _bucket, ...)
UNITS = ("bytes", "seconds", "slices", "rows", "exchanges", "partitions", "keys", "copies")
UNITS += ("streams", "plans")
OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def test_work_counters_are_named_unit_last_from_their_one_declaration():
    assert work_metric("bytes_read") == "quarry_work_read_bytes"
    assert work_metric("slices_pushed_back") == "quarry_work_pushed_back_slices"
    assert work_metric("slices_total") == "quarry_work_slices"
    assert work_metric("device_cpu_s") == "quarry_work_device_cpu_seconds"
    # every counter but those per push-back reason, which are one family labeled by reason
    assert sorted([*WORK_METRICS, *PUSHED_BACK_BY.values()]) == sorted(COUNTERS)


def scrape(port: int, tls: ssl.SSLContext | None = None) -> dict[str, float]:
    """Every sample of the endpoint, by name (and labels, where it has any)."""
    url = f"{'https' if tls else 'http'}://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=10, context=tls) as answer:
        text = answer.read().decode()
    samples = {}
    documented = OPERATIONS.read_text()
    for family in text_string_to_metric_families(text):
        assert family.name.startswith("quarry_"), family.name
        shown = f"{family.name}_total" if family.type == "counter" else family.name
        assert f"`{shown}`" in documented, f"{shown}: not in docs/operations.md"
        assert family.name.split("_")[-1] in UNITS, family.name
        if family.type == "counter":
            assert all(s.name.endswith("_total") for s in family.samples), family.name
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


@pytest.fixture(scope="module")
def watched(tmp_path_factory):
    """Two devices serving metrics on ports of their choosing ($QUARRY_METRICS_PORT=0)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("QUARRY_METRICS_PORT", "0")
        with quarry.local(devices=2) as cluster:
            patch.delenv("QUARRY_METRICS_PORT")
            ports = {
                spec.name: json.loads((Path(spec.data) / "ready.json").read_text())["metrics_port"]
                for spec in cluster.specs
            }
            cluster.ingest(particles.table(40_000, seed=5), "watch/particles", partitions=4)
            yield cluster, ports


@pytest.mark.slow
def test_a_scrape_names_only_quarry_metrics_with_their_units(watched):
    cluster, ports = watched
    assert sorted(ports) == ["dev0", "dev1"] and all(ports.values())
    shown = scrape(ports["dev0"])
    for name in WORK_METRICS.values():
        assert f"{name}_total" in shown, name
    assert shown["quarry_store_partitions"] >= 1
    assert shown["quarry_store_size_bytes"] > 0 and shown["quarry_filesystem_free_bytes"] > 0
    assert shown["quarry_work_limit_exchanges"] >= 1
    assert any(re.match(r"quarry_request_duration_seconds_count\{call=", s) for s in shown)


@pytest.mark.slow
def test_a_query_moves_the_byte_counters_by_what_explain_analyze_reports(watched):
    cluster, ports = watched
    before = {name: scrape(port) for name, port in ports.items()}
    planned = cluster.query("SELECT count(*) FROM particles WHERE ke > 3", pushdown="always")
    assert planned.execute().read_all().num_rows == 1
    analyzed = planned.explain(analyze=True).analyze
    assert analyzed is not None
    rows = {row.device: row.counters for row in analyzed.devices}
    assert sorted(rows) == sorted(ports)
    for name, port in ports.items():
        after = scrape(port)
        for counter in ("bytes_read", "bytes_shipped", "slices_executed", "rows_read"):
            metric = f"{WORK_METRICS[counter]}_total"
            moved = after[metric] - before[name][metric]
            assert moved == getattr(rows[name], counter) > 0, (name, counter)
        link = "quarry_drive_read_bytes_total"  # every byte read, this query's among them
        assert after[link] > before[name][link]


@pytest.mark.slow
def test_a_storage_server_and_its_drives_serve_metrics_under_tls(tmp_path, monkeypatch):
    """Under TLS the endpoint is HTTPS with the server's certificate: plain HTTP gets nothing."""
    monkeypatch.setenv("QUARRY_METRICS_PORT", "0")
    with quarry.local(servers=1, drives_per_server=2, tls=True) as cluster:
        monkeypatch.delenv("QUARRY_METRICS_PORT")
        [server] = cluster.specs
        assert server.ca_file is not None and len(server.drives) == 2
        trusted = ssl.create_default_context(cafile=server.ca_file)
        cluster.ingest(particles.table(20_000, seed=6), "watch/tls", partitions=2)
        planned = cluster.query("SELECT count(*) FROM tls WHERE ke > 3", pushdown="server")
        assert planned.execute().read_all().num_rows == 1
        for spec in (server, *server.drives):
            port = json.loads((Path(spec.data) / "ready.json").read_text())["metrics_port"]
            shown = scrape(port, trusted)
            assert shown["quarry_request_duration_seconds_count{call=work}"] >= 1, spec.name
            with pytest.raises(OSError):
                scrape(port)


def test_quarry_up_gives_each_server_the_next_free_metrics_port(monkeypatch):
    """From $QUARRY_METRICS_PORT on, one port each, never one that another process holds."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        monkeypatch.setenv("QUARRY_METRICS_PORT", str(taken))
        monkeypatch.setattr(spawn, "_metrics_ports_given", set())
        first, second = spawn.metrics_port(), spawn.metrics_port()
    assert taken < first < second
    monkeypatch.delenv("QUARRY_METRICS_PORT")
    assert spawn.metrics_port() is None  # unset: no metrics
