"""EXPLAIN and EXPLAIN ANALYZE of a query, as records: the cut, the cost model's choice, and
afterwards what each device did (its decisions, slices, rows and bytes read and shipped, CPU
seconds) and where the time went; EXPLAIN VERBOSE adds the rules that fired, in order, each
with the cut it left (``rules``).

``Query.explain`` returns an ``Explain``; the CLI reads its attributes and prints its
``to_json()`` for ``--format json``. The JSON is the records' fields, in order (``records``):
docs/explain.md shows it whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from quarry.coordinator.dispatch.report import DeviceRow, Levels, WorkReport, per_device, per_level
from quarry.coordinator.query.timing import QueryTime
from quarry.cost.model import Choice, SubPlanFigures
from quarry.plan.explain import PlanExplain, RuleFired
from quarry.protocol.stage import Stage
from quarry.pushdown import Pushdown
from quarry.records import Record, spread, unless_empty

if TYPE_CHECKING:
    from quarry.coordinator.query.host_admission import Slot


@dataclass(frozen=True)
class CutChosen(Record):
    """Where ``auto`` starts a fragment: the cut, the sampled figures the cost model priced it
    with and its estimate for every cut it weighed."""

    cut: Stage
    figures: SubPlanFigures
    estimates_s: Mapping[Stage, float]
    # the devices settled elsewhere in the last run: the model's own cut, and why it differs
    model_cut: Stage | None = unless_empty()
    started: str | None = unless_empty()
    runs_as: str | None = unless_empty()  # read by the host as a scan, no work exchange

    @classmethod
    def of(cls, choice: Choice) -> CutChosen:
        estimates_s = {cut: round(e.seconds, 6) for cut, e in choice.estimates.items()}
        return cls(choice.cut, choice.figures, estimates_s)


@dataclass(frozen=True)
class JoinFilterShown(Record):
    """A join whose build keys cut its probe fragment on the devices; once run, what it sent."""

    filter: str
    outcome: str | None = unless_empty()


@dataclass(frozen=True)
class HostTurn(Record):
    """The query's turn on the host (``host_admission``): long queries take turns."""

    long: bool
    waited_s: float

    @classmethod
    def of(cls, slot: Slot) -> HostTurn:
        return cls(slot.long, round(slot.waited_s, 4))


@dataclass(frozen=True, kw_only=True)
class Analyze(Record):
    """What the run did: per level through storage servers, per device, per partition, and the
    host's side."""

    levels: Levels | None = unless_empty()  # None on a flat cluster
    devices: tuple[DeviceRow, ...]
    # the dispatch's own reports, one per device and partition, as they stood when asked
    partitions: tuple[WorkReport, ...]
    bytes_shipped: int  # to the host, every device
    bytes_read: int
    bytes_cached: int = 0  # of those, from the devices' column caches (``device.column_cache``)
    host_cpu_s: float
    host_decode_s: float  # of which decompressing raw slices that came as stored (POLARDB §3.2)
    wall_s: float
    rows: int
    super_plan_rerun: str | None = unless_empty()  # a join did not fit: why it ran again
    host_turn: HostTurn | None = unless_empty()
    time: QueryTime


@dataclass(frozen=True, kw_only=True)
class Explain(Record):
    """A query's EXPLAIN: its cut (spread into the JSON beside the rest), the cut as text,
    where ``auto`` starts each fragment, the joins that cut a fragment by keys, the rules
    that fired (EXPLAIN VERBOSE) and, with ANALYZE, what the run did."""

    query: str
    cut: PlanExplain = spread()
    plan: str  # the cut as text (``Decomposition.explain``)
    cost_model: Mapping[str, CutChosen] = unless_empty(default_factory=dict)  # under auto
    join_filters: tuple[JoinFilterShown, ...]
    rules: tuple[RuleFired, ...] = unless_empty(())
    analyze: Analyze | None = unless_empty()

    @property
    def pushdown(self) -> Pushdown:
        return self.cut.pushdown


def analyze(
    reports: Iterable[WorkReport],
    host_cpu_s: float,
    wall_s: float,
    rows: int,
    time: QueryTime,
    servers: Iterable[str] = (),
    super_plan_rerun: str | None = None,
    host_turn: HostTurn | None = None,
) -> Analyze:
    """EXPLAIN ANALYZE's section, from every device's report and the host's clocks."""
    partitions = tuple(replace(r) for r in sorted(reports, key=lambda r: (r.label, r.partition)))
    return Analyze(
        levels=per_level(list(partitions), servers),
        devices=per_device(partitions),
        partitions=partitions,
        bytes_shipped=sum(r.counters.bytes_shipped for r in partitions),
        bytes_read=sum(r.counters.bytes_read for r in partitions),
        bytes_cached=sum(r.counters.bytes_cached for r in partitions),
        host_cpu_s=host_cpu_s,
        host_decode_s=sum(r.decode_s for r in partitions),
        wall_s=wall_s,
        rows=rows,
        super_plan_rerun=super_plan_rerun,
        host_turn=host_turn,
        time=time,
    )
