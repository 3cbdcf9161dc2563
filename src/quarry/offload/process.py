"""The worker processes offloaded lines run in: started ahead, limited, killed when they overrun.

Starting Python and importing pandas takes most of a second; a device (and the host, completing
pushed-back slices) keeps ``SPARES`` workers started ahead per set of limits, each waiting for
its work, so a request starts at once. A worker serves one request and exits: the program's
state never carries from one request to the next. Limits (``RLIMIT_AS``, ``RLIMIT_CPU``) are
set in the child before it imports anything; a chunk that outlives its wall-time bound is
killed by the parent.
"""

from __future__ import annotations

import contextlib
import os
import resource
import subprocess
import sys
import threading
from dataclasses import dataclass

import pyarrow as pa

from quarry.errors import QuarryError
from quarry.offload import worker

SPARES = 2  # workers started ahead, per set of limits
LIMIT_SETS_MAX = 4  # sets of limits with spares kept (others start a worker when asked)


class OffloadFailed(QuarryError):
    """An offloaded line raised, or ran out of its limits, on a device: where, and what."""

    code = "offload_failed"


@dataclass(frozen=True)
class Limits:
    memory_bytes: int
    cpu_s: int
    chunk_wall_s: float


def _start(limits: Limits) -> subprocess.Popen:
    def apply() -> None:  # in the child, before anything of the program runs
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s))

    return subprocess.Popen(
        [sys.executable, "-m", "quarry.offload.worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        preexec_fn=apply,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


class Spares:
    """Workers started ahead, per set of limits (bounded); taken one per request."""

    def __init__(self, spares: int = SPARES):
        self.spares = spares
        self._lock = threading.Lock()
        self._ready: dict[Limits, list[subprocess.Popen]] = {}

    def take(self, limits: Limits) -> subprocess.Popen:
        with self._lock:
            ready = self._ready.get(limits)
            if ready is None and len(self._ready) < LIMIT_SETS_MAX:
                ready = self._ready[limits] = []
            process = None
            while ready and process is None:
                candidate = ready.pop(0)
                process = candidate if candidate.poll() is None else None
        if ready is not None:
            threading.Thread(target=self._refill, args=(limits,), daemon=True).start()
        return process or _start(limits)

    def _refill(self, limits: Limits) -> None:
        with self._lock:
            ready = self._ready.get(limits, [])
            missing = self.spares - len(ready)
        started = [_start(limits) for _ in range(max(0, missing))]
        with self._lock:
            self._ready.setdefault(limits, []).extend(started)


SPARE_WORKERS = Spares()


class Worker:
    """One worker process, given one request's lines: chunks in, values out."""

    def __init__(self, header: worker.Header, shipped: bytes, limits: Limits):
        self.header = header
        self.limits = limits
        self._lock = threading.Lock()
        self.process = SPARE_WORKERS.take(limits)
        try:
            self.process.stdin.write(header.to_line())
            worker.write_frame(self.process.stdin, b"V", shipped)  # earlier lines' values
        except OSError:
            raise OffloadFailed(self._death()) from None

    def run(self, rows: pa.Table) -> tuple[pa.Table, float]:
        """The values for a slice's rows, and the worker's CPU seconds for them."""
        with self._lock:  # the host may complete two pushed-back ranges at once
            return self._run(rows)

    def _run(self, rows: pa.Table) -> tuple[pa.Table, float]:
        timer = threading.Timer(self.limits.chunk_wall_s, self.process.kill)
        timer.start()
        try:
            worker.write_frame(self.process.stdin, b"D", worker.ipc(rows))
            frame = worker.read_frame(self.process.stdout)
        except (EOFError, OSError):
            frame = None
        finally:
            timer.cancel()
        if frame is None:
            raise OffloadFailed(self._death())
        tag, body = frame
        if tag == b"E":
            self.close()
            raise OffloadFailed(body.decode(errors="replace"))
        table = pa.ipc.open_stream(pa.py_buffer(body)).read_all()
        cpu_s = float((table.schema.metadata or {}).get(worker.CPU_S, b"0"))
        return table.replace_schema_metadata(None), cpu_s

    def _death(self) -> str:
        code = self.process.wait(timeout=10)
        limits = (
            f"{self.limits.memory_bytes >> 20} MiB of memory, {self.limits.cpu_s} s of CPU, "
            f"{self.limits.chunk_wall_s:g} s per chunk"
        )
        return (
            f"{self.header.path}: the offloaded lines {self.header.lines} stopped "
            f"(exit {code}) within their limits ({limits})"
        )

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.process.stdin.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
