"""Sub-plan shapes a device declines for a while, because their stage failed here (Exadata's
quarantine of a SQL plan that crashed a cell; docs/operations.md, "Quarantine").

A stage that fails on the device for the device's own reasons (its engine panicked, a fault
point, a chunk that ran past ``QUARRY_STAGE_S_MAX``) puts the plan's shape (``plan.shape``: the
plan without its literals) in quarantine for the dataset. Until the quarantine expires
(``QUARRY_QUARANTINE_S``) or an admin lifts it (``quarry quarantine clear``), every request of
that shape over that dataset is handed back whole, before a slice is read (``PushBack
.QUARANTINE``), and the host runs it: the answer stays right and the device stays up.

The list lives on the device, not with a coordinator: the device is where the stage failed and
the one that knows it, every coordinator that sends it work meets the same list, and nothing
central has to be asked (shared nothing, as the rest of what a device knows). It is a small
JSON file beside the store, as ``integrity.json`` is (a write to the store would change the
device's generation and make every coordinator's catalog stale), written whenever it changes,
so a device that restarts keeps what it quarantined.

Reading it costs nothing for a dataset with nothing quarantined (one set lookup, no lock, no
shape worked out): that is every request but those it exists for.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from quarry import settings
from quarry.errors import ProtocolError
from quarry.protocol.control import (
    DETAIL_CHARS_MAX,
    QUARANTINED_MAX,
    QuarantineCause,
    QuarantinedPlan,
)

QUARANTINE_FILE = "quarantine.json"
log = logging.getLogger("quarry.device")


class Quarantine:
    """The shapes a device declines, by (dataset, unit, shape), at most ``QUARANTINED_MAX``
    (the oldest go first); kept in ``QUARANTINE_FILE`` of its data folder."""

    def __init__(
        self,
        data: Path,
        device: str,
        quarantine_s: float | None = None,
        stage_s_max: float | None = None,
    ):
        self.path = Path(data) / QUARANTINE_FILE
        self.device = device
        self.quarantine_s = settings.QUARANTINE_S.get() if quarantine_s is None else quarantine_s
        # a chunk's stage longer than this quarantines its shape (read once: checked per chunk)
        self.stage_s_max = settings.STAGE_S_MAX.get() if stage_s_max is None else stage_s_max
        self._lock = threading.Lock()
        self._held: dict[tuple[str, str, str], QuarantinedPlan] = {}
        self._datasets: frozenset[str] = frozenset()  # read without the lock
        self._keep(self._load())

    def _load(self) -> list[QuarantinedPlan]:
        if not self.path.exists():
            return []
        try:
            body = json.loads(self.path.read_text())
            return [QuarantinedPlan.from_json(entry) for entry in body["quarantined"]]
        except (OSError, ValueError, KeyError, TypeError, ProtocolError) as error:
            # what it forgets fails again, and is quarantined again
            log.warning("%s unreadable (%s): starting it afresh", self.path, error)
            return []

    def _keep(self, entries: list[QuarantinedPlan]) -> None:
        """Hold ``entries``, the newest ``QUARANTINED_MAX`` of them (under the lock, or alone)."""
        newest = sorted(entries, key=lambda e: e.entered_at)[-QUARANTINED_MAX:]
        self._held = {entry.key: entry for entry in newest}
        self._datasets = frozenset(entry.dataset for entry in newest)

    def _save(self) -> None:
        body = {"quarantined": [entry.to_json() for entry in self._held.values()]}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(body))
        os.replace(tmp, self.path)

    def _expire(self, now: float) -> None:
        """Forget what expired by ``now`` (under the lock)."""
        live = [entry for entry in self._held.values() if entry.expires_at > now]
        if len(live) != len(self._held):
            self._keep(live)
            self._save()

    def holds(
        self, dataset: str, unit: str, shape: Callable[[], str | None]
    ) -> QuarantinedPlan | None:
        """The quarantine a request of ``unit`` over ``dataset`` (domain/name) meets, if any;
        ``shape`` is asked only when something of the dataset is quarantined."""
        if dataset not in self._datasets:
            return None
        found = shape()
        if found is None:
            return None
        with self._lock:
            self._expire(time.time())
            return self._held.get((dataset, unit, found))

    def enter(
        self, dataset: str, unit: str, shape: str, cause: QuarantineCause, detail: str
    ) -> QuarantinedPlan:
        """Quarantine ``shape`` for ``dataset`` from now on; entered again, it starts over."""
        now = time.time()
        entry = QuarantinedPlan(
            dataset=dataset,
            unit=unit,
            shape=shape,
            cause=cause,
            detail=detail[:DETAIL_CHARS_MAX],
            entered_at=now,
            expires_at=now + self.quarantine_s,
        )
        with self._lock:
            self._keep([*(e for e in self._held.values() if e.key != entry.key), entry])
            self._save()
        log.warning(
            "device %s quarantines sub-plan %s of %s for %.0f s (%s): %s",
            self.device,
            shape,
            dataset,
            self.quarantine_s,
            cause,
            entry.detail,
        )
        return entry

    def held(self) -> tuple[QuarantinedPlan, ...]:
        """What it declines now, the oldest first."""
        with self._lock:
            self._expire(time.time())
            return tuple(sorted(self._held.values(), key=lambda e: e.entered_at))

    def clear(self) -> int:
        """Lift every quarantine; how many there were."""
        with self._lock:
            self._expire(time.time())
            cleared = len(self._held)
            self._keep([])
            self._save()
        if cleared:
            log.warning("device %s: %d quarantined sub-plan shapes lifted", self.device, cleared)
        return cleared
