"""Shared by the benchmarks: where results go, what machine made them, how progress shows."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

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
