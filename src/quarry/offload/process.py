"""The worker processes offloaded lines run in: started ahead, limited, killed when they overrun.

Starting Python and importing pandas takes most of a second; a device (and the host, completing
pushed-back slices) keeps ``SPARES`` workers started ahead per set of limits, each waiting for
its work, so a request starts at once. A worker is given one program's lines (and the values
sent with them); when its request ends it waits, ``IDLE_MAX`` at most, for another request of
exactly the same lines, values and limits (the same program run again: a k-means step, a
benchmark), and is retired once it has used half its CPU-time limit. Limits (``RLIMIT_AS``,
``RLIMIT_CPU``) are set in the child before it imports anything; a chunk that outlives its
wall-time bound is killed by the parent.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import resource
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import pyarrow as pa

from quarry.errors import QuarryError
from quarry.offload import worker

SPARES = 1  # workers started ahead, per set of limits
LIMIT_SETS_MAX = 2  # sets of limits with spares kept (others start a worker when asked)


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
        self._starting: dict[Limits, int] = {}  # spares being started: counted against the bound

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
        with self._lock:  # reserve what to start, so refills at once never overshoot the bound
            have = len(self._ready.get(limits, [])) + self._starting.get(limits, 0)
            missing = max(0, self.spares - have)
            self._starting[limits] = self._starting.get(limits, 0) + missing
        started = []
        try:
            started = [_start(limits) for _ in range(missing)]
        finally:
            with self._lock:
                self._starting[limits] -= missing
                self._ready.setdefault(limits, []).extend(started)


SPARE_WORKERS = Spares()
IDLE_MAX = 4  # workers waiting for the same lines again, per process (oldest retired first)
IDLE_S_MAX = 120.0  # and for at most this long


class Idle:
    """Workers whose request ended, by what they were given; bounded, oldest out first."""

    def __init__(self, size_max: int = IDLE_MAX):
        self.size_max = size_max
        self._lock = threading.Lock()
        self._waiting: list[tuple[str, float, Worker]] = []  # key, since, worker

    def take(self, key: str) -> Worker | None:
        found = None
        with self._lock:
            for index, (waiting, _, worker_) in enumerate(self._waiting):
                if waiting == key and worker_.process.poll() is None:
                    found = self._waiting.pop(index)[2]
                    break
        self._retire()
        return found

    def put(self, key: str, worker_: Worker) -> None:
        with self._lock:
            self._waiting.append((key, time.monotonic(), worker_))
        self._retire()

    def _retire(self) -> None:
        """The oldest beyond ``size_max``, and any that waited too long, stop."""
        horizon = time.monotonic() - IDLE_S_MAX
        with self._lock:
            keep = [w for w in self._waiting if w[1] >= horizon][-self.size_max :]
            retired = [w for w in self._waiting if w not in keep]
            self._waiting = keep
        for _, _, old in retired:
            old.close()


IDLE_WORKERS = Idle()


def _key(line: bytes, shipped: bytes, limits: Limits) -> str:
    return hashlib.sha256(line + shipped + repr(limits).encode()).hexdigest()


class Worker:
    """One worker process, given one request's lines: chunks in, values out."""

    def __init__(self, header: worker.Header, shipped: bytes, limits: Limits):
        self.header = header
        self.limits = limits
        self.cpu_s = 0.0  # used so far (its CPU-time limit counts every request)
        self._lock = threading.Lock()
        line = header.to_line()
        self.key = _key(line, shipped, limits)
        self.process = SPARE_WORKERS.take(limits)
        try:
            self.process.stdin.write(line)
            worker.write_frame(self.process.stdin, b"V", shipped)  # earlier lines' values
        except OSError:
            raise OffloadFailed(self._death()) from None

    @classmethod
    def given(cls, header: worker.Header, shipped: bytes, limits: Limits) -> Worker:
        """A worker for these lines: one that ran them before and waits, or a new one."""
        found = IDLE_WORKERS.take(_key(header.to_line(), shipped, limits))
        return found or cls(header, shipped, limits)

    def release(self) -> None:
        """The request is over: wait for the same lines again, or stop."""
        if self.process.poll() is None and self.cpu_s < self.limits.cpu_s / 2:
            IDLE_WORKERS.put(self.key, self)
        else:
            self.close()

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
        self.cpu_s += cpu_s
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
