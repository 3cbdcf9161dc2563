"""The kept-plans map: least recently used goes first, never more than its bound, and a value
is made once per key while kept."""

from __future__ import annotations

import pytest

from quarry.coordinator.query.plan_cache import Kept


def test_the_least_recently_used_goes_first_and_the_bound_holds():
    kept: Kept[str] = Kept(entries_max=2)
    assert kept.get("a", lambda: "A") == ("A", False)
    assert kept.get("b", lambda: "B") == ("B", False)
    assert kept.get("a", lambda: "other") == ("A", True)  # used: now the most recent
    kept.get("c", lambda: "C")  # pushes out b, the least recently used
    assert len(kept) == 2
    assert kept.get("a", lambda: "again") == ("A", True)
    assert kept.get("b", lambda: "B2") == ("B2", False)
    assert (kept.hits, kept.misses) == (2, 4)


def test_a_failed_make_keeps_nothing():
    kept: Kept[int] = Kept()

    def fail() -> int:
        raise ValueError("no plan")

    for _ in range(2):
        with pytest.raises(ValueError):
            kept.get("q", fail)
    assert len(kept) == 0
    assert kept.get("q", lambda: 1) == (1, False)
