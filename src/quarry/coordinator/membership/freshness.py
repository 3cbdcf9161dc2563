"""Whether the catalog a query plans on still holds, without reading it again every time.

Every device keeps a generation that changes whenever what ``inventory`` or ``hello`` would
answer may have (a write to its store, a restart), and says it with its inventory, in its
pulse and, asked, at the door of every exchange and scan: a device that refuses work under a
generation that is not its own (``HelloReply.checks_generation``) raises ``CatalogChanged``
before it runs any. So a coordinator keeps the catalog it read (``CatalogState``) and checks
it per query: the devices a query sends work to check it themselves; the others are pulsed
(``CatalogCheck``). Whatever a check finds changed, the catalog is read again and the query
planned again; nothing of the stale run has left by then.

A device listed down because it went silent (``silent``: a partition, not a refusal) is pulsed
too, but not waited for: its pulse would wait out the silence bound on every query. Its answer
counts if it came in time; its heartbeat says so to the membership when it answers again
(``Membership.settle``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

from quarry.coordinator.membership.catalog import DatasetEntry
from quarry.protocol.control import HelloReply, LoadStatus


@dataclass(frozen=True)
class CatalogState:
    """The catalog and what it was read from, replaced whole by every read: a query plans on
    one state, never on half of one and half of the next."""

    version: int = 0  # counts reads: plans are kept per version
    catalog: dict[str, DatasetEntry] = field(default_factory=dict)
    info: dict[str, HelloReply] = field(default_factory=dict)
    down: dict[str, str] = field(default_factory=dict)  # devices that did not answer, why
    # per device, the generation its inventory was read under ("": it cannot tell; checked
    # again every time)
    generations: dict[str, str] = field(default_factory=dict)
    # devices down because they went silent (``DeviceSilent``): pulsed, not waited for
    silent: frozenset[str] = frozenset()

    def expected(self, device: str) -> str:
        """The generation to send a device with work planned on this state ("" for one that
        does not check it: it is pulsed instead)."""
        info = self.info.get(device)
        if info is None or not info.checks_generation or device in self.down:
            return ""
        return self.generations.get(device, "")

    def compare(self, answers: Mapping[str, Any]) -> tuple[bool, dict[str, LoadStatus]]:
        """Pulses (or the errors of devices that did not answer) against this state: whether
        it is stale, and each answering device's load."""
        stale = False
        loads: dict[str, LoadStatus] = {}
        for name, answer in answers.items():
            if isinstance(answer, Exception):
                stale = stale or name not in self.down  # it stopped answering
                continue
            if answer is None or name in self.down:  # cannot tell, or it answers again
                stale = True
                continue
            known = self.generations.get(name, "")
            stale = stale or not known or answer.generation != known
            loads[name] = answer.load
        return stale, loads


class Cluster(Protocol):
    """What a check needs of the coordinator's ``Membership`` (which makes checks)."""

    state: CatalogState

    def refresh(self) -> None: ...

    def loads_seen(self, loads: dict[str, LoadStatus]) -> None: ...


class CatalogCheck:
    """Pulses of some devices, under way while a query goes on: the state it planned on holds
    if each answers with the generation it was read under, the devices that did not answer
    still do not, and no one read the catalog again meanwhile. If it does not hold, ``holds``
    reads it again, so the caller plans on the new one."""

    def __init__(
        self, cluster: Cluster, state: CatalogState, answers: dict[str, Future] | None
    ) -> None:
        self.cluster = cluster
        self.state = state
        self._answers = answers  # None: nothing to ask (answered already)
        self._held: bool | None = True if answers is None else None
        self._loads: dict[str, LoadStatus] = {}

    def holds(self) -> bool:
        if self._held is None:
            assert self._answers is not None
            answers = {
                name: future.result()
                for name, future in self._answers.items()
                if name not in self.state.silent or future.done()
            }
            stale, self._loads = self.state.compare(answers)
            self.cluster.loads_seen(self._loads)
            if stale and self.cluster.state.version == self.state.version:
                self.cluster.refresh()
            self._held = not stale and self.cluster.state.version == self.state.version
        return self._held

    def loads(self) -> dict[str, LoadStatus]:
        """Each answering device's load (waits for the answers)."""
        self.holds()
        return self._loads


class Loads:
    """Each device's load as it last said it (a pulse, or the end of its work), and when:
    ``auto``'s cost model reads them rather than ask before every query."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[float, LoadStatus]] = {}

    def seen(self, loads: dict[str, LoadStatus]) -> None:
        now = time.monotonic()
        self._seen.update({name: (now, load) for name, load in loads.items()})

    def recent(self, devices: list[str], fresh_s: float) -> dict[str, LoadStatus] | None:
        """Every one of ``devices``' loads if each is at most ``fresh_s`` old, else None."""
        oldest = time.monotonic() - fresh_s
        seen = self._seen.copy()
        if any(name not in seen or seen[name][0] < oldest for name in devices):
            return None
        return {name: seen[name][1] for name in devices}

    def forget(self) -> None:
        self._seen = {}
