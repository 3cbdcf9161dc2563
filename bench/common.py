"""Shared by the benchmarks: where results go, what machine made them, how progress shows."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from quarry import machine
from quarry.device import column_cache
from quarry.device.profile import BUILTIN

RESULTS = Path(__file__).resolve().parent / "results"


def environment() -> dict[str, Any]:
    import datafusion
    import duckdb
    import pyarrow

    return {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "pyarrow": pyarrow.__version__,
        "datafusion": datafusion.__version__,
        "duckdb": duckdb.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        # each host-profile device's column cache (0: none; warm runs read decoded columns
        # from it), and the machine's memory it is sized from when the setting is unset
        "device_cache_mib": BUILTIN["host"].cache_bytes(column_cache.setting_bytes()) >> 20,
        "machine_memory_mib": machine.memory_bytes() >> 20,
    }


def write_json(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(
        json.dumps(
            {"benchmark": name, "environment": environment(), **payload}, indent=2, default=str
        )
    )
    return path


def png_path(name: str) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    return RESULTS / f"{name}.png"


def progress(console: Any) -> Any:
    """A bar per long step, with a count and the time taken (rich)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )


def median_time(repeat: int, run: Any) -> tuple[float, Any]:
    """The median seconds of ``repeat`` runs after one warm-up run (caches, plans, the page
    cache), and the last run's result."""
    import statistics

    run()
    times, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


# ---- metrics and tracing on and off, side by side in one run (``--telemetry``) ----------------

ARMS = ("off", "on")
SCRAPE_PERIOD_S = 15.0  # the "on" devices are scraped this often: Prometheus's default


class Telemetry:
    """Two clusters alike but for telemetry, up at once, so that one run compares them query by
    query: ``off`` serves no metrics and traces nothing; ``on`` has every device serve
    Prometheus metrics (scraped every ``SCRAPE_PERIOD_S`` by a thread here, as a Prometheus
    would) and traces every query, host and devices, to a trace file. ``turn(arm)`` is the
    host's side: its queries are traced in the ``on`` turns only."""

    def __init__(
        self, clusters: dict[str, Any], spans: Path, ports: list[int], pids: dict[str, list[int]]
    ):
        self.clusters = clusters
        self.spans = spans
        self.ports = ports
        self.pids = pids  # each arm's device processes
        self.cpu_s = self.no_cpu()
        self.scrapes = 0
        self._stop = threading.Event()
        self._scraper = threading.Thread(target=self._scrape, name="bench-scraper", daemon=True)
        self._scraper.start()

    def _scrape(self) -> None:
        import urllib.request

        while not self._stop.wait(SCRAPE_PERIOD_S):
            for port in self.ports:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    r.read()
                self.scrapes += 1

    def stop(self) -> None:
        self._stop.set()
        self._scraper.join()

    @contextlib.contextmanager
    def turn(self, arm: str) -> Iterator[Any]:
        """The ``arm``'s cluster, with this process tracing its queries if the arm is on."""
        from quarry import settings

        name = settings.TRACE_FILE.name
        if arm == "on":
            os.environ[name] = str(self.spans)
        host, devices = host_cpu_s(), processes_cpu_s(self.pids[arm])
        try:
            yield self.clusters[arm]
        finally:
            os.environ.pop(name, None)
            self.cpu_s[arm]["host"] += host_cpu_s() - host
            self.cpu_s[arm]["devices"] += processes_cpu_s(self.pids[arm]) - devices

    @staticmethod
    def no_cpu() -> dict[str, dict[str, float]]:
        """CPU seconds spent in each arm's turns, by this process and by the arm's devices (less
        noisy than the queries' times on a busy machine: another process's work is not in it)."""
        return {arm: {"host": 0.0, "devices": 0.0} for arm in ARMS}

    def figures(self) -> dict[str, Any]:
        """What the ``on`` arm recorded: the proof that it was on."""
        from quarry import tracing

        tracing.flush()
        lines = self.spans.read_text().splitlines() if self.spans.exists() else []
        return {
            "scrape_period_s": SCRAPE_PERIOD_S,
            "scrapes": self.scrapes,
            "spans_written": len(lines),
            "devices_serving_metrics": len(self.ports),
        }


def host_cpu_s() -> float:
    """CPU seconds this process has used (every thread)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def processes_cpu_s(pids: list[int]) -> float:
    """CPU seconds the processes ``pids`` have used (user and system, from /proc)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / ticks


@contextlib.contextmanager
def telemetry_clusters(devices: int, **options: Any) -> Iterator[Telemetry]:
    """``Telemetry``'s two clusters of ``devices`` each (``quarry.local``'s ``options``)."""
    import quarry
    from quarry import settings

    names = (settings.METRICS_PORT.name, settings.TRACE_FILE.name)
    assert not any(os.environ.get(name) for name in names), f"unset {names} to compare"
    with tempfile.TemporaryDirectory() as folder, contextlib.ExitStack() as stack:
        spans = Path(folder) / "spans.jsonl"
        off = stack.enter_context(quarry.local(devices=devices, **options))
        os.environ.update({names[0]: "0", names[1]: str(spans)})  # for the devices it starts
        try:
            on = stack.enter_context(quarry.local(devices=devices, **options))
        finally:
            for name in names:
                os.environ.pop(name, None)
        ready = {
            arm: [json.loads((Path(s.data) / "ready.json").read_text()) for s in cluster.specs]
            for arm, cluster in (("off", off), ("on", on))
        }
        ports = [r["metrics_port"] for r in ready["on"]]
        assert all(ports), ports
        pids = {arm: [r["pid"] for r in rs] for arm, rs in ready.items()}
        telemetry = Telemetry({"off": off, "on": on}, spans, ports, pids)
        stack.callback(telemetry.stop)
        yield telemetry
