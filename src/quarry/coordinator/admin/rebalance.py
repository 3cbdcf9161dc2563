"""Rebalance: partitions moved, online, to where placement puts them now.

A device added, a device drained, hosts relabelled: ``placement.plan`` says where each
partition should be, starting from where it is, so only what must move moves (about 1/(N+1)
of the replicas for a device added to N). Each partition moves on its own, one after another,
at a bounded rate (a token bucket shared with nothing else, as repair's):

1. copy it to each device it goes to, slice by slice with its slice boundaries, from a replica
   (the device it leaves first), and commit it there (``repair.copy_partition``);
2. tell every device that will hold it which devices those are (``holders``): each answers
   whether it holds that ingest's partition, committed; the catalog then waits for those
   devices, not for the ones the ingest first chose;
3. only then take it off the devices it leaves (``retire``): out of their inventory at once,
   its rows kept a grace (``QUARRY_MOVED_KEEP_S``) for queries planned before the move.

So the devices never list a partition on fewer devices than its replica count: between 1 and
3 it is on one more. A query planned on the old placement that reaches the old device after
step 3 is refused at the door (its catalog generation changed) and planned again; one already
running there reads the rows the grace keeps. A rebalance cut short (the coordinator killed)
leaves a copy pending on its target, which the target drops when its lease ends, or a
partition on one device too many, which the next plan takes off again: run it again.

An erasure-coded dataset's stripe groups are placed as partitions of K + M replicas
(``StripedGroups``): a member moves only off a device its group leaves, onto one that holds no
member of the group, and its copy must hold the very bytes its parity was coded over.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from quarry.coordinator.admin.repair import (
    BANDWIDTH_BYTES_PER_S_DEFAULT,
    Bucket,
    copy_partition,
    record_of,
)
from quarry.coordinator.membership.placement import Group, plan
from quarry.errors import ClusterError, DatasetNotFound, QuarryError
from quarry.progress import Bar
from quarry.store import parity

if TYPE_CHECKING:
    from quarry.coordinator.membership.catalog import DatasetEntry, PartitionEntry
    from quarry.coordinator.membership.membership import Membership
    from quarry.protocol.control import IngestRecord

__all__ = ["BANDWIDTH_BYTES_PER_S_DEFAULT", "Move", "RebalanceReport", "planned", "rebalance"]


@dataclass(frozen=True)
class Move:
    """One replica of a partition moving: off ``source`` onto ``target``. A replica added
    where none leaves has no source; an extra one let go (a move cut short) no target."""

    dataset: str
    partition: int
    source: str | None
    target: str | None
    bytes_arrow: int  # what a copy carries

    def to_json(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "partition": self.partition,
            "from": self.source,
            "to": self.target,
            "bytes_arrow": self.bytes_arrow,
        }


@dataclass(frozen=True)
class MoveFailed:
    move: Move
    error: str

    def to_json(self) -> dict[str, Any]:
        return {**self.move.to_json(), "error": self.error}


@dataclass
class RebalanceReport:
    """What a rebalance planned and did: ``moved_fraction`` is the share of the cluster's
    replicas that moved (1/(N+1) is the least a device added to N needs)."""

    planned: list[Move] = field(default_factory=list)
    moved: list[Move] = field(default_factory=list)
    failed: list[MoveFailed] = field(default_factory=list)
    replicas: int = 0  # replicas the cluster held when it was planned
    bytes_copied: int = 0
    seconds: float = 0.0

    @property
    def moved_fraction(self) -> float:
        copied = sum(1 for m in self.moved if m.target is not None)
        return copied / self.replicas if self.replicas else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "planned": [m.to_json() for m in self.planned],
            "moved": [m.to_json() for m in self.moved],
            "failed": [f.to_json() for f in self.failed],
            "replicas": self.replicas,
            "moved_fraction": round(self.moved_fraction, 4),
            "bytes_copied": self.bytes_copied,
            "seconds": round(self.seconds, 3),
        }


@dataclass(frozen=True)
class PartitionPlan:
    """Where one partition is and where it goes."""

    entry: DatasetEntry
    partition: PartitionEntry
    ingest_id: str
    holders: tuple[str, ...]
    target: tuple[str, ...]

    @property
    def adds(self) -> list[str]:
        return [d for d in self.target if d not in self.holders]

    @property
    def drops(self) -> list[str]:
        return [d for d in self.holders if d not in self.target]

    def moves(self) -> list[Move]:
        adds, drops = self.adds, self.drops
        pairs = max(len(adds), len(drops))
        adds_or_none: list[str | None] = [*adds, *[None] * (pairs - len(adds))]
        drops_or_none: list[str | None] = [*drops, *[None] * (pairs - len(drops))]
        size = self.partition.bytes_arrow
        return [
            Move(self.entry.qualified, self.partition.partition, source, target, size)
            for source, target in zip(drops_or_none, adds_or_none, strict=True)
        ]


def planned(cluster: Membership) -> tuple[list[PartitionPlan], int]:
    """Every partition that moves (drained devices' first), from the catalog read anew; and
    the replicas the cluster holds. Every device must answer: one that does not may hold
    replicas the plan cannot see (start it, or remove it and repair)."""
    cluster.refresh()
    down = sorted(cluster.down)
    if down:
        raise ClusterError(
            f"device(s) {', '.join(down)} do not answer, and may hold partitions: start them "
            "(quarry device restart) or take them out (quarry device remove, then quarry repair) "
            "before a rebalance"
        )
    servers = sorted(n for n, info in cluster.info.items() if info.is_server)
    if servers:
        raise ClusterError(
            f"{', '.join(servers)} are storage servers: a rebalance moves partitions between "
            "devices the host talks to, not between the drives behind a server"
        )
    domains = {d: at for d, at in cluster.domains().items() if d not in cluster.drained}
    if not domains:
        raise ClusterError("every device is drained: no device is left to hold partitions")
    members: list[tuple[DatasetEntry, str, list[PartitionEntry]]] = []
    groups: list[Group] = []
    striped: list[StripedGroups] = []
    for entry in cluster.catalog.values():
        if entry.parity or entry.parity_lost:
            striped.extend(_striped(entry, len(domains)))
            continue
        for record, partitions in _by_ingest(entry):
            if record.replicas > len(domains):
                raise ClusterError(
                    f"{entry.qualified} keeps {record.replicas} replicas but only "
                    f"{len(domains)} device(s) would hold partitions: add a device first"
                )
            holders = {p.partition: tuple(p.devices) for p in partitions}
            groups.append(Group(entry.qualified, record.replicas, holders))
            members.append((entry, record.id, partitions))
    targets = plan([*groups, *(s.group for s in striped)], domains)
    plans = [
        PartitionPlan(entry, p, ingest_id, tuple(p.devices), target[p.partition])
        for (entry, ingest_id, partitions), target in zip(
            members, targets[: len(groups)], strict=True
        )
        for p in partitions
        if set(target[p.partition]) != set(p.devices)
    ]
    for stripes, target in zip(striped, targets[len(groups) :], strict=True):
        plans.extend(stripes.moves(target))
    drained = cluster.drained
    plans.sort(
        key=lambda m: (
            not drained & set(m.holders),
            m.entry.qualified,
            m.partition.partition,
        )
    )
    replicas = sum(len(p.devices) for entry, _, partitions in members for p in partitions)
    replicas += sum(len(p.devices) for s in striped for group in s.members for p in group)
    return plans, replicas


@dataclass(frozen=True)
class StripedGroups:
    """The stripe groups of one erasure-coded ingest, placed as one placement group whose
    "partitions" are its stripe groups and whose K + M "replicas" are their members' devices
    (as its ingest placed them): a plan keeps each group's members on K + M distinct devices,
    in distinct domains while enough exist, and moves only those that must move."""

    entry: DatasetEntry
    ingest_id: str
    group: Group
    members: list[list[PartitionEntry]]  # per stripe group: data then parity, in block order

    def moves(self, target: dict[int, tuple[str, ...]]) -> list[PartitionPlan]:
        """Each member off a device its group leaves, onto one the group takes that holds no
        member of it: two members never share a device, not even while one moves. A member
        on two devices (a move cut short) keeps one."""
        plans = []
        for index, members in enumerate(self.members):
            devices = list(target[index])
            assert len(devices) == len(members), (self.entry.qualified, devices, members)
            kept: dict[int, str] = {}
            for p in members:
                stays = next((d for d in p.devices if d in devices and d not in kept.values()), "")
                if stays:
                    kept[p.partition] = stays
            holding = {d for p in members for d in p.devices}
            free = sorted(
                (d for d in devices if d not in kept.values()), key=lambda d: d in holding
            )
            for p in members:
                goes = kept.get(p.partition) or free.pop(0)
                if tuple(p.devices) != (goes,):
                    plans.append(
                        PartitionPlan(self.entry, p, self.ingest_id, tuple(p.devices), (goes,))
                    )
        return sorted(plans, key=lambda plan: len(plan.adds))  # extra copies let go first


def _striped(entry: DatasetEntry, devices: int) -> list[StripedGroups]:
    """An erasure-coded dataset's stripe groups, ingest by ingest. One with a member lost
    (held by no device) is left where it is: ``quarry repair`` rebuilds the member first."""
    held = {p.partition: p for p in [*entry.partitions, *entry.parity] if not p.lost}
    found = []
    for record in entry.ingests:
        code = parity.parse(record.redundancy)
        if code is None or not record.stripes:
            continue
        members = [[held.get(n) for n in (*g.data, *g.parity)] for g in record.stripes]
        if any(p is None or not p.devices for group in members for p in group):
            continue
        if code.k + code.m > devices:
            raise ClusterError(
                f"{entry.qualified} is {code.text}: each stripe's {code.k + code.m} members on "
                f"as many devices, but only {devices} would hold partitions: add a device first"
            )
        whole = [[p for p in group if p is not None] for group in members]
        holders = {
            index: tuple(d for p in group for d in p.devices) for index, group in enumerate(whole)
        }
        group = Group(f"{entry.qualified}#stripes", code.k + code.m, holders)
        found.append(StripedGroups(entry, record.id, group, whole))
    return found


def _by_ingest(entry: DatasetEntry) -> Iterable[tuple[IngestRecord, list[PartitionEntry]]]:
    """The dataset's partitions by the ingest that placed them (each one placement group)."""
    found: dict[str, tuple[IngestRecord, list[PartitionEntry]]] = {}
    for p in entry.partitions:
        record = record_of(entry, p.partition)
        found.setdefault(record.id, (record, []))[1].append(p)
    return found.values()


def rebalance(
    cluster: Membership,
    bandwidth_bytes_per_s: float = BANDWIDTH_BYTES_PER_S_DEFAULT,
    dry_run: bool = False,
    progress: bool | None = None,
) -> RebalanceReport:
    """Move every partition placement says should be elsewhere (module docstring); with
    ``dry_run``, only say which would move. ``progress``: a bar of the bytes copied (None: on
    a terminal)."""
    started = time.perf_counter()
    plans, replicas = planned(cluster)
    report = RebalanceReport([m for p in plans for m in p.moves()], replicas=replicas)
    if dry_run:
        report.seconds = time.perf_counter() - started
        return report
    bucket = Bucket(bandwidth_bytes_per_s)
    total = sum(p.partition.bytes_arrow * len(p.adds) for p in plans)
    with Bar("rebalance", total, "bytes", progress) as bar:
        for partition_plan in plans:
            _move(cluster, partition_plan, bucket, bar, report)
    cluster.refresh()
    report.seconds = time.perf_counter() - started
    return report


def _move(
    cluster: Membership, move: PartitionPlan, bucket: Bucket, bar: Bar, report: RebalanceReport
) -> None:
    """One partition: copies first, then the holders told, then the devices it leaves let go;
    a step that fails leaves it where it is (perhaps on one device more) and says so."""
    entry, p = move.entry, move.partition
    moves = move.moves()
    sources = [d for d in (*move.drops, *move.holders) if d not in cluster.down]
    copied: list[str] = []
    try:
        for target in move.adds:
            report.bytes_copied += copy_partition(
                cluster,
                entry,
                p,
                target,
                bucket,
                source=sources[0] if sources else None,
                holders=list(move.target),
                copied_bytes=bar.advance,
            )
            copied.append(target)
        if p.stripe is not None and sources:
            _same_bytes(cluster, move, sources[0], copied)
        for device in move.target:
            held = cluster.devices[device].holders(
                entry.domain, entry.name, p.partition, move.ingest_id, list(move.target)
            )
            if not held:
                raise QuarryError(
                    f"device {device} does not hold partition {p.partition} of "
                    f"{entry.qualified} committed: it stays where it was; rebalance again"
                )
        for device in move.drops:
            cluster.devices[device].retire(entry.domain, entry.name, p.partition, move.ingest_id)
    except QuarryError as error:
        _orphans_gone(cluster, move, copied)
        report.failed.extend(MoveFailed(m, str(error)) for m in moves)
        return
    report.moved.extend(moves)


def _same_bytes(cluster: Membership, move: PartitionPlan, source: str, copies: list[str]) -> None:
    """A stripe member's copies hold the very bytes its stripe's parity was coded over: each
    slice's length and checksums as on the device it leaves (a paired assertion: parity over
    other bytes would rebuild garbage, which the checksums would then refuse). A copy that
    does not is let go of at once."""
    entry, p = move.entry, move.partition

    def slices(device: str) -> list[tuple[int, list[int] | None]]:
        described = cluster.devices[device].describe(entry.domain, entry.name, p.partition)
        return [(s.bytes_stored, s.checksums) for s in described.slices]

    expected = slices(source)
    for copy in copies:
        if slices(copy) != expected:
            cluster.devices[copy].retire(entry.domain, entry.name, p.partition, move.ingest_id)
            raise QuarryError(
                f"the copy of partition {p.partition} of {entry.qualified} on {copy} does not "
                f"hold the bytes its {entry.redundancy} stripe was coded over: it stays on {source}"
            )


def _orphans_gone(cluster: Membership, move: PartitionPlan, copied: list[str]) -> None:
    """Copies committed for a partition its holders no longer hold (its dataset dropped while
    it moved) go too: left, they would keep the name from being ingested again there."""
    entry, p = move.entry, move.partition
    for device in move.holders:
        try:
            held = cluster.devices[device].describe(entry.domain, entry.name, p.partition)
        except DatasetNotFound:
            continue
        except QuarryError:
            return  # it does not answer: it may hold it still
        if held.summary.ingest.id == move.ingest_id:
            return  # still held where it was: the copies are replicas more, not orphans
    for device in copied:
        with contextlib.suppress(QuarryError):
            cluster.devices[device].retire(entry.domain, entry.name, p.partition, move.ingest_id)
