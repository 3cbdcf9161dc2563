"""What a device found wrong with its own copies, and its last whole scrub (docs/integrity.md).

A device that reads a value failing its check raises ``CorruptSlice`` (never an answer) and
remembers the copy here until it is mended, so that ``quarry status`` shows it and ``quarry
repair`` (or ``quarry scrub``) mends it from a good copy: the queue of repairs lives on the
device that holds the damage, as everything else it knows of its data does (no central server).

It is a small JSON file beside the store, not a key in it: a write to the store changes the
device's generation, and a damaged slice met by one query must not make every coordinator's
catalog stale (and refuse the rest of that query's work on this device).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Container
from pathlib import Path

from quarry.errors import CorruptSlice, ProtocolError
from quarry.protocol.integrity import (
    CORRUPT_KEPT_MAX,
    CopyPart,
    CorruptCopy,
    FoundBy,
    IntegrityReply,
    ScrubSummary,
)

INTEGRITY_FILE = "integrity.json"
log = logging.getLogger("quarry.device")


class IntegrityLog:
    """The damaged copies a device holds (at most ``CORRUPT_KEPT_MAX``, the oldest dropped
    first) and its last whole scrub; kept in ``INTEGRITY_FILE`` of its data folder."""

    def __init__(self, data: Path, device: str):
        self.path = Path(data) / INTEGRITY_FILE
        self.device = device
        self._lock = threading.Lock()
        self._held = self._load()

    def _load(self) -> IntegrityReply:
        if not self.path.exists():
            return IntegrityReply()
        try:
            return IntegrityReply.from_json(json.loads(self.path.read_text()))
        except (OSError, ValueError, ProtocolError) as error:
            # what it forgets, the next scrub finds again
            log.warning("%s unreadable (%s): starting it afresh", self.path, error)
            return IntegrityReply()

    def _save(self, held: IntegrityReply) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(held.to_json()))
        os.replace(tmp, self.path)
        self._held = held

    def held(self) -> IntegrityReply:
        with self._lock:
            return self._held

    def found(self, error: CorruptSlice, found_by: FoundBy = FoundBy.READ) -> CorruptSlice:
        """Remember the copy ``error`` names; the error, naming this device."""
        error = error.on(self.device)
        self.remember(error, found_by)
        return error

    def remember(self, error: CorruptSlice, found_by: FoundBy) -> CorruptCopy | None:
        """The copy ``error`` names, remembered (None: it names none)."""
        error = error.on(self.device)
        copy = CorruptCopy.of(error, self.device, time.time(), found_by)
        if copy is not None:
            log.warning("damaged copy: %s", error)
            self.add([copy])
        return copy

    def add(self, copies: list[CorruptCopy]) -> None:
        if not copies:
            return
        with self._lock:
            kept = {c.key: c for c in self._held.corrupt}
            fresh = [copy for copy in copies if copy.key not in kept]
            if not fresh:  # known already (a query meets the same copy again and again)
                return
            for copy in fresh:
                kept[copy.key] = copy
            listed = sorted(kept.values(), key=lambda c: c.found_at)[-CORRUPT_KEPT_MAX:]
            self._save(IntegrityReply(tuple(listed), self._held.last_scrub))

    def mended(
        self,
        domain: str,
        dataset: str,
        partition: int,
        parts: frozenset[CopyPart] = frozenset(CopyPart),
        slices: Container[int] | None = None,
    ) -> None:
        """Forget the damaged copies of a partition that are good again: of ``parts``, and for
        slices, only those numbered in ``slices`` (None: every one)."""

        def good(c: CorruptCopy) -> bool:
            if (c.domain, c.dataset, c.partition) != (domain, dataset, partition):
                return False
            if c.part not in parts:
                return False
            return c.slice is None or slices is None or c.slice in slices

        with self._lock:
            kept = tuple(c for c in self._held.corrupt if not good(c))
            if len(kept) != len(self._held.corrupt):
                self._save(IntegrityReply(kept, self._held.last_scrub))

    def dropped(self, domain: str, dataset: str) -> None:
        """A dataset dropped: its damaged copies are gone with it."""
        with self._lock:
            kept = tuple(
                c for c in self._held.corrupt if (c.domain, c.dataset) != (domain, dataset)
            )
            if len(kept) != len(self._held.corrupt):
                self._save(IntegrityReply(kept, self._held.last_scrub))

    def scrubbed(self, summary: ScrubSummary) -> None:
        with self._lock:
            self._save(IntegrityReply(self._held.corrupt, summary))
