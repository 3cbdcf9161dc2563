"""Partition placement: rendezvous (highest random weight) hashing, bounded loads, failure domains.

An ingest's placement comes from the dataset name, the partition numbers, the device names and
their failure domains alone, so every coordinator computes the same: no placement table to keep.
A partition ranks the devices by ``weight``; it goes to the highest that keep its replicas in
distinct domains (racks, then hosts) while enough exist, and that are not yet full: plain
rendezvous hashing leaves a few partitions per device badly uneven (16 over 4 devices can land
7/4/3/2), so each device takes at most its fair share of an ingest's partitions. Domains come
before loads: a partition's replicas never share a host while enough hosts exist, even if a
device must then hold more than its share.

A bounded-load placement computed afresh is not stable under growth: a device added changes
every share, and each partition displaced from a full device displaces another (measured over
400 random names, 40 partitions, 2 replicas, a fifth device added to four: 23% of the replicas
move where 20% must; 10 partitions with one replica: 34%). So a cluster that changes is not
placed afresh: ``plan`` starts from where the partitions are (what the devices hold, so again
the same for every coordinator) and changes only what must change: the replicas of devices
taken out, replicas sharing a domain that can now be apart, and, for balance, partitions from
the most loaded devices to the least loaded, those that rank the lighter device higher first.
Adding a device to N moves about 1/(N+1) of the replicas (all to it) and draining one moves its
replicas and a few more that even the rest out (``tests/coordinator/membership/
test_placement.py`` measures both). A plan is a fixed point: planning its result again moves
nothing, so a rebalance cut short is planned again from wherever it stopped.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

# a plan's balancing moves: one per replica at most (each strictly evens two devices' loads)
BALANCE_ROUNDS_PER_REPLICA = 1


@dataclass(frozen=True)
class Domain:
    """Where a device sits: the host it runs on and, optionally, its rack (a device without a
    rack label is a rack of its own host's). Two replicas of a partition share neither while
    enough distinct ones exist."""

    host: str
    rack: str = ""

    @property
    def rack_key(self) -> str:
        return self.rack or f"host:{self.host}"


Devices = Mapping[str, Domain] | Sequence[str]


def domains_of(devices: Devices) -> dict[str, Domain]:
    """Devices given by name alone are each a host of their own (no domain to keep apart)."""
    if isinstance(devices, Mapping):
        return dict(devices)
    return {name: Domain(host=name) for name in devices}


def weight(dataset: str, partition: int, device: str) -> int:
    digest = hashlib.blake2b(f"{dataset}\0{partition}\0{device}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big")


@dataclass(frozen=True)
class Spread:
    """How many distinct racks and hosts a partition's replicas span."""

    racks: int
    hosts: int

    @classmethod
    def of(cls, devices: Iterable[str], domains: Mapping[str, Domain]) -> Spread:
        placed = [domains[d] for d in devices]
        return cls(len({d.rack_key for d in placed}), len({d.host for d in placed}))

    def covers(self, other: Spread) -> bool:
        return self.racks >= other.racks and self.hosts >= other.hosts


def best_spread(replicas: int, domains: Mapping[str, Domain]) -> Spread:
    """The most distinct racks and hosts ``replicas`` copies can span over these devices."""
    every = Spread.of(domains, domains)
    return Spread(min(replicas, every.racks), min(replicas, every.hosts))


def apart(device: str, chosen: Iterable[str], domains: Mapping[str, Domain]) -> int:
    """2: ``device`` adds a rack (and so a host) to ``chosen``; 1: a host only; 0: neither."""
    domain = domains[device]
    others = [domains[c] for c in chosen]
    if all(domain.rack_key != o.rack_key and domain.host != o.host for o in others):
        return 2
    if all(domain.host != o.host for o in others):
        return 1
    return 0


def place_all(
    dataset: str, partitions: range, devices: Devices, replicas: int
) -> dict[int, list[str]]:
    """For each partition, the ``replicas`` devices that hold it, highest weight first: a plan
    from nothing, from the names and domains alone (what other datasets hold is evened out by
    ``plan``, when a rebalance runs)."""
    domains = domains_of(devices)
    if not 1 <= replicas <= len(domains):
        raise ValueError(
            f"replicas must be between 1 and the number of devices ({len(domains)}), got {replicas}"
        )
    group = Group(dataset, replicas, {p: () for p in partitions})
    (placed,) = plan([group], domains)
    return {p: list(devices_of_p) for p, devices_of_p in placed.items()}


@dataclass(frozen=True)
class Group:
    """Partitions placed together (one ingest of one dataset): each shares the group's replica
    count, and each device takes at most its fair share of the group. ``holders``: partition ->
    the devices holding it now (empty for a new ingest)."""

    dataset: str
    replicas: int
    holders: Mapping[int, tuple[str, ...]]

    def share(self, devices: int) -> int:
        return math.ceil(len(self.holders) * self.replicas / devices)


@dataclass
class _Planning:
    """A plan under way: every group's placement, each device's load over all of them and
    within each group."""

    groups: list[Group]
    domains: Mapping[str, Domain]
    placed: list[dict[int, list[str]]] = field(default_factory=list)
    load: Counter[str] = field(default_factory=Counter)
    group_load: list[Counter[str]] = field(default_factory=list)

    def weight(self, g: int, partition: int, device: str) -> int:
        return weight(self.groups[g].dataset, partition, device)

    def add(self, g: int, partition: int, device: str) -> None:
        self.placed[g][partition].append(device)
        self.load[device] += 1
        self.group_load[g][device] += 1

    def remove(self, g: int, partition: int, device: str) -> None:
        self.placed[g][partition].remove(device)
        self.load[device] -= 1
        self.group_load[g][device] -= 1


def plan(groups: Sequence[Group], devices: Devices) -> list[dict[int, tuple[str, ...]]]:
    """Where each group's partitions should be, changing as little of where they are as the
    rules allow (module docstring). ``devices``: those that may hold partitions (a drained
    device is left out: its replicas go elsewhere). Per group, partition -> its devices,
    highest weight first."""
    domains = domains_of(devices)
    assert domains, "a plan needs a device"
    state = _Planning(list(groups), domains)
    for group in groups:
        assert group.replicas >= 1, group
        state.placed.append(
            {p: [d for d in held if d in domains] for p, held in group.holders.items()}
        )
        state.group_load.append(Counter())
    for g, placed in enumerate(state.placed):
        for held in placed.values():
            for device in held:
                state.load[device] += 1
                state.group_load[g][device] += 1
    for g in range(len(groups)):
        _trim(state, g)
    _fill(state)
    _balance(state)
    return [
        {
            p: tuple(sorted(held, key=lambda d, g=g, p=p: -state.weight(g, p, d)))
            for p, held in placed.items()
        }
        for g, placed in enumerate(state.placed)
    ]


def _trim(state: _Planning, g: int) -> None:
    """Drop replicas beyond the group's count (a move cut short leaves one extra) and those that
    keep a partition's replicas in fewer domains than the devices allow; ``_fill`` replaces
    the latter. The replica dropped first is the one whose leaving keeps the spread, on the
    most loaded device, of the lowest weight."""
    group = state.groups[g]
    target = best_spread(group.replicas, state.domains)
    for partition, held in state.placed[g].items():
        while len(held) > group.replicas or (
            held and not Spread.of(held, state.domains).covers(target)
        ):
            costs = {d: _drop_cost(state, g, partition, d) for d in held}
            dropped = min(held, key=costs.__getitem__)
            if len(held) <= group.replicas and costs[dropped][0]:
                break  # every replica spans a domain of its own: nothing to gain by dropping
            state.remove(g, partition, dropped)


def _drop_cost(state: _Planning, g: int, partition: int, device: str) -> tuple[bool, int, int]:
    """What dropping ``device``'s replica of a partition costs: whether it spans a domain no
    other replica does, then (lightest first) its device's load, then its weight."""
    held = state.placed[g][partition]
    rest = Spread.of([d for d in held if d != device], state.domains)
    return (
        not rest.covers(Spread.of(held, state.domains)),
        -state.load[device],
        state.weight(g, partition, device),
    )


def _fill(state: _Planning) -> None:
    """Give every partition short of its replicas, in order, the devices that rank highest for
    it: in a rack new to its replicas first, then on a new host, then any (domains before
    loads); within each, devices under their share of the group, then under their share of
    every replica placed, before those over it."""
    devices = len(state.domains)
    shares = [group.share(devices) for group in state.groups]
    short = sum(
        state.groups[g].replicas - len(held)
        for g, placed in enumerate(state.placed)
        for held in placed.values()
    )
    if not short:
        return
    share = math.ceil((sum(state.load.values()) + short) / devices)
    for g, placed in enumerate(state.placed):
        replicas = state.groups[g].replicas
        assert replicas <= devices, f"{replicas} replicas over {devices} devices"
        for partition in sorted(placed):
            held = placed[partition]
            while len(held) < replicas:
                best = min(
                    (d for d in state.domains if d not in held),
                    key=lambda d, g=g, p=partition, held=held: (
                        -apart(d, held, state.domains),
                        state.group_load[g][d] >= shares[g],
                        state.load[d] >= share,
                        -state.weight(g, p, d),
                    ),
                )
                state.add(g, partition, best)


def _balance(state: _Planning) -> None:
    """Even the devices' loads over every group: move a replica from a device to one holding at
    least two fewer (so each move evens them, and moves end), keeping the spread and the group's
    share; of the partitions that could go, the one ranking the lighter device above the heavier
    first, then the one ranking it highest."""
    devices = len(state.domains)
    shares = [group.share(devices) for group in state.groups]
    rounds_max = BALANCE_ROUNDS_PER_REPLICA * sum(state.load.values())
    for _ in range(rounds_max):
        move = _best_move(state, shares)
        if move is None:
            return
        g, partition, heavy, light = move
        state.remove(g, partition, heavy)
        state.add(g, partition, light)


def _best_move(state: _Planning, shares: list[int]) -> tuple[int, int, str, str] | None:
    """(group, partition, from, to) of the next balancing move, the widest gap between two
    devices' loads first; None once no two differ by two or more (or none can give)."""
    by_load = sorted(state.domains, key=lambda d: (state.load[d], d))
    held_by: dict[str, list[tuple[int, int]]] = {d: [] for d in state.domains}
    for g, placed in enumerate(state.placed):
        for p, held in placed.items():
            for d in held:
                held_by[d].append((g, p))
    gaps = sorted(
        ((state.load[h] - state.load[x], h, x) for h in by_load for x in by_load),
        key=lambda gap: (-gap[0], gap[1], gap[2]),
    )
    for gap, heavy, light in gaps:
        if gap < 2:
            return None
        best: tuple[tuple, int, int] | None = None
        for g, p in held_by[heavy]:
            held = state.placed[g][p]
            if light in held or state.group_load[g][light] >= shares[g]:
                continue
            before = Spread.of(held, state.domains)
            after = Spread.of([light if d == heavy else d for d in held], state.domains)
            if not after.covers(before):
                continue
            light_weight = state.weight(g, p, light)
            rank = (light_weight > state.weight(g, p, heavy), light_weight)
            if best is None or rank > best[0]:
                best = (rank, g, p)
        if best is not None:
            return best[1], best[2], heavy, light
    return None


class Sharing(StrEnum):
    """Why replicas of a partition share a domain."""

    HOSTS = "host"  # fewer hosts than replicas
    RACKS = "rack"  # fewer racks than replicas (racks labelled)
    MOVABLE = "movable"  # enough domains exist: ``quarry rebalance`` sets them apart


@dataclass(frozen=True)
class Shared:
    """Partitions of one replica count whose replicas share a domain, and why."""

    replicas: int
    why: Sharing
    partitions: int
    domains: int  # the hosts (or racks) there are

    def message(self) -> str:
        if self.why is Sharing.MOVABLE:
            return (
                f"{self.partitions} partition(s) of replicas {self.replicas} have replicas "
                "sharing a host or rack though enough exist: `quarry rebalance` sets them apart"
            )
        kind = str(self.why)
        plural = "s" if self.domains != 1 else ""
        return (
            f"replicas {self.replicas} but only {self.domains} {kind}{plural}: partitions share "
            f"a {kind}"
        )

    def to_json(self) -> dict[str, object]:
        return {
            "replicas": self.replicas,
            "why": str(self.why),
            "partitions": self.partitions,
            "domains": self.domains,
            "message": self.message(),
        }


def shared_domains(
    placements: Iterable[tuple[int, Sequence[str]]], domains: Mapping[str, Domain]
) -> list[Shared]:
    """Of (replicas, devices holding a partition) pairs, the partitions whose replicas share a
    host (or a rack, where racks are labelled), counted by replica count and why."""
    every = Spread.of(domains, domains)
    racked = any(d.rack for d in domains.values())
    short: Counter[tuple[int, Sharing]] = Counter()
    for replicas, held in placements:
        if replicas < 2:
            continue
        best = best_spread(replicas, domains)
        if not Spread.of([d for d in held if d in domains], domains).covers(best):
            short[(replicas, Sharing.MOVABLE)] += 1
        elif best.hosts < replicas:
            short[(replicas, Sharing.HOSTS)] += 1
        elif racked and best.racks < replicas:
            short[(replicas, Sharing.RACKS)] += 1
    count = {Sharing.HOSTS: every.hosts, Sharing.RACKS: every.racks, Sharing.MOVABLE: every.hosts}
    return [
        Shared(replicas, why, partitions, count[why])
        for (replicas, why), partitions in sorted(short.items())
    ]
