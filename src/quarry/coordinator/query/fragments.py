"""A query fragment as work for the devices: one ``substrait`` task per device.

Each task carries the fragment's three stages (the device decides how far to run them), the
zone-map predicates, the decisions a caller forces, and, under ``auto``, what the cost model
told that device of the host's costs. On the host the same unit completes whatever comes back.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from quarry.coordinator.dispatch.dispatch import Task
from quarry.coordinator.query.planning import Cuts, replicas_of, serving
from quarry.device.unit import host_context
from quarry.device.units.substrait import (
    KeyFilter,
    SubstraitArgs,
    SubstraitUnit,
    stages_payload,
)
from quarry.plan.decompose import Fragment
from quarry.plan.statistics import SliceStatistic
from quarry.plan.superplan import COMPLETION_GROUP_BYTES_MAX
from quarry.protocol.stage import Stage
from quarry.protocol.work import ForcedDecision, Policy, WorkRequest
from quarry.pushdown import Pushdown

if TYPE_CHECKING:
    from quarry.coordinator.membership.catalog import PartitionEntry
    from quarry.coordinator.membership.membership import Membership

# forced decisions per (dataset, partition): [{"first": 0, "end": 3, "stage": "raw"}, ...]
Forced = dict[tuple[str, int], list[dict[str, Any]]]


def device_stages(fragment: Fragment) -> tuple[dict[Stage, bytes], pa.Schema, Stage | None]:
    """The stages a device gets, the schema of its stream, and the stage from which the host
    completes that stream (None: the device runs the whole fragment)."""
    stages = {Stage(name): data for name, data in fragment.stages.items()}
    if Stage.FULL in fragment.device_stages:
        return stages, fragment.output_schema, None
    # A device that can only filter streams the filter stage; the host completes it.
    stages[Stage.FULL] = stages[Stage.FILTER]
    return stages, fragment.raw_schema, Stage.FILTER


def fragment_tasks(
    cluster: Membership,
    fragment: Fragment,
    pushdown: Pushdown,
    query_id: str,
    cuts: Cuts,
    forced: Forced | None = None,
    options: dict[str, Any] | None = None,
    key_sets: Sequence[tuple[int, bytes]] = (),
    only: Collection[int] | None = None,
    distinct: bool = False,
) -> list[Task]:
    """One task per device, for the non-empty partitions it serves (an empty partition has no
    slices): one stream each, whose partitions the device runs at once, one per core (a
    stream costs a device about 7 ms of CPU; TPC-H Q6 at SF 1 over 16 partitions on 4 devices
    took 0.23 s as 16 streams, 0.18 s as 4). ``key_sets``: (output column, encoded keys) a join
    cuts the fragment's output by (``join_keys``); ``only``: these partitions, no others (a
    scale-out engine's read task asks for one); ``distinct``: its devices may drop repeated
    rows (``plan.repeats``)."""
    entry = cluster.entry(fragment.dataset)
    stages, output_schema, complete_from = device_stages(fragment)
    host_stages = {Stage(name): data for name, data in fragment.stages.items()}
    options = options or {}
    # a device that can only filter streams the filter stage: no unfiltered "full" for it, and
    # nothing answered from statistics (its output is rows, not the aggregate)
    unfiltered = fragment.unfiltered if complete_from is None else b""
    statistics = fragment.statistics if complete_from is None and not key_sets else ()
    args = _args(
        fragment, stages, output_schema, key_sets, unfiltered, statistics, distinct
    ).to_json()
    payload = stages_payload(stages, [data for _, data in key_sets], unfiltered)
    partitions = [p for p in entry.partitions if p.rows and (only is None or p.partition in only)]
    if not partitions:
        return []
    host = _host_unit(entry.domain, entry.name, fragment, host_stages, key_sets)
    # the host reads the slices: under never, and where the model starts a short fragment raw
    # (``planning.scans_raw``) unless a join's key sets or forced decisions need the devices
    scanned = pushdown is Pushdown.NEVER or (
        fragment.name in cuts.scans
        and not key_sets
        and not any(dataset == fragment.dataset for dataset, _ in (forced or {}))
    )
    # rows few enough for one engine run on the host: completed together (``Task.complete_once``)
    once = scanned and sum(p.bytes_arrow for p in partitions) <= COMPLETION_GROUP_BYTES_MAX
    held: dict[str, list[PartitionEntry]] = {}
    served = serving(cluster, entry)
    for p in partitions:
        held.setdefault(served[p.partition], []).append(p)
    tasks = []
    for device, mine in held.items():
        request = WorkRequest(
            unit=SubstraitUnit.NAME,
            domain=entry.domain,
            dataset=entry.name,
            partitions=tuple(p.partition for p in mine),
            forced=tuple(
                f
                for p in mine
                for f in _forced_for(pushdown, p.partition, p.slices, forced, fragment.dataset)
            ),
            host=cuts.host_cost(fragment.name, device),
            policy=Policy.from_json(options.get("policy") or {}),
            query_id=f"{query_id}/{fragment.name}",
            trace=bool(options.get("trace")),
            chunk_slices=options.get("chunk_slices"),
            args=args,
        )
        tasks.append(
            Task(
                client=cluster.devices[device],
                request=request,
                host=host,
                payload=payload,
                label=fragment.name,
                host_only=scanned,
                complete_once=once,
                complete_output_from=complete_from,
                replicas={p.partition: replicas_of(cluster, p, device) for p in mine},
                stored_raw=entry.compression != "none",
                verified=frozenset(p.partition for p in mine if p.verified),
            )
        )
    return tasks


def _host_unit(
    domain: str,
    dataset: str,
    fragment: Fragment,
    stages: dict[Stage, bytes],
    key_sets: Sequence[tuple[int, bytes]],
) -> SubstraitUnit:
    """The host completes with the whole fragment, whatever the devices were sent; the unit
    keeps no state between ranges, so one serves every task of the fragment."""
    request = WorkRequest(
        unit=SubstraitUnit.NAME,
        domain=domain,
        dataset=dataset,
        partitions=(0,),
        args=_args(fragment, stages, fragment.output_schema, key_sets).to_json(),
    )
    payload = stages_payload(stages, [data for _, data in key_sets])
    return SubstraitUnit(request, payload, host_context())


def _args(
    fragment: Fragment,
    stages: dict[Stage, bytes],
    output: pa.Schema,
    key_sets: Sequence[tuple[int, bytes]] = (),
    unfiltered: bytes = b"",
    statistics: tuple[SliceStatistic, ...] = (),
    distinct: bool = False,
) -> SubstraitArgs:
    return SubstraitArgs(
        raw_bytes=len(stages[Stage.RAW]),
        filter_bytes=len(stages[Stage.FILTER]),
        full_bytes=len(stages[Stage.FULL]),
        output_schema=output,
        raw_schema=fragment.raw_schema,
        predicates=tuple(fragment.predicates),
        key_filters=tuple(KeyFilter(column, len(data)) for column, data in key_sets),
        unfiltered_bytes=len(unfiltered),
        statistics=statistics,
        distinct=distinct,
    )


def _forced_for(
    pushdown: Pushdown, partition: int, slices: int, forced: Forced | None, dataset: str
) -> tuple[ForcedDecision, ...]:
    """The decisions a partition's device must take: the caller's, and under ``server`` every
    slice handed back raw first (the caller's, later, override it range by range)."""
    given = _forced(partition, (forced or {}).get((dataset, partition)))
    if pushdown is not Pushdown.SERVER or not slices:
        return given
    return (ForcedDecision(partition, 0, slices, Stage.RAW), *given)


def _forced(partition: int, decisions: list[dict[str, Any]] | None) -> tuple[ForcedDecision, ...]:
    return tuple(
        ForcedDecision(
            partition,
            int(d["first"]),
            int(d["end"]),
            Stage(d["stage"]),
            to_host=bool(d.get("to_host", False)),
        )
        for d in decisions or ()
    )
