"""The endpoint as a process of its own, beside a cluster's devices (``quarry up
--flight-sql-port``): started like a device (a ready file says where it listens), stopped by
``quarry down``.

It lives in the cluster's data folder, under ``flightsql/`` (its log and its ready file), so
``quarry down`` finds it from the cluster file alone.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from quarry.coordinator.processes.spawn import spawn, stop_pid

FOLDER = "flightsql"


def command(cluster_file: Path, port: int, ready_file: Path, tls: bool) -> list[str]:
    line = [sys.executable, "-m", "quarry", "serve", "--cluster", str(cluster_file)]
    line += ["--port", str(port), "--ready-file", str(ready_file)]
    return [*line, "--tls"] if tls else line


def start(
    cluster_file: Path, port: int, tls: bool = False, detach: bool = False
) -> tuple[subprocess.Popen, dict[str, Any]]:
    """Start ``quarry serve`` for the cluster file, on loopback, and wait until it listens;
    its ready file (address, port, pid) is in ``flightsql/`` beside the cluster file."""
    folder = Path(cluster_file).resolve().parent / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    line = command(Path(cluster_file).resolve(), port, folder / "ready.json", tls)
    return spawn(line, folder, "the Flight SQL endpoint", detach)


def stop(cluster_file: Path) -> str | None:
    """Stop the endpoint started for this cluster file, if one is running; what happened."""
    ready = Path(cluster_file).resolve().parent / FOLDER / "ready.json"
    try:
        pid = int(json.loads(ready.read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    ready.unlink(missing_ok=True)
    if not _is_endpoint(pid, Path(cluster_file).resolve()):
        return "was not running"
    stop_pid(pid)
    return "stopped"


def _is_endpoint(pid: int, cluster_file: Path) -> bool:
    """Whether ``pid`` is this cluster's endpoint, not a process that took its number."""
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    text = [w.decode(errors="replace") for w in words]
    return "quarry" in text and "serve" in text and str(cluster_file) in text
