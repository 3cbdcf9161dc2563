"""One partition of a row-local query: what a scale-out engine's read task asks for.

A distributed dataframe engine (Ray Data, ``quarry.ray``) reads a dataset as one task per
partition, each on a worker of its own. A task asks for its partition's rows of
``SELECT columns FROM dataset WHERE predicate``: the same plan as any query (the devices run
the filter and the projection next to the data and may push back, the host side completes),
restricted to the one partition. Only row-local queries are cut this way: a query whose answer
depends on other partitions (an aggregate, a join, an ORDER BY, a LIMIT) is refused, since one
partition's share of it is not a part of its answer.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from quarry.coordinator.dispatch.dispatch import Dispatch
from quarry.coordinator.query import planning
from quarry.coordinator.query.fragments import fragment_tasks
from quarry.errors import QueryError
from quarry.plan.passthrough import passthrough_fragment
from quarry.plan.rowwise import rowwise_fragment
from quarry.plan.superplan import run_super
from quarry.protocol.counters import WorkCounters
from quarry.pushdown import Pushdown

if TYPE_CHECKING:
    from quarry.coordinator.membership.membership import Membership

STREAM_BATCHES_MAX = 16


@dataclass
class PartitionRead:
    """A partition's rows as they stream, and, once read, what moved to bring them."""

    schema: pa.Schema
    batches: Iterator[pa.RecordBatch]
    dispatch: Dispatch

    def moved(self) -> WorkCounters:
        """What the device did to bring them, every work counter (bytes it shipped and read off
        its store, slices it ran or handed back), read after the batches are exhausted."""
        return WorkCounters.sum(r.counters for r in self.dispatch.sorted_reports())


def read_partition(
    cluster: Membership, sql: str, partition: int, pushdown: Pushdown | str = Pushdown.ALWAYS
) -> PartitionRead:
    """The rows of ``sql`` (one table, row-local) over one partition of it."""
    pushdown = Pushdown.parse(pushdown)
    decomposition = planning.plan(cluster, sql, pushdown)
    # the host only streams what comes, or filters and projects it batch by batch
    fragment = passthrough_fragment(decomposition) or rowwise_fragment(decomposition)
    if fragment is None:
        raise QueryError(
            "a partition can be read for a query over one dataset that filters and projects "
            f"rows only (no aggregate, join, order or limit): {sql}"
        )
    cuts = planning.Cuts()
    tasks = fragment_tasks(cluster, fragment, pushdown, uuid.uuid4().hex, cuts, only={partition})
    dispatch = Dispatch()
    rows = dispatch.run(tasks, 1, STREAM_BATCHES_MAX, "quarry-partition")
    result = run_super(decomposition, {fragment.name: rows}, pace=planning.host_pace())
    return PartitionRead(result.schema, iter(result), dispatch)
