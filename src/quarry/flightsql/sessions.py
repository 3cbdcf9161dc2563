"""One cluster handle per token: every query runs with the caller's own token.

The endpoint does not query with the cluster file's token (often the admin's). Each token that
calls gets its own ``Cluster`` whose device clients carry that token, so the devices check the
caller's signature and role on every call, exactly as they would for a Python client holding
the token; the endpoint grants nothing a token does not have. What belongs to the host rather
than to a caller is shared by all of them: its admission of long queries (``Workload``: one host,
one set of turns), the cost model's sampled figures and the devices' calibration.

Bounded: at most ``SESSIONS_MAX`` tokens hold a handle at once; one idle for
``SESSION_IDLE_S_MAX`` is closed by the reaper, and when all are busy a new token is told to
come back rather than queued.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from quarry.coordinator.cluster import Cluster
from quarry.coordinator.membership.cluster_file import DeviceSpec
from quarry.coordinator.query.host_admission import Workload
from quarry.coordinator.query.settled_cuts import Settled
from quarry.errors import ClusterError
from quarry.protocol.control import CalibrationReport

SESSIONS_MAX = 32
SESSION_IDLE_S_MAX = 600.0


@dataclass
class Session:
    owner: str
    cluster: Cluster
    leases: int = 0
    used_at: float = 0.0


class Sessions:
    def __init__(self, specs: Sequence[DeviceSpec], source: str | None = None):
        # what an entry says about its own credentials is replaced by the caller's token
        self.specs = tuple(replace(d, token=None, token_file=None, credentials=None) for d in specs)
        self.source = source
        self.workload = Workload()
        self.calibration_cache: dict[str, CalibrationReport | None] = {}
        self.figures_cache: dict[tuple[bytes, str], Any] = {}
        self.settled = Settled()
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def acquire(self, owner: str, token: str) -> Session:
        """The caller's session, leased until ``release``. Opening one asks every device (with
        the token, which a device refuses if it is not the cluster's)."""
        with self._lock:
            session = self._sessions.get(owner)
            if session is not None:
                session.leases += 1
                session.used_at = time.monotonic()
                return session
            self._make_room()
        cluster = self._open(token)  # outside the lock: it asks the devices
        with self._lock:
            session = self._sessions.get(owner)
            if session is None:
                self._make_room()
                session = self._sessions[owner] = Session(owner, cluster)
            else:  # another call of the same token opened one meanwhile
                cluster.close()
            session.leases += 1
            session.used_at = time.monotonic()
            return session

    def release(self, session: Session) -> None:
        with self._lock:
            assert session.leases > 0, f"session {session.owner} released more than leased"
            session.leases -= 1
            session.used_at = time.monotonic()

    def reap(self, now: float | None = None) -> int:
        """Close the sessions idle for longer than ``SESSION_IDLE_S_MAX``; how many."""
        now = time.monotonic() if now is None else now
        with self._lock:
            idle = [
                s
                for s in self._sessions.values()
                if s.leases == 0 and now - s.used_at > SESSION_IDLE_S_MAX
            ]
            for session in idle:
                del self._sessions[session.owner]
        for session in idle:
            session.cluster.close()
        return len(idle)

    def close(self) -> None:
        with self._lock:
            sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            session.cluster.close()

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def _make_room(self) -> None:
        """Under the lock: close the least recently used idle session if the bound is reached,
        or refuse the new token when every session is running something."""
        if len(self._sessions) < SESSIONS_MAX:
            return
        idle = [s for s in self._sessions.values() if s.leases == 0]
        if not idle:
            raise ClusterError(
                f"{SESSIONS_MAX} tokens are running queries on this endpoint; try again when "
                "one finishes"
            )
        oldest = min(idle, key=lambda s: s.used_at)
        del self._sessions[oldest.owner]
        oldest.cluster.close()

    def _open(self, token: str) -> Cluster:
        cluster = Cluster([replace(d, token=token) for d in self.specs], source=self.source)
        cluster.workload = self.workload
        cluster.calibration_cache = self.calibration_cache
        cluster.figures_cache = self.figures_cache
        cluster.settled = self.settled
        return cluster
