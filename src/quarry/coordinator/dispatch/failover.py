"""Failover: when a device stops answering mid-work, the rest goes to a replica, counted once.

The host knows exactly what of a task it already holds: the output of every chunk the device
marked done (``ChunkDone``, for units whose chunks carry no state), every pushed-back range it
fetched and completed itself, and everything once the device's last word (``WorkDone``) came.
Output that came after the last mark is thrown away. The rest of each partition is sent to the
partition's next replica that answers, with what is done listed as ``elsewhere`` so it is not
run twice (Ceph's replicas, Exadata's rule: a failing cell never changes an answer).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

from quarry.coordinator.dispatch.report import WorkReport
from quarry.coordinator.membership.device_client import DeviceClient
from quarry.errors import CorruptSlice, DeviceUnavailable
from quarry.protocol.work import PartitionRange, WorkRequest, ranges_of


class Movable(Protocol):
    """What failover needs of a dispatch ``Task`` (a dataclass: moved with ``replace``)."""

    client: DeviceClient
    request: WorkRequest
    replicas: dict[int, list[DeviceClient]]
    failovers: int
    __dataclass_fields__: dict[str, Any]


T = TypeVar("T", bound=Movable)

FAILOVERS_PER_TASK_MAX = 8  # a task moves at most this often (every replica dead: give up)


@dataclass
class Progress:
    """The slices of each partition whose whole output the host holds (counted once)."""

    started: float = field(default_factory=time.perf_counter)
    done: dict[int, set[int]] = field(default_factory=dict)

    def add(self, partition: int, first: int, end: int) -> None:
        self.done.setdefault(partition, set()).update(range(first, end))

    def ranges(self, partition: int) -> list[PartitionRange]:
        return [
            PartitionRange(partition, r.first, r.end)
            for r in ranges_of(sorted(self.done.get(partition, ())))
        ]


class DeviceLost(Exception):
    """A task's device stopped answering, or read a damaged copy (``CorruptSlice``: the rest
    goes to a replica all the same); ``progress`` is what the host already holds."""

    def __init__(self, error: DeviceUnavailable | CorruptSlice, progress: Progress):
        super().__init__(str(error))
        self.error = error
        self.progress = progress


def resume(task: T, lost: DeviceLost, dead: set[str], reports: dict[int, WorkReport]) -> list[T]:
    """The tasks that finish ``task`` on replicas: one per replica, for the partitions it holds.
    Raises the device's error, naming it and the partition, when a partition has no replica
    left (replicas = 1: the query fails at once, as it must)."""
    failed = task.client.name
    dead.add(failed)
    if task.failovers >= FAILOVERS_PER_TASK_MAX:
        raise lost.error
    moved: dict[str, tuple[DeviceClient, list[int]]] = {}
    for partition in task.request.partitions:
        replica = next((c for c in task.replicas.get(partition, ()) if c.name not in dead), None)
        if replica is None and isinstance(lost.error, CorruptSlice):
            raise CorruptSlice(
                f"{lost.error}; no other replica of partition {partition} of "
                f"{task.request.domain}/{task.request.dataset} holds a good copy to read instead"
            ) from None
        if replica is None:
            raise DeviceUnavailable(
                f"device {failed} stopped answering while running {task.request.unit} on "
                f"partition {partition} of {task.request.domain}/{task.request.dataset}, and no "
                f"other replica of it answers: {lost.error}"
            ) from None
        moved.setdefault(replica.name, (replica, []))[1].append(partition)
    after_s = time.perf_counter() - lost.progress.started
    resumed = []
    for replica, partitions in moved.values():
        done = [r for p in partitions for r in lost.progress.ranges(p)]
        request = replace(
            task.request,
            partitions=tuple(partitions),
            elsewhere=task.request.elsewhere + tuple(done),
        )
        for partition in partitions:
            if partition in reports:
                reports[partition].failovers.append(
                    {
                        "from": failed,
                        "to": replica.name,
                        "slices_done_before": sum(
                            r.end - r.first for r in lost.progress.ranges(partition)
                        ),
                        "after_s": round(after_s, 3),
                        "error": str(lost.error),
                    }
                )
        resumed.append(replace(task, client=replica, request=request, failovers=task.failovers + 1))
    return resumed
