from collections import Counter

import pytest

from quarry.coordinator.membership.placement import place_all


def test_placement_is_deterministic_balanced_and_distinct():
    devices = ["dev0", "dev1", "dev2", "dev3"]
    a = place_all("physics/particles", range(16), devices, 2)
    assert a == place_all("physics/particles", range(16), list(reversed(devices)), 2)
    load = Counter(d for replicas in a.values() for d in replicas)
    assert max(load.values()) - min(load.values()) <= 2
    assert all(len(set(r)) == 2 for r in a.values())


def test_replicas_bounded_by_devices():
    with pytest.raises(ValueError, match="between 1 and the number of devices"):
        place_all("d/n", range(4), ["a", "b"], 3)
