"""Ingests that lost their coordinator or their outcome heal on the device, without a restart.

A pending partition stays while its coordinator renews its lease. When the lease has run out
(the coordinator is gone), or when the device starts (it may have missed the outcome while it
was down), the device asks the ingest's decider: committed there means commit here too, aborted
or unknown there means abort here; a decider still holding the ingest pending, with its lease
running, means wait. The decider answers from its own store (``partition.outcome``), so every
participant reaches the same outcome: a dataset ends complete or absent everywhere, and its name
can be ingested again. It also deletes the rows of partitions moved away from the device once
queries planned before the move are done with them (``QUARRY_MOVED_KEEP_S``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from quarry import settings
from quarry.device.peers import ask_outcome
from quarry.protocol.ingest import Outcome
from quarry.store import partition as partitions
from quarry.store.kv import KeyValueStore

log = logging.getLogger("quarry.device")

PERIOD_S = 1.0  # how often a device looks at its pending ingests

Ask = Callable[[str, str], Outcome | None]  # (decider address, ingest id) -> its word


def resolve(
    store: KeyValueStore, device: str, startup: bool, ask: Ask = ask_outcome
) -> dict[str, str]:
    """Settle the pending ingests that can be settled; returns what was done to each."""
    done: dict[str, str] = {}
    now = time.time()
    for ingest_id, held in partitions.pending_ingests(store).items():
        record = held["ingest"]
        if not startup and held["lease_until"] > now:
            continue  # its coordinator is alive and may still be streaming
        # rows that never all arrived cannot be committed, whatever the outcome
        partitions.abort_unfinished(store, ingest_id)
        if ingest_id not in partitions.pending_ingests(store):
            done[ingest_id] = "aborted"
            continue
        decider = record.get("decider", "")
        if not decider:  # written before ingests named a decider: a failed ingest's debris
            outcome = Outcome.ABORT
        elif decider == device:
            outcome = Outcome(partitions.outcome(store, ingest_id, now))
        else:
            address = record.get("addresses", {}).get(decider)
            answer = ask(address, ingest_id) if address else None
            if answer is None:
                continue  # the decider is down: ask again later
            outcome = answer
        if outcome is Outcome.COMMIT:
            partitions.commit(store, ingest_id, device)
            done[ingest_id] = "committed"
        elif outcome is Outcome.ABORT:
            partitions.abort(store, ingest_id)
            done[ingest_id] = "aborted"
    return done


class Janitor:
    """``resolve`` once at start, then every ``PERIOD_S`` in a thread, until stopped."""

    def __init__(
        self, store: KeyValueStore, device: str, period_s: float = PERIOD_S, ask: Ask = ask_outcome
    ):
        self.store = store
        self.device = device
        self.period_s = period_s
        self.ask = ask
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="quarry-janitor", daemon=True)

    def start(self) -> dict[str, str]:
        settled = self._pass(startup=True)
        self._thread.start()
        return settled

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self._pass(startup=False)

    def _pass(self, startup: bool) -> dict[str, str]:
        try:
            settled = resolve(self.store, self.device, startup, self.ask)
            # rows of partitions moved away, kept for work planned before the move
            partitions.purge_retired(self.store, settings.MOVED_KEEP_S.get(), time.time())
        except Exception:  # a bad marker must not stop the device; logged, tried again
            log.exception("%s: settling pending ingests failed", self.device)
            return {}
        for ingest_id, what in settled.items():
            log.warning("%s: ingest %s %s on its own", self.device, ingest_id, what)
        return settled
