"""Plans kept between queries: the same SQL over the same catalog is cut the same way.

Decomposing a query (DataFusion's plan, Substrait, the rewrite rules, every stage planned again
to check it) costs milliseconds, more than a small query's whole run. The cut depends on the
SQL, the pushdown and the catalog (schemas, which devices hold what, what they evaluate), so a
plan is kept under ``(sql, pushdown, catalog version)``: ``Membership.refresh`` counts a new
version whenever it rebuilds the catalog, and plans of older versions are never asked for
again (they fall out of the LRU). A kept plan is shared by the queries that use it, which only
read it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")
PLANS_KEPT_MAX = 256


class Kept(Generic[T]):
    """A bounded least-recently-used map, safe from several threads."""

    def __init__(self, entries_max: int = PLANS_KEPT_MAX) -> None:
        assert entries_max >= 1
        self.entries_max = entries_max
        self._entries: OrderedDict[Hashable, T] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def get(self, key: Hashable, make: Callable[[], T]) -> tuple[T, bool]:
        """The value kept under ``key``, or ``make()``'s, kept; and whether it was kept. Two
        threads missing the same key at once both make it (the plans are equal): planning
        never waits on another query's."""
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                self.hits += 1
                return self._entries[key], True
            self.misses += 1
        value = make()
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.entries_max:
                self._entries.popitem(last=False)
        return value, False

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
