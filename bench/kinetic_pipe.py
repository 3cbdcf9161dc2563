"""Kinetic Pipe's three scenarios at scale: where the host is the bottleneck, pushdown wins by the
ratio of what the drives scan together to what the host takes in.

    python bench/kinetic_pipe.py [--rows 20000000] [--devices 16] [--scenarios A B C]

On a particle table (id, x, y, z, ke; ``quarry.samples.particles``) stored on ``--devices``
emulated Kinetic drives, Kinetic Pipe's two queries at selectivities 0.1%, 1% and 10%:

    select   SELECT * FROM particles WHERE ke > X
    sum      SELECT sum(ke) FROM particles WHERE ke > X

each run host-only (``pushdown="never"``: the drives ship the columns the query needs, the host
filters) and pushed down (``pushdown="always"``), side by side, under three host profiles:

    A  the host's ingress link is the bottleneck: capped so that the drives together scan
       ``LINK_RATIO`` times faster than it carries (at 10% selectivity, ten times as fast:
       the bound is 10 whatever the link);
    B  the host's CPU is the bottleneck: one core, slowed so the drives together scan
       ``CPU_RATIO`` times faster than it filters; the link ample;
    C  the host as this machine is (two cores, loopback), with the table plain and clustered
       by ke (``ingest(cluster_by="ke")``: zone maps skip every slice but the top ones).

The physical bound of each pair is computed before it runs, from calibrated figures:

    drive rate D_i = min(internal_i / read_ratio, cores_i / (compute_factor_i x s_d))
    host rate  H   = min(link / raw_ratio, cores_h / (compute_factor_h x s_h), sum of the drives'
                         raw scan rates min(internal_i / read_ratio, external_i / raw_ratio))
    bound          = min(1 / selectivity, sum(D_i) / (kept x H))    (select)
                   = sum(D_i) / (kept x H)                          (sum: a few partials ship
                                                                     whatever passes)

in stored bytes per second: ``s_d`` and ``s_h`` are one of this machine's cores' seconds per
stored byte for the query's sub-plan as a drive runs it (in chunks of slices: the drives' work
over their compute factor) and as the host-only path runs it (its completions over raw batches);
with the host as this machine is, ``cores_h / s_h`` is the host-only run's own CPU per byte over
the 2 cores. Compute factors and bandwidths are ``quarry calibrate``'s; ``read_ratio`` the
bytes a device reads for the query (its columns) and ``raw_ratio`` the bytes it ships raw, per
stored byte; ``kept`` the fraction of slices the zone maps leave (1 unless clustered).

One machine of 2 cores runs every drive's real work (reading, decoding, the sub-plan,
shipping), so it cannot deliver more than its cores do whatever the drives' figures say:
sum(D_i) is capped at the rate this machine delivered for the drives with the host
unconstrained (the best of three pushdown runs, ``delivered``), and the JSON says when that
binds. The physical bound is then what this machine can show of the drives' advantage, not the
advantage of 16 real drives.

Reported per pair: both wall times, the speedup and its fraction of the bound, bytes over the
host's link (shipped to the coordinator) and bytes read on the drives. Writes
``bench/results/kinetic_pipe.json`` and ``.png`` (bars like the paper's Figures 6-8).

``--netns`` (root, ``ip`` and ``tc``: ``quarry.netns``) starts each drive in a network namespace
of its own, on its own address, TLS on, and runs scenario A three times: with the host's link
emulated in this process (as above; "A"), with it a real link the kernel shapes, a token
bucket on the host's side of the bridge every drive reaches it through ("A netns"), and with
that rate split over the drives' own links instead ("A links"). Each A row also says what
fraction of the link's rate host-only moved its bytes at (``link_fraction``: bytes shipped over
the run's wall time, over the link's rate). Writes ``bench/results/kinetic_pipe_netns.json``
and ``.png``.

Host-only once moved its bytes at about 40% of the links' rate with ``--replicas 2`` on
per-drive links: the first replica of each partition by device name served it, so one drive
of three served every partition it held (160 MB over 100 Mbit/s links: 13.5 s, 31% of the
three links; 4.3 s link-bound). Replicas are now chosen to even the bytes each drive serves
(``query.planning.serving``): 4.5 s, 94%. The rest is TCP/IP, TLS and HTTP/2 framing.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import duckdb
import matplotlib
import pyarrow as pa
from rich.console import Console
from rich.table import Table

import quarry
from quarry import netns
from quarry.coordinator.admin.calibrate import calibrate_device
from quarry.device.profile import get_profile
from quarry.device.unit import host_cores, set_host_profile
from quarry.device.units.substrait import read_columns, run_on_host
from quarry.plan.prune import slice_may_match
from quarry.protocol.stage import Stage
from quarry.samples import particles
from quarry.store.partition import column_bytes

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import png_path, progress, write_json

matplotlib.use("Agg")
NAME = "kinetic_pipe"
SELECTIVITIES = (0.001, 0.01, 0.1)
QUERIES = {
    "select": "SELECT * FROM {table} WHERE ke > {x}",
    "sum": "SELECT sum(ke) AS ke_sum FROM {table} WHERE ke > {x}",
}
LINK_RATIO = 150.0  # A: the drives scan this many times faster than the host's link carries
CPU_RATIO = 12.0  # B: ... than the host's one slowed core filters
SAMPLE_SLICES = 4  # a device's chunk: the sub-plan is timed over this many slices at once
SAMPLE_REPEAT = 5
DELIVERED_RUNS = 3
console = Console()


@dataclass(frozen=True)
class DriveFigures:
    """One drive as calibrated (``quarry calibrate``)."""

    compute_factor: float
    cores: int
    internal_bytes_per_s: float
    external_bytes_per_s: float


@dataclass(frozen=True)
class QueryFigures:
    """What one query costs per stored byte, measured on this machine over real slices."""

    stored_bytes: int  # the dataset's
    s_per_byte: float  # seconds of one host core to run the sub-plan over a stored byte
    host_s_per_byte: float  # ... as the host-only path runs it (completions over raw batches)
    drive_s_per_byte: float  # ... of one of this machine's cores, run as a drive runs it
    read_ratio: float  # bytes a drive reads (the query's columns) per stored byte
    raw_ratio: float  # bytes shipped raw (host-only) per stored byte
    kept: float  # fraction of slices the zone maps leave
    delivered: float  # stored bytes/s the drives delivered on this machine, host unconstrained
    host_cpu_per_byte: float  # real CPU seconds the host-only path spent per stored byte


@dataclass(frozen=True)
class HostSetting:
    """The host's profile in a scenario (None figures: the machine as it is)."""

    cores: int | None = None
    compute_factor: float = 1.0
    link_bytes_per_s: float | None = None

    def profile(self) -> Any:
        if self == HostSetting():
            return None
        return replace(
            get_profile("host"),
            name="kinetic-pipe-host",
            cores=self.cores,
            compute_factor=self.compute_factor,
            external_bytes_per_s=self.link_bytes_per_s,
        )


@dataclass(frozen=True)
class Bound:
    drives_rate: float  # stored bytes/s, all drives together (capped by this machine's cores)
    delivered: float  # stored bytes/s this machine delivered for the drives (host unconstrained)
    host_rate: float  # stored bytes/s of the host-only path's bottleneck
    host_bottleneck: str
    bound: float


def drive_rate(d: DriveFigures, q: QueryFigures) -> float:
    compute = d.cores / (d.compute_factor * q.drive_s_per_byte)
    return min(d.internal_bytes_per_s / q.read_ratio, compute)


def host_rate(h: HostSetting, drives: list[DriveFigures], q: QueryFigures) -> tuple[float, str]:
    cores = h.cores or host_cores()
    # this machine as it is: what the host-only path really costs it (receiving, decoding and
    # the sub-plan); a profiled host: its cores and speed for the sub-plan it completes
    per_byte = q.host_cpu_per_byte if h == HostSetting() else h.compute_factor * q.host_s_per_byte
    rates = {
        "cpu": cores / per_byte,
        "drives' raw scan": sum(
            min(d.internal_bytes_per_s / q.read_ratio, d.external_bytes_per_s / q.raw_ratio)
            for d in drives
        ),
    }
    if h.link_bytes_per_s:
        rates["link"] = h.link_bytes_per_s / q.raw_ratio
    name = min(rates, key=rates.get)
    return rates[name], name


def bound_of(
    selectivity: float, h: HostSetting, drives: list[DriveFigures], q: QueryFigures, rows: bool
) -> Bound:
    """``rows``: the query ships the rows that pass (a selection), so pushdown moves
    ``selectivity`` of them and gains at most 1 / selectivity; an aggregate ships a few partials
    whatever passes, so its bound is the drives' rate over the host's alone."""
    together = min(sum(drive_rate(d, q) for d in drives) / q.kept, q.delivered)
    host, bottleneck = host_rate(h, drives, q)
    ratio = together / host
    return Bound(
        together, q.delivered, host, bottleneck, min(1 / selectivity, ratio) if rows else ratio
    )


def scenario_hosts(
    drives: list[DriveFigures], q: QueryFigures, selectivity: float
) -> dict[str, HostSetting]:
    """Each scenario's host for this query: the bottleneck resource set from the drives' rate."""
    together = min(sum(drive_rate(d, q) for d in drives) / q.kept, q.delivered)
    # Past 1 / selectivity the bound is that whatever the link: no need to wait longer for it.
    ratio_a = min(LINK_RATIO, 1.5 / selectivity)
    link = together * q.raw_ratio / ratio_a
    # one core that filters CPU_RATIO times slower than the drives scan: 1 / (slow x s) = D / R
    slow = max(1.0, CPU_RATIO / (together * q.host_s_per_byte))
    return {
        "A": HostSetting(link_bytes_per_s=link),
        "B": HostSetting(cores=1, compute_factor=slow),
        "C": HostSetting(),
        "C clustered": HostSetting(),
    }


# ---- measuring --------------------------------------------------------------------------------


def calibrated_drives(cluster: Any, calibrate: str) -> tuple[list[DriveFigures], list[dict]]:
    """``all``: every drive calibrated; ``one``: the first, its figures for every drive of the
    same profile (all of them here)."""
    clients = cluster.live_devices()
    measured = clients if calibrate == "all" else clients[:1]
    reports = []
    with progress(console) as bars:
        task = bars.add_task("calibrating drives", total=len(measured))
        for client in measured:
            reports.append(calibrate_device(client).to_json())
            bars.advance(task)
    figures = []
    for index, client in enumerate(clients):
        report = reports[min(index, len(reports) - 1)]
        profile = client.hello().profile
        figures.append(
            DriveFigures(
                compute_factor=report["compute_factor"]["measured"],
                cores=profile.cores or 1,
                internal_bytes_per_s=report["internal_bytes_per_s"]["measured"],
                external_bytes_per_s=report["external_bytes_per_s"]["measured"],
            )
        )
    return figures, reports


def query_figures(cluster: Any, sql: str, dataset: str) -> QueryFigures:
    """The sub-plan timed over a device's chunk of real slices on this machine's CPU."""
    planned = cluster.query(sql, pushdown="always")
    (fragment,) = planned.decomposition.fragments
    entry = cluster.entry(dataset)
    device = cluster.devices[entry.partitions[0].devices[0]]
    description = device.describe(entry.domain, entry.name, entry.partitions[0].partition)
    reader = device.scan(entry.domain, entry.name, 0, first=0, end=SAMPLE_SLICES)
    batches = [chunk.data for chunk in reader]
    stored = sum(s.bytes_stored for s in description.slices[:SAMPLE_SLICES])
    best = float("inf")
    for _ in range(SAMPLE_REPEAT):
        started = time.perf_counter()
        list(run_on_host(fragment.stages[Stage.FULL], entry.schema, batches))
        best = min(best, time.perf_counter() - started)
    needed = read_columns(fragment.stages, fragment.raw_schema)
    read = sum(
        column_bytes(entry.schema, s.columns, s.bytes_stored, needed)
        for s in description.slices[:SAMPLE_SLICES]
    )
    raw = sum(pa.ipc.get_record_batch_size(b.select(fragment.raw_schema.names)) for b in batches)
    kept = kept_fraction(cluster, entry, fragment.predicates)
    return QueryFigures(
        stored_bytes=entry.bytes_stored,
        s_per_byte=best / stored,
        read_ratio=read / stored,
        raw_ratio=raw / stored,
        kept=kept,
        drive_s_per_byte=per_byte(cluster, sql, "always", "drive") / kept,
        delivered=entry.bytes_stored / timed(cluster, sql, "always", DELIVERED_RUNS)["seconds"],
        host_cpu_per_byte=per_byte(cluster, sql, "never", "cpu"),
        host_s_per_byte=per_byte(cluster, sql, "never", "complete"),
    )


def per_byte(cluster: Any, sql: str, mode: str, what: str) -> float:
    """Seconds per stored byte, the least of a few runs: ``cpu``, the host's real CPU in a
    host-only run (``never``); ``complete``, the host's completions in that run (what a host
    profile's compute factor stretches); ``drive``, the drives' sub-plan work as their compute
    factor holds it, over that factor (one of this machine's cores running it as a drive
    does: in chunks of slices, a session each)."""
    stored = cluster.entry(cluster.query(sql).decomposition.fragments[0].dataset).bytes_stored
    factor = {c.name: c.hello().profile.compute_factor for c in cluster.live_devices()}
    best = float("inf")
    for _ in range(3):
        planned = cluster.query(sql, pushdown=mode)
        planned.execute().read_all()
        report = planned.explain(analyze=True).to_json()["analyze"]
        if what == "drive":
            seconds = sum(p["drive_s"] / factor[p["device"]] for p in report["partitions"])
        elif what == "complete":
            seconds = planned.dispatch.host_complete_s
        else:
            seconds = report["host_cpu_s"]
        best = min(best, seconds)
    return best / stored


def kept_fraction(cluster: Any, entry: Any, predicates: list) -> float:
    """Stored bytes of the slices whose zone maps may match, over all (what a drive reads)."""
    kept = total = 0
    for p in entry.partitions:
        described = cluster.devices[p.devices[0]].describe(entry.domain, entry.name, p.partition)
        for s in described.slices:
            zones = {c: z.to_json() for c, z in s.zone_map.items()}
            total += s.bytes_stored
            kept += s.bytes_stored if slice_may_match(predicates, zones) else 0
    return max(kept, 1) / max(total, 1)


def timed(cluster: Any, sql: str, mode: str, repeat: int) -> dict[str, Any]:
    """Best wall time of ``repeat`` runs (one when a run is long), and what the last moved."""
    best, report, table = float("inf"), None, None
    for attempt in range(repeat):
        planned = cluster.query(sql, pushdown=mode)
        started = time.perf_counter()
        table = planned.execute().read_all()
        best = min(best, time.perf_counter() - started)
        report = planned.explain(analyze=True).to_json()["analyze"]
        if best > 10.0 and attempt == 0:
            break
    return {
        "seconds": best,
        "bytes_shipped": report["bytes_shipped"],
        "bytes_read": report["bytes_read"],
        "slices_pruned": sum(p["slices_pruned"] for p in report["partitions"]),
        "result": table,
    }


def check(result: pa.Table, expected: pa.Table, what: str) -> None:
    if result.num_rows != expected.num_rows:
        raise AssertionError(f"{what}: {result.num_rows} rows, DuckDB {expected.num_rows}")
    if result.num_rows == 1 and result.num_columns == 1:
        got, want = result.column(0)[0].as_py(), expected.column(0)[0].as_py()
        if abs(got - want) > 1e-9 * max(1.0, abs(want)):
            raise AssertionError(f"{what}: sum {got}, DuckDB {want}")


# ---- the run ----------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=20_000_000)
    parser.add_argument("--devices", type=int, default=16)
    parser.add_argument("--profile", default="kinetic")
    parser.add_argument("--scenarios", nargs="+", default=["A", "B", "C"])
    parser.add_argument("--selectivities", nargs="+", type=float, default=list(SELECTIVITIES))
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--calibrate", choices=("all", "one"), default="one")
    parser.add_argument("--netns", action="store_true", help="drives in network namespaces")
    parser.add_argument("--replicas", type=int, default=1)
    args = parser.parse_args()
    name = f"{NAME}_netns" if args.netns else NAME

    started = time.perf_counter()
    with started_cluster(args) as (cluster, processes, network):
        memory = {"idle_mib": resident_mib(processes)}
        table = particles.table(args.rows, seed=11)
        console.print(
            f"ingesting {args.rows:,} particles onto {args.devices} {args.profile} drives"
        )
        # two partitions a drive: each of its cores takes one (a request's partitions run at once)
        partitions = 2 * args.devices
        placed = {"partitions": partitions, "replicas": args.replicas}
        cluster.ingest(table, "physics/particles", **placed)
        cluster.ingest(table, "physics/particles_by_ke", **placed, cluster_by="ke")
        duck = duckdb.connect()
        duck.register("particles", table)
        warm_up(cluster)
        drives, calibration = calibrated_drives(cluster, args.calibrate)
        rows = run_all(cluster, duck, drives, args, network)
        memory["after_queries_mib"] = resident_mib(processes)
    set_host_profile(None)
    summary(rows)
    console.print(f"device resident memory (MiB): {memory}")
    path = write_json(
        name,
        {
            "netns": args.netns,
            "rows": args.rows,
            "devices": args.devices,
            "profile": args.profile,
            "replicas": args.replicas,
            "drives": [asdict(d) for d in drives[:1]],
            "device_memory": memory,
            "calibration": calibration,
            "link_ratio": LINK_RATIO,
            "cpu_ratio": CPU_RATIO,
            "seconds": time.perf_counter() - started,
            "results": rows,
        },
    )
    plot(rows, args, name)
    console.print(f"wrote {path} and {png_path(name)}")


@contextlib.contextmanager
def started_cluster(args: Any) -> Any:
    """The cluster, its device processes, and (``--netns``) the network they are on."""
    if not args.netns:
        with quarry.local(devices=args.devices, profile=args.profile) as cluster:
            yield cluster, cluster.processes, None
        return
    reason = netns.missing()
    if reason is not None:
        sys.exit(f"--netns: {reason}")
    with netns.cluster(devices=args.devices, profile=args.profile) as running:
        yield running.cluster, running.processes, running.network


def resident_mib(processes: dict[str, Any]) -> dict[str, float]:
    """Resident memory of the device processes: the least, the median and the most (MiB)."""
    sizes = sorted(
        int(Path(f"/proc/{p.pid}/status").read_text().split("VmRSS:")[1].split()[0]) / 1024
        for p in processes.values()
    )
    return {"min": sizes[0], "median": sizes[len(sizes) // 2], "max": sizes[-1]}


def warm_up(cluster: Any) -> None:
    """Every drive loads its engine on its first sub-plan: not the scenario's to pay."""
    for dataset in ("particles", "particles_by_ke"):
        for mode in ("always", "never"):
            for query in QUERIES.values():
                sql = query.format(table=dataset, x=particles.ke_threshold(0.0001))
                cluster.sql(sql, pushdown=mode).read_all()


def run_all(
    cluster: Any, duck: Any, drives: list[DriveFigures], args: Any, network: Any = None
) -> list[dict]:
    plans = []
    for scenario in args.scenarios:
        names = ["C", "C clustered"] if scenario == "C" else [scenario]
        if scenario == "A" and network is not None:
            names = ["A", "A netns", "A links"]
        for name in names:
            for query in QUERIES:
                for selectivity in args.selectivities:
                    plans.append((name, query, selectivity))
    rows = []
    figures_cache: dict[tuple[str, str], QueryFigures] = {}
    with progress(console) as bars:
        task = bars.add_task("scenarios (host-only, then pushdown)", total=len(plans))
        for name, query, selectivity in plans:
            dataset = "particles_by_ke" if name == "C clustered" else "particles"
            x = particles.ke_threshold(selectivity)
            sql = QUERIES[query].format(table=dataset, x=x)
            key = (sql, dataset)
            if key not in figures_cache:
                set_host_profile(None)
                figures_cache[key] = query_figures(cluster, sql, f"physics/{dataset}")
            q = figures_cache[key]
            host = scenario_hosts(drives, q, selectivity)[name.split()[0]]
            bound = bound_of(selectivity, host, drives, q, rows=query == "select")
            expected = duck.execute(QUERIES[query].format(table="particles", x=x))
            expected = expected.fetch_arrow_table()
            with host_link(name, host, network):
                never = timed(cluster, sql, "never", args.repeat)
                always = timed(cluster, sql, "always", args.repeat)
            for mode, run in (("never", never), ("always", always)):
                check(run.pop("result"), expected, f"{name} {query} {selectivity:.1%} {mode}")
            speedup = never["seconds"] / always["seconds"]
            rows.append(
                {
                    "scenario": name,
                    "query": query,
                    "selectivity": selectivity,
                    "sql": sql,
                    "host": asdict(host),
                    "figures": asdict(q),
                    "bound": asdict(bound),
                    "host_only": never,
                    "pushdown": always,
                    "speedup": speedup,
                    "of_bound": speedup / bound.bound,
                    "bytes_over_link_ratio": never["bytes_shipped"]
                    / max(1, always["bytes_shipped"]),
                    "link_fraction": link_fraction(never, host),
                }
            )
            bars.console.print(
                f"{name:12s} {query:6s} {selectivity:6.1%}: host-only {never['seconds']:7.2f} s, "
                f"pushdown {always['seconds']:6.3f} s, {speedup:6.1f}x of bound "
                f"{bound.bound:6.1f}x ({bound.host_bottleneck}) = {speedup / bound.bound:.2f}"
            )
            bars.advance(task)
    return rows


@contextlib.contextmanager
def host_link(scenario: str, host: HostSetting, network: Any) -> Any:
    """The host as the scenario has it while the pair runs: its link emulated in this process;
    or ("A netns") a kernel token bucket on its side of the bridge, nothing emulated; or ("A
    links") the same rate split over the drives' own links, the host's unshaped (the issue's
    configuration: each host behind its own 100 Mbit/s)."""
    if scenario in ("A netns", "A links"):
        links = network.links
        if scenario == "A netns":
            network.shape_host(host.link_bytes_per_s)
        else:
            for name in links:
                network.shape(name, host.link_bytes_per_s / len(links))
        try:
            yield
        finally:
            network.shape_host(None)
            for name in links:
                network.shape(name, None)
        return
    set_host_profile(host.profile())
    try:
        yield
    finally:
        set_host_profile(None)


def link_fraction(run: dict[str, Any], host: HostSetting) -> float | None:
    """The host-only run's bytes over the host's link per second, over the link's rate."""
    if not host.link_bytes_per_s:
        return None
    return run["bytes_shipped"] / run["seconds"] / host.link_bytes_per_s


def summary(rows: list[dict]) -> None:
    table = Table(title="Kinetic Pipe at scale: host-only vs pushdown (speedup / physical bound)")
    for column in ("scenario", "query", "sel.", "host-only", "pushdown", "speedup", "bound"):
        table.add_column(column, justify="right")
    table.add_column("of bound", justify="right")
    table.add_column("MB over link (host-only / pushdown)", justify="right")
    table.add_column("host-only / link rate", justify="right")
    for r in rows:
        table.add_row(
            r["scenario"],
            r["query"],
            f"{r['selectivity']:.1%}",
            f"{r['host_only']['seconds']:.2f} s",
            f"{r['pushdown']['seconds']:.3f} s",
            f"{r['speedup']:.1f}x",
            f"{r['bound']['bound']:.1f}x ({r['bound']['host_bottleneck']})",
            f"{r['of_bound']:.2f}",
            f"{r['host_only']['bytes_shipped'] / 1e6:.1f} / "
            f"{r['pushdown']['bytes_shipped'] / 1e6:.3f}",
            "" if r["link_fraction"] is None else f"{r['link_fraction']:.0%}",
        )
    console.print(table)


def short(value: float) -> str:
    return f"{value:.0f}" if value >= 10 else f"{value:.1f}"


def plot(rows: list[dict], args: Any, name: str = NAME) -> None:
    import matplotlib.pyplot as plt

    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    fig, axes = plt.subplots(1, len(scenarios), figsize=(4.2 * len(scenarios), 4.8), squeeze=False)
    for ax, scenario in zip(axes[0], scenarios, strict=True):
        chosen = [r for r in rows if r["scenario"] == scenario]
        labels = [f"{r['query']}\n{r['selectivity']:.1%}" for r in chosen]
        positions = range(len(chosen))
        ax.bar(
            [p - 0.2 for p in positions],
            [r["host_only"]["seconds"] for r in chosen],
            0.4,
            label="host-only (never)",
            color="#999999",
        )
        ax.bar(
            [p + 0.2 for p in positions],
            [r["pushdown"]["seconds"] for r in chosen],
            0.4,
            label="in-drive (always)",
            color="#1f77b4",
        )
        for p, r in zip(positions, chosen, strict=True):
            ax.annotate(
                f"{short(r['speedup'])}x\n/{short(r['bound']['bound'])}",
                (p, r["host_only"]["seconds"]),
                ha="center",
                va="bottom",
                fontsize=7,
            )
        ax.set_yscale("log")
        ax.set_xticks(list(positions), labels, fontsize=7)
        ax.set_ylabel("wall time (s)")
        fractions = [r["link_fraction"] for r in chosen if r["link_fraction"] is not None]
        link = f"; host-only at {sum(fractions) / len(fractions):.0%} of link" if fractions else ""
        ax.set_title(f"scenario {scenario}{link}", fontsize=10)
        ax.legend(fontsize=7, loc="lower left")
    fig.suptitle(
        f"Kinetic Pipe at scale: {args.rows:,} particles on {args.devices} {args.profile} drives "
        "(speedup / physical bound above each pair)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(png_path(name), dpi=120)


if __name__ == "__main__":
    main()
