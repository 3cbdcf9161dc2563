"""A real Prometheus (Debian's package; ``make prometheus`` installs it, CI does so first)
scrapes a local cluster, and its HTTP API says a query moved each device's bytes-read counter
by exactly what EXPLAIN ANALYZE reports of that device."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

import quarry
from quarry import settings
from quarry.samples import particles

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus is not on the PATH: `make prometheus` installs it"
)
SCRAPE_INTERVAL_S = 1
WAIT_S = 45.0  # for Prometheus to start, and to scrape what the query moved
COUNTER = "quarry_work_read_bytes_total"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def ask(port: int, promql: str) -> dict[str, float]:
    """An instant query through Prometheus's HTTP API: each series' value, by instance."""
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as answer:
        body = json.loads(answer.read())
    assert body["status"] == "success", body
    return {r["metric"].get("instance", ""): float(r["value"][1]) for r in body["data"]["result"]}


def waited(port: int, promql: str, done) -> dict[str, float]:
    """The query's answer once ``done`` says it is the one awaited (Prometheus scrapes on its
    own clock); bounded by ``WAIT_S``."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            answer = ask(port, promql)
        except OSError:  # not listening yet
            answer = {}
        if done(answer):
            return answer
        assert time.monotonic() < deadline, f"{promql}: {answer}"
        time.sleep(0.2)


def scrape(port: int) -> float:
    """The device's own scrape of the counter."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith(COUNTER + " "):
                return float(line.split()[1])
    raise AssertionError(f"{COUNTER} not served on {port}")


def prometheus(folder: Path, targets: list[str], port: int) -> subprocess.Popen:
    config = {
        "global": {"scrape_interval": f"{SCRAPE_INTERVAL_S}s", "scrape_timeout": "1s"},
        "scrape_configs": [{"job_name": "quarry", "static_configs": [{"targets": targets}]}],
    }
    (folder / "prometheus.yml").write_text(json.dumps(config))  # YAML reads JSON
    command = [
        str(PROMETHEUS),
        f"--config.file={folder / 'prometheus.yml'}",
        f"--storage.tsdb.path={folder / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    log = (folder / "prometheus.log").open("w")
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)


@pytest.mark.slow
def test_prometheus_scrapes_the_bytes_a_query_read_as_explain_analyze_reports(monkeypatch):
    folder = Path(tempfile.mkdtemp(prefix="quarry-prometheus-"))
    server = None
    try:
        monkeypatch.setenv(settings.METRICS_PORT.name, "0")
        with quarry.local(devices=2) as cluster:
            monkeypatch.delenv(settings.METRICS_PORT.name)
            ports = {
                spec.name: json.loads((Path(spec.data) / "ready.json").read_text())["metrics_port"]
                for spec in cluster.specs
            }
            instances = {name: f"127.0.0.1:{port}" for name, port in ports.items()}
            cluster.ingest(particles.table(40_000, seed=8), "scraped/particles", partitions=4)
            api = free_port()
            server = prometheus(folder, sorted(instances.values()), api)
            up = waited(api, "up", lambda a: a and set(a) == set(instances.values()))
            assert all(value == 1 for value in up.values()), up
            before = {name: scrape(port) for name, port in ports.items()}
            seen = waited(
                api,
                COUNTER,
                lambda a: all(a.get(instances[n]) == before[n] for n in instances),
            )
            planned = cluster.query("SELECT sum(ke) FROM particles WHERE ke > 3", "always")
            assert planned.execute().read_all().num_rows == 1
            analyzed = planned.explain(analyze=True).analyze
            assert analyzed is not None
            read = {row.device: row.counters.bytes_read for row in analyzed.devices}
            assert sorted(read) == sorted(ports) and all(read.values())
            after = {name: scrape(port) for name, port in ports.items()}
            assert {n: after[n] - before[n] for n in ports} == read
            scraped = waited(
                api,
                COUNTER,
                lambda a: all(a.get(instances[n]) == after[n] for n in instances),
            )
            moved = {n: scraped[instances[n]] - seen[instances[n]] for n in instances}
            assert moved == read
            total = waited(api, f"sum({COUNTER})", lambda a: bool(a))  # PromQL over both
            assert list(total.values()) == [sum(after.values())]
    finally:
        if server is not None:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)
