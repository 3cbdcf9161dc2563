"""The work counters, declared once: what a unit of work did with one partition's slices.

One frozen dataclass, composed wherever the counts go: the device loop counts into it
(``device.loop.Counters``), the wire carries it (``WorkMetrics.counters``), the host keeps it
per device and partition (``WorkReport``), a storage server reports its drives' and its own
with it, and EXPLAIN ANALYZE sums it per device and per level. Each of them reads the field
list from here (``COUNTERS``), so a new counter is one line below plus where it is counted.

Every field adds up: two accounts of work are one account of both (``plus``). Two figures of a
partition's work are not counters and stay beside them: ``wall_s``, a span (a partition's is
the longest of its accounts; a query's devices add theirs up: each reader combines it its own
way), and ``WorkTimes``, where that time went (its own parts, its own sum).

Slices pushed back are counted once more by why they went back (``PushBack``): one counter per
reason, named ``slices_pushed_back_<reason>`` (``PUSHED_BACK_BY``), each slice under one reason,
so they add up to ``slices_pushed_back``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace

from quarry.protocol.message import Message, bounded
from quarry.protocol.stage import PushBack


@dataclass(frozen=True)
class WorkCounters(Message):
    """Slices: total = pruned + cached + answered + elsewhere + scanned, and scanned = executed
    + pushed back (each range read once, whatever happened). ``WorkCounters()`` is no work."""

    slices_total: int = bounded(low=0, default=0)
    slices_pruned: int = bounded(low=0, default=0)  # zone maps exclude every row
    slices_cached: int = bounded(low=0, default=0)  # a stored partial result covers them
    slices_answered: int = bounded(low=0, default=0)  # from their statistics, unread
    slices_elsewhere: int = bounded(low=0, default=0)  # done by a replica that stopped answering
    slices_scanned: int = bounded(low=0, default=0)
    slices_executed: int = bounded(low=0, default=0)
    slices_pushed_back: int = bounded(low=0, default=0)
    # of which, by why they went back (``PushBack``), each slice under one reason
    slices_pushed_back_busy: int = bounded(low=0, default=0)
    slices_pushed_back_slow: int = bounded(low=0, default=0)
    slices_pushed_back_memory: int = bounded(low=0, default=0)
    slices_pushed_back_capability: int = bounded(low=0, default=0)
    slices_pushed_back_failed_stage: int = bounded(low=0, default=0)
    slices_pushed_back_quarantine: int = bounded(low=0, default=0)
    slices_pushed_back_forced: int = bounded(low=0, default=0)
    # slices whose checksums were checked when read (on the device, or on the host when they
    # came as stored), and copies that failed the check and were read elsewhere instead
    slices_verified: int = bounded(low=0, default=0)
    slices_rejected: int = bounded(low=0, default=0)
    rows_read: int = bounded(low=0, default=0)
    bytes_read: int = bounded(low=0, default=0)
    bytes_cached: int = bounded(low=0, default=0)  # of those, from the device's column cache
    rows_shipped: int = bounded(low=0, default=0)  # everything sent upstream for this work
    bytes_shipped: int = bounded(low=0, default=0)
    drive_s: float = bounded(low=0.0, default=0.0)  # emulated drive time of what it executed
    device_cpu_s: float = bounded(low=0.0, default=0.0)

    def plus(self, other: WorkCounters) -> WorkCounters:
        return WorkCounters(
            **{name: getattr(self, name) + getattr(other, name) for name in COUNTERS}
        )

    @classmethod
    def sum(cls, accounts: Iterable[WorkCounters]) -> WorkCounters:
        total = cls()
        for account in accounts:
            total = total.plus(account)
        return total

    def pushed_back_by(self) -> dict[PushBack, int]:
        """Slices pushed back per reason, the reasons with none left out (in ``PushBack``'s
        order)."""
        counted = {reason: getattr(self, name) for reason, name in PUSHED_BACK_BY.items()}
        return {reason: slices for reason, slices in counted.items() if slices}

    def with_pushed_back(self, by: Mapping[PushBack, int]) -> WorkCounters:
        """These counts with the slices pushed back replaced by ``by`` (a storage server's own
        account: what it passed on, not what its drive handed it)."""
        return replace(
            self,
            slices_pushed_back=sum(by.values()),
            **{name: by.get(reason, 0) for reason, name in PUSHED_BACK_BY.items()},
        )


def pushed_back(reason: PushBack, slices: int) -> WorkCounters:
    """``slices`` pushed back for ``reason``: counted in the total and under the reason."""
    return WorkCounters(**{"slices_pushed_back": slices, PUSHED_BACK_BY[reason]: slices})


COUNTERS: tuple[str, ...] = tuple(f.name for f in fields(WorkCounters))
PUSHED_BACK_BY: dict[PushBack, str] = {r: f"slices_pushed_back_{r.value}" for r in PushBack}
# one counter per reason, and no other named like one
assert {c for c in COUNTERS if c.startswith("slices_pushed_back_")} == set(PUSHED_BACK_BY.values())
