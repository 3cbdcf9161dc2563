"""The host's own admission: long queries take turns, short ones go straight through.

Devices bound their work (``device.admission``); the host must too, for it completes what the
devices hand back and runs every super-plan (TPC-H's joins) on a few cores. Sixty-four queries
at once each get a sixty-fourth of them, a user's 80 ms lookup included. So a query expected to
be long takes one of ``slots`` (two per core) and waits its turn; a short one runs at once
(Redshift's short query acceleration, with a measured history instead of a model).

What a query is expected to take is the least that queries of its shape took before (the SQL
with its literals taken out): its cost on a quiet host, which contention does not inflate. A
shape never seen counts as long, the safe guess; one run teaches it. A thread that already
holds a turn does not wait for another (it may be reading several answers at once: waiting
would wait for itself).
"""

from __future__ import annotations

import collections
import os
import re
import threading
import time

from quarry import settings
from quarry.errors import ClusterError

SLOTS_PER_CORE = 2
SHAPES_MAX = 1024  # remembered query shapes, the least recently used forgotten

_LITERALS = re.compile(r"'(?:[^']|'')*'|\b\d+(?:\.\d+)?(?:[eE][-+]?\d+)?\b")


def shape(sql: str) -> str:
    """The SQL with literals replaced: queries that differ only in their constants share it."""
    return " ".join(_LITERALS.sub("?", sql).split()).lower()


def slots_default() -> int:
    configured = settings.HOST_QUERIES_MAX.get()
    if configured is not None:
        return configured
    return SLOTS_PER_CORE * (os.cpu_count() or 1)


class Slot:
    """A long query's turn (or none), given back once, whichever thread gives it."""

    def __init__(self, workload: Workload | None, owner: int = 0, waited_s: float = 0.0):
        self._workload = workload
        self._owner = owner
        self._lock = threading.Lock()
        self.long = workload is not None
        self.waited_s = waited_s  # how long it waited for its turn

    def release(self) -> None:
        with self._lock:
            workload, self._workload = self._workload, None
        if workload is not None:
            workload._give_back(self._owner)


class Workload:
    def __init__(self, slots: int | None = None, short_s: float | None = None):
        self.slots = slots or slots_default()
        self.short_s = settings.SHORT_QUERY_S.get() if short_s is None else short_s
        self.wait_s_max = settings.HOST_QUEUE_S.get()
        self._slots = threading.BoundedSemaphore(self.slots)
        self._lock = threading.Lock()
        self._least: collections.OrderedDict[str, float] = collections.OrderedDict()
        self._holding: dict[int, int] = {}  # thread -> turns it holds
        self.short = 0
        self.long = 0
        self.waited_s = 0.0

    def expected_s(self, sql: str) -> float | None:
        with self._lock:
            return self._least.get(shape(sql))

    def admit(self, sql: str) -> Slot:
        """Wait for a turn unless ``sql`` is short or this thread holds one; release the
        answer when the query ends (twice is harmless)."""
        expected = self.expected_s(sql)
        me = threading.get_ident()
        with self._lock:
            if (expected is not None and expected <= self.short_s) or self._holding.get(me):
                self.short += 1
                return Slot(None)
        started = time.perf_counter()
        if not self._slots.acquire(timeout=self.wait_s_max):
            raise ClusterError(
                f"the host ran {self.slots} long queries for {self.wait_s_max:g} s without a "
                f"free slot; try again later (${settings.HOST_QUERIES_MAX.name} sets the slots, "
                f"${settings.HOST_QUEUE_S.name} the wait)"
            )
        waited_s = time.perf_counter() - started
        with self._lock:
            self.long += 1
            self.waited_s += waited_s
            self._holding[me] = self._holding.get(me, 0) + 1
        return Slot(self, me, waited_s)

    def _give_back(self, owner: int) -> None:
        with self._lock:
            left = self._holding.pop(owner, 1) - 1
            if left:
                self._holding[owner] = left
        self._slots.release()

    def learn(self, sql: str, wall_s: float) -> None:
        key = shape(sql)
        with self._lock:
            before = self._least.pop(key, None)
            self._least[key] = wall_s if before is None else min(before, wall_s)
            while len(self._least) > SHAPES_MAX:
                self._least.popitem(last=False)

    def status(self) -> dict[str, float]:
        with self._lock:
            return {
                "slots": self.slots,
                "short": self.short,
                "long": self.long,
                "waited_s": round(self.waited_s, 3),
            }
