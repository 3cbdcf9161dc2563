"""Partition placement by rendezvous (highest random weight) hashing, with bounded loads.

Every coordinator computes the same placement from the dataset name, the partition numbers and
the device names alone: no placement table to keep, and adding a device moves only partitions
that now hash highest to it. Plain rendezvous hashing leaves a few partitions per device badly
uneven (16 over 4 devices can land 7/4/3/2), so each device takes at most its fair share:
a partition goes to its highest-weight devices that are not yet full.
"""

from __future__ import annotations

import hashlib
import math


def weight(dataset: str, partition: int, device: str) -> int:
    digest = hashlib.blake2b(f"{dataset}\0{partition}\0{device}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big")


def place_all(
    dataset: str, partitions: range, devices: list[str], replicas: int
) -> dict[int, list[str]]:
    """For each partition, the ``replicas`` devices that hold it, primary first."""
    if not 1 <= replicas <= len(devices):
        raise ValueError(
            f"replicas must be between 1 and the number of devices ({len(devices)}), got {replicas}"
        )
    share = math.ceil(len(partitions) * replicas / len(devices))
    load = dict.fromkeys(devices, 0)
    placement: dict[int, list[str]] = {}
    for partition in partitions:
        # Devices under their share first, each group by weight; replicas stay distinct even
        # when the last partitions find fewer devices with room than replicas.
        ranked = sorted(devices, key=lambda d: (load[d] >= share, -weight(dataset, partition, d)))
        chosen = ranked[:replicas]
        assert len(set(chosen)) == replicas
        for device in chosen:
            load[device] += 1
        placement[partition] = chosen
    return placement
