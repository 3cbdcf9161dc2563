"""A query's plan on the host: the cut into super-plan and sub-plans, and where each starts.

``plan`` decomposes the SQL against the catalog, for what the devices holding each dataset can
evaluate (the intersection of their profiles). Under ``pushdown="auto"`` ``choose_cuts`` then
asks the one cost model (ActivePy Eq. 1 over calibrated figures, each device's load and one
sampled slice) where each fragment should start: ``full``, ``filter`` or ``raw``; the devices
adapt from there at run time.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from quarry.coordinator.dispatch.dispatch import Task
from quarry.coordinator.query.cost_inputs import device_figures, sample_subplan, value_spans
from quarry.coordinator.query.explain import CutChosen
from quarry.coordinator.query.selectivity import SampledSelectivity
from quarry.coordinator.query.settled_cuts import Key
from quarry.coordinator.reads.degraded import Rebuilder
from quarry.cost.model import Choice, HostFigures, SubPlanFigures, choose
from quarry.cost.told import told
from quarry.device.unit import Unit, host_emulator
from quarry.errors import DeviceUnavailable, ExecutionError
from quarry.plan import engine
from quarry.plan.capabilities import per_dataset
from quarry.plan.decompose import (
    Decomposition,
    DecompositionRules,
    Fragment,
    decompose,
    rewritten,
)
from quarry.plan.errors import UnknownTable
from quarry.plan.join_filters import JoinFilter, join_filters
from quarry.plan.rules.read_once import read_once
from quarry.plan.rules.split_alike_by_join_keys import split_alike_by_join_keys
from quarry.plan.superplan import HostPace
from quarry.protocol.control import LoadStatus
from quarry.protocol.stage import Stage
from quarry.protocol.work import HostCost, Policy, WorkRequest
from quarry.pushdown import Pushdown

if TYPE_CHECKING:
    from quarry.coordinator.membership.catalog import DatasetEntry, PartitionEntry
    from quarry.coordinator.membership.freshness import CatalogState
    from quarry.coordinator.membership.membership import Membership

FIGURES_CACHE_MAX = 256


def plan(
    cluster: Membership, sql: str, pushdown: Pushdown, state: CatalogState | None = None
) -> Decomposition:
    """The largest cut the devices can take (``auto`` plans as ``always`` and starts lower),
    over the catalog as ``state`` holds it (the current one by default); kept per catalog
    version (``plan_cache``), so a repeated query is not cut again.

    ``never`` plans the same cut for the host alone: devices ship raw slices and the host runs
    each sub-plan over them as they arrive, so the super-plan merges partial aggregates and
    top-k's instead of holding every raw row (the same work, in bounded memory)."""
    state = state or cluster.state  # one catalog for the whole cut
    key = (sql, pushdown, state.version)
    try:
        estimate = SampledSelectivity(cluster, state.catalog)
        return cluster.plans.get(
            key, lambda: _decompose(state.catalog, state.info, sql, pushdown, estimate)
        )[0]
    except UnknownTable as error:
        if cluster.down:  # a small table lives on few devices
            down = ", ".join(sorted(cluster.down))
            raise UnknownTable(f"{error}\n({down} do not answer: they may hold it)") from None
        raise


def _decompose(
    catalog: dict[str, DatasetEntry],
    info: dict[str, Any],
    sql: str,
    pushdown: Pushdown,
    selectivity: SampledSelectivity | None = None,
) -> Decomposition:
    tables = {name: entry.schema for name, entry in catalog.items()}
    capabilities = None
    if pushdown is not Pushdown.NEVER:
        holders = {
            name: [d for p in entry.partitions for d in p.devices]
            for name, entry in catalog.items()
        }
        kinds = {name: hello.profile.capabilities for name, hello in info.items()}
        capabilities = per_dataset(holders, kinds)
    decomposition = decompose(
        sql,
        tables,
        pushdown=Pushdown.ALWAYS,  # every mode runs the largest cut; the mode says where
        capabilities=capabilities,
        selectivity=selectivity,
        decomposition_rules=(),  # which alike reads share depends on the join pairs: shared
    )
    return replace(decomposition, pushdown=pushdown)


def shared(
    cluster: Membership, decomposition: Decomposition, cut_by_keys: bool
) -> tuple[Decomposition, tuple[JoinFilter, ...]]:
    """The decomposition after ``shared_rules`` (alike fragments read once, unless a join's
    keys cut their reads apart), and the join pairs that cut it. The catalog decides which
    fragments a join's keys cut (``_pairs_of``); the rules decide the rewrite. Without
    ``cut_by_keys``, every alike group is read once."""
    if not cut_by_keys:
        return rewritten(decomposition, (read_once,)), ()
    found: dict[tuple[bytes, tuple[str, ...]], tuple[JoinFilter, ...]] = {}

    def pairs(candidate: Decomposition) -> tuple[JoinFilter, ...]:
        # the rule and this function ask of the same decomposition: found once
        key = (candidate.super_plan, tuple(f.name for f in candidate.fragments))
        if key not in found:
            found[key] = _pairs_of(cluster, candidate)
        return found[key]

    kept = rewritten(decomposition, shared_rules(lambda d: {pair.probe for pair in pairs(d)}))
    return kept, pairs(kept)


def shared_rules(cut_by: Callable[[Decomposition], Collection[str]]) -> DecompositionRules:
    """In order: keep apart the alike reads a join's keys cut (``cut_by``: the fragments they
    cut), then read the alike groups left once."""
    return (split_alike_by_join_keys(cut_by), read_once)


def _pairs_of(cluster: Membership, decomposition: Decomposition) -> tuple[JoinFilter, ...]:
    if len(decomposition.fragments) < 2:
        return ()
    rows = {name: entry.rows for name, entry in cluster.catalog.items()}
    return join_filters(
        decomposition, rows, kept_rows(cluster, decomposition), spans(cluster, decomposition)
    )


def device_for(cluster: Membership, entry: DatasetEntry, partition: PartitionEntry) -> str:
    """The replica that serves a partition (``serving``; a lost erasure-coded one: its device,
    which dispatch finds dead and leaves for the partition's stripe)."""
    return serving(cluster, entry)[partition.partition]


def serving(cluster: Membership, entry: DatasetEntry) -> dict[int, str]:
    """Per partition, the replica that serves it, evening out the bytes each device serves: of
    the replicas that answer, the one with the fewest bytes so far, partitions taken largest
    first (ties: placement order); then partitions move off the most loaded device, along
    chains of their replicas, while that lowers it (``_moved``). The first replica by name
    served every partition it held before: with replicas 2 over three devices on 100 Mbit/s
    links, host-only read all 160 MB of a table from one device, at a third of the three
    links' rate (13.5 s against 4.3 s link-bound). The same catalog always gives the same
    answer (kept plans and the cost model's cut agree)."""
    load = dict.fromkeys(cluster.devices, 0)
    chosen: dict[int, str] = {}
    live: dict[int, list[str]] = {}
    largest_first = sorted(entry.partitions, key=lambda p: (-p.bytes_stored, p.partition))
    for p in largest_first:
        live[p.partition] = [name for name in p.devices if name not in cluster.down]
        if not live[p.partition] and p.stripe is not None and p.devices:
            chosen[p.partition] = p.devices[0]  # rebuilt on the host from its stripe
            continue
        if not live[p.partition]:
            raise DeviceUnavailable(
                f"no replica of partition {p.partition} of {entry.qualified} answers "
                f"(held by {', '.join(p.devices)})"
            )
        holders = live[p.partition]
        device = min(holders, key=lambda name: (load.get(name, 0), holders.index(name)))
        load[device] = load.get(device, 0) + p.bytes_stored
        chosen[p.partition] = device
    # Greedy leaves some uneven (partitions of 10.5, 10.5, 9.6 and 9.5 MB on four drives went
    # 2/1/1/0): moves off the most loaded device follow, each bounded and each lowering the
    # loads it touches below that device's, so they end.
    for _ in range(len(largest_first) * len(load)):
        if not _moved(largest_first, live, chosen, load):
            break
    return chosen


Move = tuple[str, str, int, int]  # from, to, partition, its bytes


def _moved(
    partitions: list[PartitionEntry],
    live: dict[int, list[str]],
    chosen: dict[int, str],
    load: dict[str, int],
) -> bool:
    """Move a chain of partitions off the most loaded device, each to another of its replicas,
    such that every device the chain touches ends below that device's load (a breadth-first
    search over devices); whether one was found."""
    top = max(sorted(load), key=lambda name: load[name])
    ceiling = load[top]
    chains: dict[str, list[Move]] = {top: []}
    frontier = [top]
    while frontier:
        device = frontier.pop(0)
        for p in partitions:
            if chosen[p.partition] != device:
                continue
            for other in live[p.partition]:
                if other in chains:
                    continue
                chain = [*chains[device], (device, other, p.partition, p.bytes_stored)]
                after = dict(load)
                for source, target, _, size in chain:
                    after[source] -= size
                    after[target] = after.get(target, 0) + size
                if all(after[d] < ceiling for move in chain for d in move[:2]):
                    for _, target, partition, _ in chain:
                        chosen[partition] = target
                    load.update(after)
                    return True
                chains[other] = chain
                frontier.append(other)
    return False


def replicas_of(cluster: Membership, partition: PartitionEntry, chosen: str) -> list[Any]:
    """The other replicas of a partition, in placement order: where its work goes if the
    chosen device stops answering mid-way (or reads a damaged copy). An erasure-coded data
    partition's last is its stripe, rebuilt on the host (``reads/degraded.py``)."""
    others: list[Any] = [
        cluster.devices[name]
        for name in partition.devices
        if name != chosen and name not in cluster.down
    ]
    if partition.stripe is not None and partition.partition in partition.stripe.data:
        others.append(Rebuilder.of(cluster, partition))
    return others


def partition_task(
    cluster: Membership,
    entry: DatasetEntry,
    partition: PartitionEntry,
    request: WorkRequest,
    host: Unit,
    **options: Any,
) -> Task:
    """One partition's work, on the replica that serves it, with the others to go on on."""
    device = device_for(cluster, entry, partition)
    return Task(
        client=cluster.devices[device],
        replicas={partition.partition: replicas_of(cluster, partition, device)},
        request=request,
        host=host,
        label=entry.qualified,
        **options,
    )


@dataclass
class Cuts:
    """Where each fragment starts, and what each device is told of the host's costs."""

    choices: dict[str, CutChosen] = field(default_factory=dict)  # fragment -> its start
    host_costs: dict[tuple[str, str], HostCost] = field(default_factory=dict)
    # fragment -> (what ``settled_cuts`` keeps it under, the model's own cut)
    model_cuts: dict[str, tuple[Key, Stage]] = field(default_factory=dict)
    # fragments that start raw and end before a device would first probe to take them back:
    # the host reads their slices itself (a scan stream each), no work exchange (``scans_raw``),
    # unless a join's keys cut them (``scanned``)
    scans: set[str] = field(default_factory=set)

    def scanned(self, probes: set[str]) -> None:
        """Of the fragments that may be read as scans, those a join's keys cut are not: the
        devices cut them before they ship. The others say so in EXPLAIN."""
        self.scans -= probes
        for name in self.scans:
            self.choices[name] = replace(
                self.choices[name], runs_as="scan: the host reads the slices"
            )

    def host_cost(self, fragment: str, device: str) -> HostCost | None:
        return self.host_costs.get((fragment, device))


def choose_cuts(
    cluster: Membership, decomposition: Decomposition, loads: dict[str, LoadStatus] | None = None
) -> Cuts:
    """pushdown="auto": the cost model picks each fragment's cut; devices start from it.
    ``loads``: each device's, as its pulse said (a device missing is asked)."""
    cuts = Cuts()
    host = host_figures()
    for fragment in decomposition.fragments:
        entry = cluster.entry(fragment.dataset)
        if entry.unavailable or entry.rows == 0:
            continue
        stored: dict[str, int] = {}
        served = serving(cluster, entry)
        for p in entry.partitions:
            if p.lost:  # rebuilt on the host from its stripe, whatever the cut
                continue
            device = served[p.partition]
            stored[device] = stored.get(device, 0) + p.bytes_stored
        figures = sampled(cluster, fragment, entry)
        devices = device_figures(cluster, entry, stored, loads or {})
        # A fragment that only filters has identical filter and full stages: the filter cut
        # would cost an extra fetch for the same work.
        identical = fragment.stages[Stage.FILTER] == fragment.stages[Stage.FULL]
        allowed = (Stage.FULL, Stage.RAW) if identical else (Stage.FULL, Stage.FILTER, Stage.RAW)
        choice = _started(cluster, cuts, fragment, entry, choose(devices, figures, host, allowed))
        for name, cost in told(devices, figures, host, choice.cut).items():
            cuts.host_costs[(fragment.name, name)] = cost
        # a storage server chooses its drives' cut on its own figures: it gets the work
        servers = any(cluster.info[name].is_server for name in stored)
        if scans_raw(choice) and not servers:
            cuts.scans.add(fragment.name)
    return cuts


def scans_raw(choice: Choice, probe_after_s: float = Policy().probe_after_s) -> bool:
    """A fragment the model starts raw and expects to end before a device's first probe to
    take the work back (``Policy.probe_after_s``) is read by the host as a scan: no device would
    run any of it, and a scan stream costs a device a quarter of a work exchange (0.6 against
    2.2 ms of CPU; a 1,000-row aggregate on 4 devices took 11.9 ms a query under auto, 7.4
    reading the slices)."""
    return choice.cut is Stage.RAW and choice.estimates[Stage.RAW].seconds < probe_after_s


def _started(
    cluster: Membership, cuts: Cuts, fragment: Fragment, entry: DatasetEntry, choice: Choice
) -> Choice:
    """The model's choice, or where the devices settled past it in the last run (``settled_cuts``);
    either way recorded for EXPLAIN, and the model's own cut kept for what this run teaches."""
    key = fragment_key(fragment, entry)
    cuts.choices[fragment.name] = CutChosen.of(choice)
    cuts.model_cuts[fragment.name] = (key, choice.cut)
    start = cluster.settled.start(key, choice.cut, choice.estimates)  # the cuts it weighed
    if start is None:
        return choice
    cuts.choices[fragment.name] = replace(
        cuts.choices[fragment.name],
        cut=start,
        model_cut=choice.cut,
        started="where the devices settled in the last run",
    )
    return replace(choice, cut=start)


def host_figures() -> HostFigures:
    """The host as its profile sets it (``quarry.local(host_profile=)``, ``quarry up
    --host-profile``), or this machine as it is."""
    profile = host_emulator().profile
    return HostFigures(
        cores=profile.cores or 1,
        compute_factor=profile.compute_factor,
        link_bytes_per_s=profile.external_bytes_per_s,
    )


def host_pace() -> HostPace:
    """The super-plan's share of the host: DataFusion on the profile's cores (no more than this
    machine has), each batch stretched by the profile's compute factor."""
    emulator = host_emulator()
    cores = min(emulator.cores or engine.cpu_count(), engine.cpu_count())
    slower = emulator.profile.compute_factor != 1.0 or emulator.background_load() > 0
    return HostPace(cores, emulator.stretch if slower else None)


def fragment_key(fragment: Fragment, entry: DatasetEntry) -> Key:
    """A fragment over one version of its data (its whole sub-plan's bytes and the version): what
    the sampled figures and where the devices settled are kept under."""
    return (fragment.stages[Stage.FULL], entry.version)


def sampled(cluster: Membership, fragment: Fragment, entry: DatasetEntry) -> SubPlanFigures:
    """Sampling costs a slice fetch and two local runs; a repeated query on unchanged data
    reuses what it learnt (like a plan cache), so auto stays cheap."""
    key = fragment_key(fragment, entry)
    figures = cluster.figures_cache.get(key)
    if figures is None:
        figures = sample_subplan(cluster, fragment, entry)
        if len(cluster.figures_cache) >= FIGURES_CACHE_MAX:
            cluster.figures_cache.clear()
        cluster.figures_cache[key] = figures
    return figures


def spans(cluster: Membership, decomposition: Decomposition) -> dict[str, dict[str, int]]:
    """Per dataset the fragments read, its integer columns' value spans (``value_spans``); a
    dataset that cannot be described now has none (its pairs are judged without them)."""
    found = {}
    for dataset in {f.dataset for f in decomposition.fragments}:
        entry = cluster.entry(dataset)
        if entry.unavailable or not entry.rows:
            continue
        try:
            found[dataset] = value_spans(cluster, entry)
        except DeviceUnavailable:
            continue
    return found


def kept_rows(cluster: Membership, decomposition: Decomposition) -> dict[str, float]:
    """Per filtered fragment, the rows its filter keeps per row read, as a slice sampled on the
    host says (the join filters size a build by it: ``join_filters``). A sub-plan that fails on
    the sample is not estimated: its error is the query's, and comes when it runs."""
    kept = {}
    for fragment in decomposition.fragments:
        if not (fragment.device_filter or fragment.host_filter):
            continue
        entry = cluster.entry(fragment.dataset)
        if entry.unavailable or not entry.rows:
            continue
        try:
            kept[fragment.name] = sampled(cluster, fragment, entry).kept_rows
        except ExecutionError:
            continue
    return kept
