"""A sample of a stored dataset, drawn on the devices: every k-th row of every slice.

The unit of work ``sample`` (``quarry.device.units.sample``) through the one host dispatch, one
task per partition; a slice a device pushes back is sampled on the host the same way, so the
rows do not depend on where they were drawn. This is how a program's sampling phase reads a
fraction of its input (ActivePy §III.A) without shipping the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from quarry.coordinator.dispatch.dispatch import Dispatch
from quarry.coordinator.dispatch.report import WorkReport
from quarry.coordinator.query.fragments import Forced
from quarry.coordinator.query.planning import partition_task
from quarry.device.unit import host_context
from quarry.device.units.sample import SampleArgs, SampleUnit
from quarry.errors import DeviceUnavailable
from quarry.protocol.stage import Stage
from quarry.protocol.work import ForcedDecision, WorkRequest
from quarry.pushdown import Pushdown

if TYPE_CHECKING:
    from quarry.coordinator.membership.membership import Membership

WORKERS_PER_DEVICE = 2
QUEUE_BATCHES_MAX = 16


@dataclass
class Sample:
    table: pa.Table
    reports: list[WorkReport]  # what each device did, per partition

    @property
    def bytes_shipped(self) -> int:
        return sum(r.counters.bytes_shipped for r in self.reports)


# the devices draw the sample, or the host draws it from raw slices: no cost model prices a
# sample (no auto), and no mode of its own hands slices back (no server)
SAMPLE_MODES = frozenset({Pushdown.NEVER, Pushdown.ALWAYS})


def sample(
    cluster: Membership,
    dataset: str,
    every: int,
    pushdown: Pushdown | str = Pushdown.ALWAYS,
    decisions: Forced | None = None,
) -> Sample:
    """Every ``every``-th row of every slice of ``dataset``, counted from each slice's first.
    ``decisions`` forces push-back per (dataset, partition) as for SQL."""
    host_only = Pushdown.parse(pushdown, SAMPLE_MODES) is Pushdown.NEVER
    entry = cluster.entry(dataset)
    if entry.unavailable:
        raise DeviceUnavailable(entry.unavailable_message())
    args = SampleArgs(every=every, schema=entry.schema).to_json()
    tasks = []
    for p in entry.partitions:
        if not p.rows:
            continue
        forced = tuple(
            ForcedDecision(p.partition, int(d["first"]), int(d["end"]), Stage(d["stage"]))
            for d in (decisions or {}).get((entry.qualified, p.partition), ())
        )
        request = WorkRequest(
            unit=SampleUnit.NAME,
            domain=entry.domain,
            dataset=entry.name,
            partitions=(p.partition,),
            forced=forced,
            args=args,
        )
        host = SampleUnit(request, b"", host_context())
        tasks.append(partition_task(cluster, entry, p, request, host, host_only=host_only))
    dispatch = Dispatch()
    workers = WORKERS_PER_DEVICE * len(cluster.live_devices())
    batches = list(dispatch.run(tasks, workers, QUEUE_BATCHES_MAX, "quarry-sample"))
    return Sample(pa.Table.from_batches(batches, schema=entry.schema), dispatch.sorted_reports())
