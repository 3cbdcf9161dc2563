"""The ``quarry`` command. What it shares with `quarry de` and `quarry capacity` (the cluster
option, printing, errors) is in ``quarry.cli_common``; those two are mounted at the end."""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from quarry import settings
from quarry.cli_common import (
    DEFAULT_DATA,
    ClusterOption,
    JsonOption,
    ReflowedHelp,
    cluster_file,
    console,
    errors,
    human_bytes,
    open_cluster,
    print_json,
    pushed_back_words,
    run,
)
from quarry.errors import ClusterError, QuarryError
from quarry.protocol.stage import STAGES_BY_DATA_SHIPPED, Stage
from quarry.pushdown import Pushdown

if TYPE_CHECKING:
    from quarry.coordinator.dispatch.report import LevelRow
    from quarry.coordinator.query.explain import Analyze, CutChosen, Explain
    from quarry.cost.model import SubPlanFigures
    from quarry.plan.explain import RuleFired
    from quarry.protocol.counters import WorkCounters

if TYPE_CHECKING:  # the commands import what they run when they run
    from quarry.auth.credentials import Credentials
    from quarry.coordinator.admin.rebalance import RebalanceReport
    from quarry.coordinator.membership.cluster_file import ClusterFile, DeviceSpec
    from quarry.coordinator.membership.listing import DeviceStatus
    from quarry.protocol.control import Measured, RevokedToken, StatsReply

app = typer.Typer(
    cls=ReflowedHelp,
    help="quarry: computational storage. Devices that compute; queries go to the data.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
device_app = typer.Typer(help="Run and drive device processes.", no_args_is_help=True)
app.add_typer(device_app, name="device")
token_app = typer.Typer(no_args_is_help=True, help="Tokens: who may call the devices.")
app.add_typer(token_app, name="token")
quarantine_app = typer.Typer(
    no_args_is_help=True,
    help="Sub-plan shapes the devices decline because their stage failed there (`quarry "
    "status` lists them).",
)
app.add_typer(quarantine_app, name="quarantine")

MATRIX_FORMATS = ("h5ad", "mtx", "tsv")


# ---- cluster lifecycle -------------------------------------------------------------------------


def _layout(text: str) -> list[Any]:
    """``--layout``: a JSON list of profile names and lists (servers), at any depth."""

    def valid(item: Any) -> bool:
        return isinstance(item, str) or (
            isinstance(item, list) and bool(item) and all(valid(i) for i in item)
        )

    try:
        tree = json.loads(text)
    except json.JSONDecodeError as error:
        raise ClusterError(f"--layout is not JSON: {error}") from None
    if not isinstance(tree, list) or not tree or not all(valid(i) for i in tree):
        raise ClusterError(
            "--layout lists drives (profile names) and servers (non-empty lists of the same)"
        )
    return tree


@app.command()
def up(
    devices: Annotated[int, typer.Option(help="number of device processes")] = 3,
    profile: Annotated[
        str,
        typer.Option(
            help="device profile (host, kinetic, newport, ...), or one per device, "
            "comma-separated: host,kinetic,newport"
        ),
    ] = "host",
    data: Annotated[Path, typer.Option(help="folder for the devices' data")] = Path(DEFAULT_DATA),
    detach: Annotated[bool, typer.Option(help="start in the background and return")] = False,
    profiles: Annotated[str | None, typer.Option(help="TOML file of user-defined profiles")] = None,
    tls: Annotated[bool, typer.Option(help="encrypt every call (TLS) as well")] = False,
    host_profile: Annotated[
        str | None,
        typer.Option(
            help="the host's own profile: its ingress link, cores and compute factor, applied "
            "by every coordinator that opens this cluster"
        ),
    ] = None,
    servers: Annotated[
        int,
        typer.Option(help="storage servers in front of the drives (0: the host sees drives)"),
    ] = 0,
    drives_per_server: Annotated[int, typer.Option(help="drives behind each server")] = 2,
    server_profile: Annotated[str, typer.Option(help="the storage servers' profile")] = "host",
    drive_profile: Annotated[
        str | None,
        typer.Option(help="the drives' profile behind servers (default: --profile)"),
    ] = None,
    layout: Annotated[
        str | None,
        typer.Option(
            help="a cluster of any depth, as JSON: drives by profile, servers as lists of what "
            'is behind them, e.g. \'[["scaleflux", ["host", "kinetic"]], "host"]\''
        ),
    ] = None,
    flight_sql_port: Annotated[
        int | None,
        typer.Option(
            help="also serve Arrow Flight SQL on this loopback port (quarry serve; "
            "docs/flightsql.md)"
        ),
    ] = None,
    hosts: Annotated[
        int,
        typer.Option(
            help="say the devices run on this many hosts (host0, host1... round-robin): "
            "failure domains on one machine (0: this machine's name)"
        ),
    ] = 0,
) -> None:
    """Start an embedded cluster of device processes on localhost; every call carries a token
    (the cluster's credentials are made in the data folder, owner-readable only). With
    --servers, a hierarchy: storage servers, each in front of drives of its own."""
    from quarry.coordinator.cluster import Cluster
    from quarry.coordinator.membership.cluster_file import ClusterFile, HostSpec
    from quarry.coordinator.processes.layouts import start_local
    from quarry.coordinator.processes.local import CLUSTER_FILE
    from quarry.coordinator.processes.spawn import stop_pid

    file = data / CLUSTER_FILE
    if file.exists():
        try:
            running = open_cluster(file)
            alive = [n for n in running.devices if n not in running.down]
            running.close()
        except QuarryError:
            alive = []
        if alive:
            raise ClusterError(
                f"a cluster is already running from {file} ({len(alive)} devices): "
                "`quarry down` first, or use another --data folder"
            )
    _replacing_older(data)
    chosen: str | list[str] = profile.split(",") if "," in profile else profile
    if host_profile is not None:
        from quarry.device.profile import get_profile

        get_profile(host_profile, profiles)  # fail fast, before any process starts
    if servers or layout:
        from quarry.coordinator.processes.layouts import hierarchy_layout, start_tree

        data.mkdir(parents=True, exist_ok=True)
        kinds = drive_profile or profile
        tree = (
            _layout(layout)
            if layout
            else hierarchy_layout(
                servers, drives_per_server, kinds.split(",") if "," in kinds else kinds
            )
        )
        started = start_tree(tree, server_profile, data.resolve(), profiles, tls, detach)
    else:
        started, _root, _ = start_local(
            devices, chosen, data, detach=detach, profiles_file=profiles, tls=tls, hosts=hosts
        )
    processes = list(started.processes.values())  # the host's devices first, then behind them
    host = HostSpec(host_profile, profiles) if host_profile else None
    ClusterFile(started.specs, host).write(file)
    cluster = Cluster(started.specs, source=str(file))
    _print_status(cluster.status())
    cluster.close()
    console.print(
        f"cluster file: {file}  (export {settings.CLUSTER.name}={file} to use it from elsewhere)"
    )
    if flight_sql_port is not None:
        from quarry.flightsql import process as flight_sql

        endpoint, ready = flight_sql.start(file, flight_sql_port, tls, detach)
        processes.append(endpoint)
        console.print(f"Flight SQL: {ready['address']} (a token: quarry token create)")
    if detach:
        return
    console.print("running; press Ctrl-C to stop")
    stopping = False

    def stop(*_: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    try:
        while not stopping and all(p.poll() is None for p in processes):
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    for process in reversed(processes):  # the endpoint, if any, before the devices
        stop_pid(process.pid)
    file.unlink(missing_ok=True)
    console.print("stopped")


def _replacing_older(data: Path) -> None:
    """Say so when the cluster's credentials are an older quarry's (an HMAC secret every
    device shared): ``quarry up`` makes new ones, and the tokens handed out before stop
    working."""
    from quarry.auth.credentials import FOLDER, is_older

    if is_older(data / FOLDER):
        console.print(
            f"[yellow]{data / FOLDER} held an older quarry's credentials (one secret every "
            "device shared): made new ones; tokens handed out before no longer work[/yellow]"
        )


@app.command()
def init(
    folder: Annotated[
        Path, typer.Option(help="the cluster's authority: stays on this machine")
    ] = Path(DEFAULT_DATA) / "credentials",
    host: Annotated[
        list[str] | None,
        typer.Option(
            help="an address of this machine for its certificate (quarry serve --tls), "
            "besides loopback; repeat for more"
        ),
    ] = None,
    admin_ttl: Annotated[
        float | None,
        typer.Option(
            help=f"seconds the admin token lives (default ${settings.ADMIN_TOKEN_TTL_S.name}, "
            "30 days)"
        ),
    ] = None,
) -> None:
    """Make a cluster's authority on the admin's machine: a CA, the key that signs tokens, an
    admin token. They never leave the folder: devices get folders of their own (quarry device
    enroll). Run again, it keeps the authority and renews the admin token once half its life
    has gone."""
    from quarry.auth.credentials import init as make
    from quarry.auth.credentials import is_older

    if admin_ttl is not None and not 60 <= admin_ttl <= settings.ADMIN_TOKEN_TTL_S.upper:
        raise QuarryError(
            f"--admin-ttl must be 60 to {settings.ADMIN_TOKEN_TTL_S.upper:.0f} s, not {admin_ttl}"
        )
    older = is_older(folder)
    made = not (folder / "signing.key").exists()
    credentials = make(folder, tuple(host or ()), admin_ttl)
    if older:
        console.print(f"replaced an older quarry's credentials in {folder}")
    console.print(
        f"{'made' if made else 'kept'} the cluster's authority in {credentials.folder} "
        "(owner-only; never copy it to a storage host)\n"
        f"admin token: {credentials.admin_token_file}\n"
        "next: quarry device enroll NAME --host ADDR --output DIR, for each device"
    )


@app.command()
def down(cluster: ClusterOption = None) -> None:
    """Stop the devices of a cluster started with `quarry up`."""
    from quarry.coordinator.membership.cluster_file import ClusterFile
    from quarry.coordinator.processes.spawn import stop_device
    from quarry.flightsql import process as flight_sql

    file = cluster_file(cluster)
    devices = ClusterFile.read(file).devices
    endpoint = flight_sql.stop(file)
    if endpoint is not None:
        console.print(f"Flight SQL endpoint: {endpoint}")

    def stop(entries: tuple[DeviceSpec, ...]) -> None:
        for one in entries:  # a storage server first, then what is behind it, at any depth
            if one.pid is not None:
                outcome = stop_device(one)
                console.print(f"{one.name} (pid {one.pid}): {outcome}")
            stop(one.drives)

    stop(devices)
    file.unlink(missing_ok=True)


@app.command()
def status(cluster: ClusterOption = None, as_json: JsonOption = False) -> None:
    """Show every device: up or down, profile, keys and partitions held, work running now and
    requests refused as busy."""
    c = open_cluster(cluster)
    rows = c.status()
    short = c.deficits()
    shared = c.placement_warnings()
    kept = {row.dataset: row.redundancy for row in c.datasets()}
    c.close()
    if as_json:
        print_json([row.to_json() for row in rows])
        return
    _print_status(rows)
    _print_integrity(rows)
    _print_quarantine(rows)
    _print_moves(rows)
    for warning in shared:
        console.print(f"[yellow]warning[/yellow]: {warning.message()}")
    if kept:
        console.print("redundancy: " + ", ".join(f"{d} {how}" for d, how in sorted(kept.items())))
    if not short:
        console.print("every partition is at its replica count")
    for deficit in short:
        if deficit.redundancy:
            console.print(
                f"[yellow]lost[/yellow] {deficit.dataset} partition {deficit.partition}: no "
                f"device that answers holds it; read rebuilt from its {deficit.redundancy} "
                "stripe until `quarry repair` rebuilds it onto a device"
            )
            continue
        held = ", ".join(deficit.holders) or "no device that answers"
        console.print(
            f"[yellow]under-replicated[/yellow] {deficit.dataset} partition {deficit.partition}: "
            f"{len(deficit.holders)} of {deficit.replicas} replicas ({held}); `quarry repair`"
        )


@app.command()
def top(
    cluster: ClusterOption = None,
    interval: Annotated[
        float, typer.Option(help="seconds between refreshes (the rates are over this time)")
    ] = 2.0,
    once: Annotated[
        bool, typer.Option(help="print one snapshot (rates over one interval) and end")
    ] = False,
) -> None:
    """Watch every device live: work running and its bound, output queued, bytes read and
    shipped per second, the share of slices pushed back, requests refused as busy, free
    space. Refreshes in place; q or Ctrl-C ends it."""
    from quarry import top as watching

    if interval < watching.INTERVAL_S_MIN:
        raise QuarryError(f"--interval {interval}: at least {watching.INTERVAL_S_MIN} s")
    c = open_cluster(cluster)
    try:
        if once:
            watching.once(c, console, interval)
        else:
            watching.live(c, console, interval)
    except KeyboardInterrupt:  # Ctrl-C is how a user ends it, as q is
        pass
    finally:
        c.close()


def _print_status(rows: list[DeviceStatus]) -> None:
    table = Table(title="devices")
    columns = (
        "device",
        "address",
        "up",
        "domain",
        "profile",
        "partitions",
        "keys",
        "file",
        "work",
        "busy",
    )
    for column in columns:
        table.add_column(column)
    for row in rows:
        stats = row.stats
        domain = f"{row.rack}/{row.host}" if row.rack else row.host
        if row.drained:
            domain += " (drained)"
        if stats is None:
            table.add_row(row.device, row.address, "[red]no[/red]", domain, *["-"] * 6)
            continue
        table.add_row(
            row.device,
            row.address,
            "yes",
            domain,
            row.profile or "-",
            str(stats.partitions),
            str(stats.keys),
            human_bytes(stats.file_bytes),
            f"{stats.running} of {stats.exchanges_max}",
            _busy(stats),
        )
    console.print(table)


def _print_integrity(rows: list[DeviceStatus]) -> None:
    """Each device's last scrub and what it found, the damaged copies it holds, and the
    partitions it reads unverified (docs/integrity.md)."""
    now = time.time()
    for row in rows:
        stats = row.stats
        if stats is None:
            continue
        last = stats.last_scrub
        if last is None:
            scrubbed = "never scrubbed"
        else:
            ago = _ago(now - last.finished_at)
            found = f"{last.corrupt} damaged, {last.repaired} repaired" if last.corrupt else "clean"
            fixed = f", {last.zone_maps_fixed} zone maps rewritten" if last.zone_maps_fixed else ""
            scrubbed = f"scrubbed {ago} ago: {last.slices:,} slices, {found}{fixed}"
        held = ""
        if stats.corrupt_copies:
            held = (
                f"; [red]{stats.corrupt_copies} damaged copies[/red] held "
                "(`quarry repair` mends them from good ones)"
            )
        if stats.unverified_partitions:
            held += (
                f"; [yellow]{stats.unverified_partitions} partitions unverified[/yellow] "
                "(written before checksums: ingest them again)"
            )
        console.print(f"{row.device}: {scrubbed}{held}")


def _print_quarantine(rows: list[DeviceStatus]) -> None:
    """The sub-plan shapes each device declines for now, why, and for how long (docs/
    operations.md, "Quarantine")."""
    now = time.time()
    for row in rows:
        for held in row.stats.quarantined if row.stats is not None else ():
            console.print(
                f"{row.device}: [yellow]quarantined[/yellow] sub-plan {held.shape} of "
                f"{held.dataset} ({held.cause}: {escape(held.detail)}), "
                f"{_ago(max(0.0, held.expires_at - now))} left; the host runs it meanwhile "
                "(`quarry quarantine clear` lifts it)"
            )


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86_400:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86_400:.0f} days"


def _print_moves(rows: list[DeviceStatus]) -> None:
    """The partitions being copied into each device now: moves (and repairs) in flight."""
    for row in rows:
        for copy in row.stats.copies if row.stats is not None else ():
            done = f"{copy.bytes_received / copy.bytes_total:.0%} of " if copy.bytes_total else ""
            console.print(
                f"moving {copy.dataset} partition {copy.partition}: {copy.source} -> "
                f"{row.device}, {done}{human_bytes(copy.bytes_total or copy.bytes_received)}"
            )


def _busy(stats: StatsReply) -> str:
    """Requests refused as busy since the device started, of all it was asked to run."""
    asked = stats.admitted + stats.refused
    return f"{stats.refused:,} of {asked:,}" if asked else "0"


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="address to listen on (off loopback: --tls)")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(help="port to listen on (0: any free port)")] = 31337,
    tls: Annotated[
        bool, typer.Option(help="serve over TLS with the cluster's certificate")
    ] = False,
    tls_cert: Annotated[
        Path | None, typer.Option(help="serve over TLS with this certificate (PEM) instead")
    ] = None,
    tls_key: Annotated[Path | None, typer.Option(help="the key of --tls-cert (PEM)")] = None,
    pushdown: Annotated[
        str, typer.Option(help="never, server, always or auto, for every query")
    ] = Pushdown.AUTO,
    query_seconds_max: Annotated[
        float, typer.Option(help="a query running longer is cancelled")
    ] = 3600.0,
    ready_file: Annotated[
        Path | None, typer.Option(help="write the address here once listening")
    ] = None,
    cluster: ClusterOption = None,
) -> None:
    """Serve the cluster over Arrow Flight SQL (ADBC, JDBC, DBeaver): every call carries a
    token (quarry token create) and runs with its role; read-only (docs/flightsql.md)."""
    import logging

    from quarry.flightsql.serve import Options
    from quarry.flightsql.serve import serve as serve_endpoint

    mode = Pushdown.parse(pushdown, name="--pushdown")
    if query_seconds_max <= 0:
        raise QuarryError(f"--query-seconds-max must be positive, not {query_seconds_max}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    options = Options(host, port, tls, tls_cert, tls_key, mode, query_seconds_max)
    serve_endpoint(cluster_file(cluster), options, ready_file)


# ---- datasets ------------------------------------------------------------------------------------


@app.command()
def ingest(
    path: Annotated[Path, typer.Argument(help="file to ingest (Parquet, CSV/TSV, Arrow IPC)")],
    dataset: Annotated[str, typer.Option(help="DOMAIN/NAME")],
    replicas: Annotated[int, typer.Option(help="copies of each partition")] = 1,
    ec: Annotated[
        str | None,
        typer.Option(
            help="erasure code K+M instead of replicas (e.g. 8+2): stripes of K whole-row "
            "slices on K devices, M parity slices on M more; survives M lost devices"
        ),
    ] = None,
    compression: Annotated[str, typer.Option(help="zstd, lz4 or none")] = "none",
    partitions: Annotated[int | None, typer.Option(help="number of partitions")] = None,
    append: Annotated[bool, typer.Option(help="add the rows to an existing dataset")] = False,
    format: Annotated[
        str | None,
        typer.Option(
            help="parquet, csv, arrow; or an expression matrix: h5ad, mtx (10x folder), tsv "
            "(default: by suffix; a .h5ad file or a folder is a matrix)"
        ),
    ] = None,
    cluster_by: Annotated[
        str | None,
        typer.Option(
            help="sort each partition by this column, so zone maps skip the slices a range "
            "predicate on it excludes (a clustered index)"
        ),
    ] = None,
    cluster: ClusterOption = None,
    as_json: JsonOption = False,
) -> None:
    """Store a file as a dataset, atomically: all of it or none of it becomes visible."""
    from quarry.coordinator.membership.listing import DatasetSummary

    c = open_cluster(cluster)
    started = time.perf_counter()
    matrix_format = format if format in MATRIX_FORMATS else None
    if format is None and (path.suffix.lower() == ".h5ad" or path.is_dir()):
        matrix_format = "h5ad" if path.suffix.lower() == ".h5ad" else "mtx"
    if matrix_format is not None:
        from quarry.genes.datasets import ingest_file

        stored = ingest_file(c, path, dataset, matrix_format)
        c.close()
        console.print(
            f"ingested expression matrix {stored.dataset}: {stored.gene_count:,} genes x "
            f"{stored.cell_count:,} cells, {time.perf_counter() - started:.2f} s"
        )
        return
    entry = c.ingest(
        path,
        dataset,
        replicas=replicas,
        compression=compression,
        partitions=partitions,
        mode="append" if append else "create",
        format=format,
        cluster_by=cluster_by,
        redundancy=f"ec:{ec}" if ec else "",
    )
    elapsed = time.perf_counter() - started
    c.close()
    if as_json:
        warned = {"warnings": list(entry.warnings)} if entry.warnings else {}
        print_json({**DatasetSummary.of(entry).to_json(), "seconds": elapsed, **warned})
        return
    for warning in entry.warnings:
        console.print(f"[yellow]warning[/yellow]: {warning}")
    parity = (
        f" + {human_bytes(entry.parity_bytes_stored)} parity ({entry.redundancy})"
        if entry.parity
        else ""
    )
    console.print(
        f"ingested {entry.qualified}: {entry.rows:,} rows in {len(entry.partitions)} "
        f"partitions, {human_bytes(entry.bytes_stored)} stored{parity}, {elapsed:.2f} s"
    )


@app.command()
def datasets(cluster: ClusterOption = None, as_json: JsonOption = False) -> None:
    """List the datasets the devices hold."""
    c = open_cluster(cluster)
    rows = c.datasets()
    c.close()
    if as_json:
        print_json([row.to_json() for row in rows])
        return
    table = Table(title="datasets")
    columns = (
        "dataset",
        "rows",
        "partitions",
        "stored",
        "redundancy",
        "compression",
        "devices",
        "available",
    )
    for column in columns:
        table.add_column(column)
    for row in rows:
        spread = ", ".join(
            f"{d}: {share.partitions} p / {share.rows:,} rows" for d, share in row.devices.items()
        )
        missing = row.unavailable_partitions
        available = "yes"
        if missing:  # rows and partitions count only what answers: say what does not
            held_by = sorted({d for devices in missing.values() for d in devices})
            numbers = ", ".join(str(p) for p in sorted(missing))
            which = f"partitions {numbers} are" if len(missing) > 1 else f"partition {numbers} is"
            available = f"[red]no[/red]: {which} only on {', '.join(held_by)}, which do not answer"
        table.add_row(
            row.dataset,
            f"{row.rows:,}" + (" (partial)" if missing else ""),
            str(row.partitions) + (f" + {len(missing)} missing" if missing else ""),
            human_bytes(row.bytes_stored),
            _redundancy(row),
            row.compression,
            spread,
            available,
        )
    console.print(table)


def _redundancy(row: Any) -> str:
    """How a dataset survives a lost device, and what it reads rebuilt from parity now."""
    if not row.redundancy.startswith("ec:"):
        return row.redundancy
    shown = f"{row.redundancy} (+{human_bytes(row.parity_bytes_stored)} parity)"
    if row.rebuilt_partitions:
        numbers = ", ".join(str(p) for p in row.rebuilt_partitions)
        shown += f"; partitions {numbers} [yellow]rebuilt from parity[/yellow] (quarry repair)"
    return shown


@app.command()
def describe(dataset: str, cluster: ClusterOption = None, as_json: JsonOption = False) -> None:
    """Schema, partitions, slices and placement of one dataset."""
    c = open_cluster(cluster)
    body = c.describe(dataset)
    c.close()
    if as_json:
        print_json(body.to_json())
        return
    console.print(
        f"[bold]{body.dataset}[/bold]: {body.rows:,} rows, {body.partitions} "
        f"partitions, {body.slices} slices, {human_bytes(body.bytes_stored)}"
    )
    for column in body.columns:
        console.print(f"  {column.name}: {column.type}")
    table = Table()
    for column in ("partition", "rows", "slices", "stored", "devices"):
        table.add_column(column)
    for p in body.partitions_detail:
        table.add_row(
            str(p.partition),
            f"{p.rows:,}",
            str(p.slices),
            human_bytes(p.bytes_stored),
            ", ".join(p.devices),
        )
    console.print(table)


@app.command()
def drop(dataset: str, cluster: ClusterOption = None) -> None:
    """Delete a dataset from every device (an expression matrix with its cell and gene
    metadata)."""
    from quarry.genes.datasets import DESCRIPTION_KEY
    from quarry.genes.datasets import drop as drop_matrix

    c = open_cluster(cluster)
    if DESCRIPTION_KEY in c.entry(dataset).metadata:
        deleted = drop_matrix(c, dataset)
    else:
        deleted = c.drop(dataset)
    c.close()
    console.print(f"dropped {dataset} ({deleted} key-values)")


@app.command()
def sql(
    query: Annotated[str, typer.Argument(help="SQL; tables are DOMAIN.NAME or the bare NAME")],
    pushdown: Annotated[
        str, typer.Option(help="never, server (drives read, servers compute), always or auto")
    ] = Pushdown.AUTO,
    format: Annotated[str, typer.Option(help="table, json, csv or parquet")] = "table",
    explain: Annotated[bool, typer.Option(help="show the cut: super-plan and sub-plans")] = False,
    analyze: Annotated[bool, typer.Option(help="run it and show what each device did")] = False,
    verbose: Annotated[
        bool, typer.Option(help="with --explain: the rules that fired, each with the cut after it")
    ] = False,
    output: Annotated[Path | None, typer.Option(help="write the result here")] = None,
    max_rows: Annotated[int, typer.Option(help="rows shown in table format")] = 50,
    cluster: ClusterOption = None,
) -> None:
    """Run SQL on the cluster, pushing work down to the devices."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    if format not in ("table", "json", "csv", "parquet"):
        raise QuarryError(f"--format must be table, json, csv or parquet, not {format!r}")
    if format == "parquet" and output is None:
        raise QuarryError("--format parquet needs --output FILE")
    if verbose and not (explain or analyze):
        raise QuarryError("--verbose shows the rules behind the cut: add --explain (or --analyze)")
    c = open_cluster(cluster)
    planned = c.query(query, pushdown)
    result = None
    if analyze or not explain:
        result = planned.execute().read_all()
    report = planned.explain(analyze, verbose) if (explain or analyze) else None
    c.close()
    if format == "json":
        body: dict[str, Any] = {}
        if result is not None:
            body["result"] = result.to_pylist()
        if report is not None:
            body["explain"] = report.to_json()
        print_json(body, output)
        return
    if report is not None:
        _print_explain(report)
        if verbose:
            _print_rules(report.rules)
    if result is None:
        return
    if format == "parquet":
        pq.write_table(result, output)
        console.print(f"wrote {result.num_rows:,} rows to {output}")
    elif format == "csv":
        if output:
            pacsv.write_csv(result, output)
        else:
            pacsv.write_csv(result, _stdout_sink())
    else:
        _print_result(result, max_rows)


def _stdout_sink() -> Any:
    import pyarrow as pa

    return pa.PythonFile(sys.stdout.buffer, mode="w")


def _print_result(result: Any, max_rows: int) -> None:
    table = Table()
    for name in result.column_names:
        table.add_column(name)
    for row in result.slice(0, max_rows).to_pylist():
        table.add_row(*[_cell(v) for v in row.values()])
    console.print(table)
    more = f" (first {max_rows} shown)" if result.num_rows > max_rows else ""
    console.print(f"{result.num_rows:,} rows{more}")


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "NULL" if value is None else str(value)


def _rows_below(table: Table, below: tuple[LevelRow, ...], above: str, depth: int) -> None:
    """The devices behind a storage server, indented under it, at every depth."""
    for row in (r for r in below if r.above == above):
        table.add_row(*_device_row(row.counters, f"{'  ' * (depth - 1)}└ {row.device}", ""))
        _rows_below(table, below, row.device, depth + 1)


def _device_row(counted: WorkCounters, name: str, partitions: str) -> list[str]:
    return [
        name,
        partitions,
        str(counted.slices_pruned),
        str(counted.slices_answered),
        str(counted.slices_scanned),
        str(counted.slices_executed),
        str(counted.slices_pushed_back),
        str(counted.slices_verified),
        f"{counted.rows_read:,}",
        human_bytes(counted.bytes_read)
        + (f" ({human_bytes(counted.bytes_cached)} cached)" if counted.bytes_cached else ""),
        human_bytes(counted.bytes_shipped),
        f"{counted.device_cpu_s:.3f}",
    ]


def _print_explain(report: Explain) -> None:
    console.rule(f"plan (pushdown {report.pushdown})")
    console.print(report.plan, highlight=False, markup=False)
    if report.cost_model:
        _print_cost_model(report.cost_model)
    for pair in report.join_filters:
        outcome = f": {pair.outcome}" if pair.outcome is not None else ""
        console.print(f"join keys: {pair.filter}{outcome}", highlight=False, markup=False)
    if report.analyze is not None:
        _print_analyzed(report.analyze)


def _print_analyzed(analyzed: Analyze) -> None:
    table = Table(title="what each device did")
    columns = (
        "device",
        "partitions",
        "pruned",
        "answered",
        "scanned",
        "executed",
        "pushed back",
        "verified",
        "rows read",
        "bytes read",
        "bytes shipped",
        "device cpu s",
    )
    for column in columns:
        table.add_column(column, justify="right")
    levels = analyzed.levels
    below = levels.drives if levels is not None else ()
    for d in analyzed.devices:
        table.add_row(*_device_row(d.counters, d.device, str(d.partitions)))
        _rows_below(table, below, d.device, 1)
    console.print(table)
    for name, counted in [(d.device, d.counters) for d in analyzed.devices] + [
        (row.device, row.counters) for row in below
    ]:
        by = counted.pushed_back_by()
        if by:  # why work came back, per device (a drive behind a server, too)
            console.print(f"{name}: {pushed_back_words(by)}", highlight=False)
    for d in analyzed.devices:
        for fallback in d.fallbacks:
            console.print(f"[yellow]{d.device}[/yellow]: {fallback}")
        if d.counters.slices_rejected:  # a damaged copy: read from a replica instead
            damaged = [f["error"] for f in d.failovers if "error" in f]
            console.print(
                f"[red]{d.device}[/red]: {d.counters.slices_rejected} damaged copies rejected, "
                f"read from a replica instead: {escape('; '.join(dict.fromkeys(damaged)))}"
            )
    if levels is not None:
        console.print(
            f"drive links {human_bytes(levels.drive_links_bytes)}, network "
            f"{human_bytes(levels.network_bytes)}; cpu: drives {levels.drives_cpu_s:.3f} s, "
            f"servers {levels.servers_cpu_s:.3f} s"
        )
    if analyzed.host_decode_s >= 0.0005:
        console.print(
            f"host cpu decompressing raw slices shipped as stored: {analyzed.host_decode_s:.3f} s"
        )
    console.print(
        f"host cpu {analyzed.host_cpu_s:.3f} s, wall {analyzed.wall_s:.3f} s, "
        f"{human_bytes(analyzed.bytes_shipped)} shipped to the host, "
        f"{analyzed.rows:,} result rows"
    )
    if analyzed.super_plan_rerun:
        console.print(f"super-plan: {analyzed.super_plan_rerun}", highlight=False)
    turn = analyzed.host_turn
    if turn is not None and turn.waited_s >= 0.001:
        console.print(f"waited {turn.waited_s:.3f} s for a host turn (long queries take turns)")
    for line in analyzed.time.render():
        console.print(line, highlight=False, markup=False)


def _print_rules(fired: tuple[RuleFired, ...]) -> None:
    """EXPLAIN VERBOSE: each rule that fired, in order, and the cut it left."""
    console.rule(f"rules that fired, in order ({len(fired)})")
    if not fired:
        console.print("none: the cut is the plan as DataFusion made it", highlight=False)
    for number, step in enumerate(fired, 1):
        console.print(f"rule {number}: {step.rule}", highlight=False, markup=False)
        for line in step.plan.splitlines():
            console.print(f"  {line}", highlight=False, markup=False, soft_wrap=True)


CUTS_SHOWN = STAGES_BY_DATA_SHIPPED  # the cost model's cuts, least data moved first
SHIPPED_RATIO_OF_CUT: dict[Stage, Callable[[SubPlanFigures], float]] = {
    Stage.FULL: lambda figures: figures.output_ratio,
    Stage.FILTER: lambda figures: figures.filter_ratio,
    Stage.RAW: lambda figures: figures.raw_ratio,
}


def _print_cost_model(cost_model: Mapping[str, CutChosen]) -> None:
    """The cut `auto` chose for each fragment, beside what the model estimated for every cut and
    the sampled figures those estimates rest on (`CutChosen` in quarry.coordinator.query.explain).
    One row per cut rather than one column keeps the table inside 80 columns."""
    table = Table(
        title="cost model: the cut per fragment",
        caption="* the cut chosen; host s/byte: the whole sub-plan on the host, per stored byte",
    )
    table.add_column("fragment", no_wrap=True)
    table.add_column("cut", no_wrap=True)
    table.add_column("estimated s", justify="right")
    table.add_column("shipped/stored", justify="right")
    for fragment, choice in cost_model.items():
        chosen = choice.cut
        assert chosen in CUTS_SHOWN, f"fragment {fragment}: unknown cut {chosen!r}"
        estimates_s = choice.estimates_s
        figures = choice.figures
        # what sampling a slice on the host measured: it prices the host's side of every cut
        left = [escape(fragment), f"host {figures.full_s_per_byte:.3g} s/byte", ""]
        for index, cut in enumerate(CUTS_SHOWN):
            ratio = f"{SHIPPED_RATIO_OF_CUT[cut](figures):.3g}"
            if cut not in estimates_s:  # not offered: a filter-only fragment has no filter cut
                row = (cut.value, "-", ratio)
            elif cut == chosen:
                row = (f"[bold]{cut} *[/bold]", f"[bold]{estimates_s[cut]:.3g}[/bold]", ratio)
            else:
                row = (cut.value, f"{estimates_s[cut]:.3g}", ratio)
            table.add_row(left[index], *row, end_section=cut == CUTS_SHOWN[-1])
    console.print(table)


@app.command()
def demo(
    rows: Annotated[int, typer.Option(help="particles to generate")] = 4_000_000,
    devices: Annotated[int, typer.Option(help="device processes")] = 4,
    profile: Annotated[str, typer.Option(help="device profile")] = "host",
) -> None:
    """Start a local cluster, store a particle-simulation table, show where it went."""
    from quarry.demo import run_demo

    run_demo(console, rows=rows, devices=devices, profile=profile)


@app.command()
def calibrate(cluster: ClusterOption = None, as_json: JsonOption = False) -> None:
    """Measure every device's compute factor and bandwidths (stored with the cluster), then the
    host's own (its profile's compute factor and ingress link, from ``quarry up
    --host-profile``)."""
    c = open_cluster(cluster)
    reports = [*c.calibrate(), c.calibrate_host()]
    c.close()
    if as_json:
        print_json([r.to_json() for r in reports])
        return
    table = Table(title="calibration: expected (profile) vs measured")
    for column in ("device", "profile", "compute factor", "internal read", "external link"):
        table.add_column(column, justify="right")

    def cell(entry: Measured, bandwidth: bool) -> str:
        fmt = (lambda v: f"{v / 1e6:,.0f} MB/s") if bandwidth else (lambda v: f"{v:.2f}x")
        if bandwidth and entry.expected is None and not entry.measured:
            return "-"
        expected = "unlimited" if entry.expected is None else fmt(entry.expected)
        mark = {True: "[green]ok[/green]", False: "[red]off[/red]", None: ""}[
            entry.within_10_percent
        ]
        if not entry.settled:
            mark = f"[yellow]unsettled after {entry.attempts} tries: the machine is busy[/yellow]"
        return f"{expected} / {fmt(entry.measured)} {mark}"

    for r in reports:
        table.add_row(
            r.device,
            r.profile,
            cell(r.compute_factor, False),
            cell(r.internal_bytes_per_s, True),
            cell(r.external_bytes_per_s, True),
        )
    console.print(table)


# ---- device --------------------------------------------------------------------------------------


@device_app.command("serve")
def device_serve(
    data: Annotated[Path, typer.Option(help="folder for this device's key-value store")],
    port: Annotated[int, typer.Option(help="port to listen on (0: any free port)")] = 0,
    profile: Annotated[str, typer.Option(help="resource profile")] = "host",
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    name: Annotated[
        str | None, typer.Option(help="device name (default: data folder name)")
    ] = None,
    ready_file: Annotated[
        Path | None, typer.Option(help="write address here once listening")
    ] = None,
    profiles: Annotated[str | None, typer.Option(help="TOML file of user-defined profiles")] = None,
    credentials: Annotated[
        Path | None,
        typer.Option(
            help="this device's own folder (quarry device enroll; quarry up makes one per "
            "device): its certificate, the key that checks tokens, its credential"
        ),
    ] = None,
    tls: Annotated[bool, typer.Option(help="serve over TLS (required off loopback)")] = False,
    insecure: Annotated[
        bool, typer.Option(help="check no token (loopback experiments only)")
    ] = False,
    verify_clients: Annotated[
        bool,
        typer.Option(
            help="with --tls, require a certificate the cluster's CA signed of every caller "
            "(devices and the admin's machine have one; a handed-out token alone then cannot "
            "connect)"
        ),
    ] = False,
    host_label: Annotated[
        str | None,
        typer.Option(
            help="the host it runs on, its failure domain (default: this machine's name): no "
            "two replicas of a partition share one while enough exist"
        ),
    ] = None,
    rack: Annotated[str | None, typer.Option(help="its rack, a failure domain too")] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            help="serve Prometheus metrics on this port (0: any free one), on the --host "
            "address and under its --tls (docs/operations.md)"
        ),
    ] = None,
) -> None:
    """Run one device: an Arrow Flight server over an LMDB key-value store."""
    from quarry.device.__main__ import without_huge_pages
    from quarry.device.server import serve_with

    without_huge_pages()
    serve_with(
        data,
        port,
        profile,
        host,
        name,
        ready_file,
        profiles,
        credentials,
        tls,
        insecure,
        verify_clients,
        host_label,
        rack,
        metrics_port,
    )


@device_app.command("enroll")
def device_enroll(
    name: Annotated[str, typer.Argument(help="the device's name")],
    host: Annotated[
        list[str],
        typer.Option(
            help="an address the device is reached at (IP or DNS name) for its certificate; "
            "repeat for more"
        ),
    ],
    output: Annotated[Path, typer.Option(help="the folder to write: copy it to the device")],
    rack: Annotated[str, typer.Option(help="its rack, a failure domain (optional)")] = "",
    host_label: Annotated[
        str | None,
        typer.Option(help="the host it runs on, a failure domain (default: the first --host)"),
    ] = None,
    ttl: Annotated[
        float, typer.Option(help="seconds its credential lives (default: a year, as its cert)")
    ] = 365 * 86_400.0,
    folder: Annotated[Path, typer.Option(help="the cluster's authority (quarry init)")] = Path(
        DEFAULT_DATA
    )
    / "credentials",
) -> None:
    """Issue a device's own credentials folder, to copy to its storage host: its key and
    certificate (for its addresses), the CA certificate, the public key that checks tokens, a
    credential of role device, its labels. Nothing in it signs."""
    from quarry.auth.credentials import Credentials, is_older, older_message
    from quarry.auth.enrollment import enroll

    if is_older(folder):
        raise ClusterError(older_message(folder))
    authority = Credentials(folder)
    if not authority.signing_key_file.exists():
        raise ClusterError(f"no cluster authority in {folder}: run quarry init --folder {folder}")
    device = enroll(authority, name, tuple(host), output, rack, host_label, ttl)
    labels = device.labels()
    console.print(
        f"enrolled {name} in {device.folder} (host {labels.host or '-'}, rack "
        f"{labels.rack or '-'}). Copy the folder to the device's host, owner-only, and run "
        "there:\n  quarry device serve --data DATA --credentials FOLDER --tls --host 0.0.0.0 "
        "--port PORT"
    )


@app.command()
def repair(
    bandwidth: Annotated[
        float, typer.Option(help="MB/s the copies may use, so foreground queries keep going")
    ] = 200.0,
    dry_run: Annotated[bool, typer.Option(help="only list what is under-replicated")] = False,
    watch: Annotated[
        float | None,
        typer.Option(help="keep watching: repair once a device has been gone this many seconds"),
    ] = None,
    cluster: ClusterOption = None,
    as_json: JsonOption = False,
) -> None:
    """Copy under-replicated partitions from surviving replicas to restore their count."""
    c = open_cluster(cluster)
    try:
        if dry_run:
            short = [d.to_json() for d in c.deficits()]
            if as_json:
                print_json(short)
            else:
                console.print(short or "nothing to repair")
            return
        if watch is not None:
            _watch(c, watch, bandwidth * 1e6)
            return
        report = c.repair(bandwidth * 1e6)
    finally:
        c.close()
    if as_json:
        print_json(report.to_json())
        return
    for copy in report.copied:
        console.print(
            f"copied {copy['dataset']} partition {copy['partition']} to {copy['to']} "
            f"({human_bytes(copy['bytes'])})"
        )
    for failure in report.failed:
        console.print(f"[red]could not copy[/red] {failure}")
    for lost in report.unavailable:
        console.print(
            f"[red]unavailable[/red] {lost['dataset']} partition {lost['partition']}: no "
            "replica answers; start its devices (quarry device restart)"
        )
    console.print(
        f"{len(report.copied)} partitions copied, {human_bytes(report.bytes_copied)} in "
        f"{report.seconds:.1f} s"
    )


WATCH_PERIOD_S = 5.0


@app.command()
def scrub(
    bandwidth: Annotated[
        float | None,
        typer.Option(
            help="MiB/s each device reads (and copies) at most, so queries keep their drives "
            f"(default: {settings.SCRUB_MIB_PER_S.name}, {settings.SCRUB_MIB_PER_S.default:g})"
        ),
    ] = None,
    no_repair: Annotated[
        bool, typer.Option("--no-repair", help="only check: leave damaged copies as found")
    ] = False,
    watch: Annotated[
        float | None,
        typer.Option(
            help="keep scrubbing in the background, a new pass this many seconds "
            "after each ends (off by default; Ctrl-C stops)"
        ),
    ] = None,
    cluster: ClusterOption = None,
    as_json: JsonOption = False,
) -> None:
    """Read every slice of every device on the device itself, check checksums and zone maps
    against the data, and mend damaged copies from good ones (docs/integrity.md)."""
    from quarry.progress import Bar

    mib_per_s = bandwidth if bandwidth is not None else settings.SCRUB_MIB_PER_S.get()
    if mib_per_s <= 0:
        raise typer.BadParameter("--bandwidth must be above 0 MiB/s")
    c = open_cluster(cluster)
    try:
        while True:
            with Bar("scrub", None, "slices", enabled=None if not as_json else False) as bar:
                report = c.scrub(mib_per_s * (1 << 20), _progress(bar), mend=not no_repair)
            if as_json:
                print_json(report.to_json())
            else:
                _print_scrub(report)
            if watch is None:
                break
            time.sleep(watch)
    except KeyboardInterrupt:
        pass
    finally:
        c.close()
    unmended = report.repair.unmended if report.repair is not None else []
    if watch is None and (unmended or (report.repair is None and report.corrupt)):
        raise typer.Exit(1)  # damage left as it was found


def _progress(bar: Any) -> Callable[[int, int], None]:
    """A scrub's ``progress(done, total)`` onto a bar that learns its total from it."""
    told_before = [0]

    def told(done: int, total: int) -> None:
        bar.total = total
        bar.advance(done - told_before[0])
        told_before[0] = done

    return told


def _print_scrub(report: Any) -> None:
    for device in report.devices:
        if device.error is not None:
            console.print(f"[yellow]{device.device}[/yellow]: not scrubbed: {device.error}")
            continue
        found = f"[red]{len(device.corrupt)} damaged[/red]" if device.corrupt else "clean"
        extra = ""
        if device.zone_maps_fixed:
            extra += f", {device.zone_maps_fixed} zone maps rewritten from their rows"
        if device.catalogs_fixed:
            extra += f", {device.catalogs_fixed} catalog entries rebuilt"
        if device.unverified:
            extra += f", {device.unverified} slices unverified (written before checksums)"
        console.print(
            f"{device.device}: {device.slices:,} slices, {human_bytes(device.bytes_read)} in "
            f"{device.seconds:.1f} s: {found}{extra}"
        )
        for copy in device.corrupt:
            console.print(f"  {copy.detail}")
    repaired = report.repair
    if repaired is not None:
        for mended in repaired.mended:
            source = f" from {mended.source}" if mended.source else ""
            console.print(f"mended on {mended.copy.device}: {mended.how}{source}")
        for copy in repaired.copied:
            console.print(f"copied {copy['dataset']} partition {copy['partition']} to {copy['to']}")
        for left in repaired.unmended:
            console.print(f"[red]not mended[/red] on {left.copy.device}: {left.error}")
    console.print("clean" if report.clean else f"{report.corrupt} damaged copies found")


def _watch(c: Any, after_s: float, bandwidth_bytes_per_s: float) -> None:
    """An automatic repair: once a device has not answered for ``after_s``, copy what it held
    elsewhere. Runs until interrupted."""
    gone_since: dict[str, float] = {}
    console.print(f"watching; repairing after a device is gone {after_s:.0f} s (Ctrl-C stops)")
    try:
        while True:
            c.refresh()
            now = time.monotonic()
            gone_since = {name: gone_since.get(name, now) for name in c.down}
            if any(now - since >= after_s for since in gone_since.values()) and c.deficits():
                report = c.repair(bandwidth_bytes_per_s)
                console.print(f"repair: {len(report.copied)} partitions copied")
            time.sleep(WATCH_PERIOD_S)
    except KeyboardInterrupt:
        pass


@device_app.command("restart")
def device_restart(name: str, cluster: ClusterOption = None) -> None:
    """Start a stopped device of this cluster again, on its data and address."""
    from quarry.coordinator.membership.cluster_file import ClusterFile
    from quarry.coordinator.processes.spawn import restart_detached

    file = cluster_file(cluster)
    listed = ClusterFile.read(file)
    started = restart_detached(_listed_device(listed, name, file))
    listed.with_device(started).write(file)
    console.print(f"started {name} (pid {started.pid}) at {started.address}")


def _listed_device(listed: ClusterFile, name: str, file: Path) -> DeviceSpec:
    """The entry of device ``name`` in the cluster file read from ``file``."""
    known = [d.name for d in listed.devices]
    if name not in known:
        raise ClusterError(f"no device {name!r} in {file}: {', '.join(known)}")
    return listed.device(name)


@device_app.command("remove")
def device_remove(
    name: str,
    force: Annotated[
        bool, typer.Option(help="remove it even if it holds the only replica")
    ] = False,
    cluster: ClusterOption = None,
) -> None:
    """Take a device out of the cluster for good: after `quarry device drain` it holds nothing
    and nothing needs repair; otherwise `quarry repair` restores replicas."""
    from quarry.coordinator.membership.cluster_file import ClusterFile
    from quarry.coordinator.processes.spawn import stop_device

    file = cluster_file(cluster)
    listed = ClusterFile.read(file)
    spec = _listed_device(listed, name, file)
    if len(listed.devices) == 1:
        raise ClusterError(f"{name} is the cluster's only device")
    c = open_cluster(cluster)
    only = sorted(
        f"{entry.qualified} partition {p.partition}"
        for entry in c.catalog.values()
        for p in entry.partitions
        if p.devices == [name]
    )
    c.close()  # its catalog is still read below
    if only and not force:
        raise ClusterError(
            f"{name} holds the only replica of {len(only)} partition(s) ({', '.join(only[:3])}"
            f"{' ...' if len(only) > 3 else ''}): drain it first (quarry device drain "
            f"{name}), or --force to lose them"
        )
    held = sum(1 for entry in c.catalog.values() for p in entry.partitions if name in p.devices)
    if spec.pid is not None:
        stop_device(spec)
    listed.without(name).write(file)
    if held:
        console.print(f"removed {name}; `quarry repair` copies what it held to the others")
    else:
        console.print(f"removed {name}; it held no partition: nothing to repair")


BandwidthOption = Annotated[
    float, typer.Option(help="MB/s the copies may use, so foreground queries keep going")
]


def _print_rebalance(report: RebalanceReport, as_json: bool) -> None:
    if as_json:
        print_json(report.to_json())
        return
    for failure in report.failed:
        console.print(f"[red]could not move[/red] {failure.to_json()}")
    copied = sum(1 for m in report.moved if m.target is not None)
    console.print(
        f"{copied} replica(s) moved of {report.replicas} ({report.moved_fraction:.1%}), "
        f"{human_bytes(report.bytes_copied)} in {report.seconds:.1f} s"
    )


@device_app.command("add")
def device_add(
    address: Annotated[
        str, typer.Argument(help="where the running device listens: grpc+tls://HOST:PORT")
    ],
    name: Annotated[
        str | None, typer.Option(help="the name it is added under (it must call itself so)")
    ] = None,
    rebalance: Annotated[bool, typer.Option(help="give it its share of the partitions now")] = True,
    bandwidth: BandwidthOption = 200.0,
    cluster: ClusterOption = None,
    folder: Annotated[
        Path,
        typer.Option(help="the cluster's authority, for the first device (no cluster file yet)"),
    ] = Path(DEFAULT_DATA) / "credentials",
    as_json: JsonOption = False,
) -> None:
    """Introduce a running device to this cluster: its certificate is checked against the
    cluster's CA and it checks the cluster's token; then it is added to the cluster file, and
    a rebalance moves its share of the partitions to it. The first device after `quarry init`
    starts the cluster file."""
    if not cluster_file(cluster).exists():
        _found_cluster(cluster_file(cluster), folder, address, name, as_json)
        return
    c = open_cluster(cluster)
    try:
        spec = c.add_device(address, name)
        report = c.rebalance(bandwidth * 1e6) if rebalance else None
    finally:
        c.close()
    # what it is, not how the cluster's entries reach it (a token may be among those)
    added = {"name": spec.name, "address": spec.address, "host": spec.host, "rack": spec.rack}
    if as_json:
        print_json({"device": added, **(report.to_json() if report is not None else {})})
        return
    where = f"host {spec.host}" + (f", rack {spec.rack}" if spec.rack else "")
    console.print(f"added {spec.name} at {spec.address} ({where})")
    if report is not None:
        _print_rebalance(report, as_json)


def _found_cluster(path: Path, folder: Path, address: str, name: str | None, as_json: bool) -> None:
    """The cluster file started with its first device, entered as ``device add`` enters any."""
    from quarry.coordinator.membership.cluster_file import ClusterFile
    from quarry.coordinator.membership.joining import founding

    spec = founding(folder, address, name)
    ClusterFile((spec,)).write(path)
    added = {"name": spec.name, "address": spec.address, "host": spec.host, "rack": spec.rack}
    if as_json:
        print_json({"device": added})
        return
    where = f"host {spec.host}" + (f", rack {spec.rack}" if spec.rack else "")
    console.print(f"added {spec.name} at {spec.address} ({where}): the cluster file {path}")


@device_app.command("drain")
def device_drain(
    name: str,
    bandwidth: BandwidthOption = 200.0,
    undo: Annotated[bool, typer.Option(help="take a drained device back")] = False,
    cluster: ClusterOption = None,
    as_json: JsonOption = False,
) -> None:
    """Move a device's partitions to where placement without it puts them, and keep new ones
    off it: `quarry device remove` then needs no repair."""
    c = open_cluster(cluster)
    try:
        report = c.drain(name, bandwidth * 1e6, undo=undo)
    finally:
        c.close()
    _print_rebalance(report, as_json)
    if not as_json and not undo and not report.failed:
        console.print(f"{name} is drained: `quarry device remove {name}` needs no repair")


@app.command()
def rebalance(
    bandwidth: BandwidthOption = 200.0,
    dry_run: Annotated[bool, typer.Option(help="only list what would move")] = False,
    watch: Annotated[
        bool,
        typer.Option(help="keep watching: move partitions whenever placement changes"),
    ] = False,
    cluster: ClusterOption = None,
    as_json: JsonOption = False,
) -> None:
    """Move partitions, online and at a bounded rate, to where placement puts them now (a
    device added or drained, hosts relabelled); never on fewer devices than their replicas."""
    c = open_cluster(cluster)
    try:
        if watch:
            _watch_placement(c, bandwidth * 1e6)
            return
        report = c.rebalance(bandwidth * 1e6, dry_run=dry_run)
    finally:
        c.close()
    if dry_run and not as_json:
        for move in report.planned:
            console.print(
                f"{move.dataset} partition {move.partition}: {move.source or '-'} -> "
                f"{move.target or '-'} ({human_bytes(move.bytes_arrow)})"
            )
        console.print(f"{len(report.planned)} move(s) planned")
        return
    _print_rebalance(report, as_json)


def _watch_placement(c: Any, bandwidth_bytes_per_s: float) -> None:
    """A rebalance whenever placement says a partition belongs elsewhere (a device added from
    another machine, one drained): until interrupted."""
    console.print("watching placement (Ctrl-C stops)")
    try:
        while True:
            if c.rebalance(dry_run=True).planned:
                report = c.rebalance(bandwidth_bytes_per_s)
                console.print(f"rebalance: {len(report.moved)} replica(s) moved")
            time.sleep(WATCH_PERIOD_S)
    except KeyboardInterrupt:
        pass


def _authority(listed: ClusterFile) -> Credentials:
    """The cluster's authority a cluster file names (the admin's machine)."""
    from quarry.auth.credentials import Credentials

    folder = next((d.credentials for d in listed.devices if d.credentials), None)
    if folder is None:
        raise ClusterError("this cluster file names no credentials: ask the cluster's admin")
    return Credentials(Path(folder))


@token_app.command("create")
def token_create(
    role: Annotated[str, typer.Option(help="reader, writer or admin")] = "reader",
    ttl: Annotated[float, typer.Option(help="seconds it lives (default: a day)")] = 86_400.0,
    output: Annotated[
        Path | None, typer.Option(help="write a cluster file that carries the new token")
    ] = None,
    cluster: ClusterOption = None,
) -> None:
    """Hand out a token: print it, or write a cluster file that carries it (owner-only). Its
    id and expiry go to stderr (quarry token revoke ID)."""
    from quarry.auth.tokens import TOKEN_TTL_S_MAX, Role, read_claims, when
    from quarry.coordinator.membership.cluster_file import ClusterFile

    if role not in ("reader", "writer", "admin"):
        raise QuarryError(f"--role must be reader, writer or admin, not {role!r}")
    if not 0 < ttl <= TOKEN_TTL_S_MAX:
        raise QuarryError(f"--ttl must be more than 0 and at most {TOKEN_TTL_S_MAX:.0f} s")
    listed = ClusterFile.read(cluster_file(cluster))
    token = _authority(listed).token(Role(role), ttl)
    claims = read_claims(token)
    errors.print(f"{role} token {claims.id}, expires at {when(claims.expires_at)}")
    if output is None:
        sys.stdout.write(token + "\n")
        return
    # what stays on the admin's machine (the credentials, where the processes run) is left out
    private = {"credentials": None, "token_file": None, "pid": None, "data": None}
    handed = [replace(d, **private, profiles_file=None, token=token) for d in listed.devices]
    ClusterFile(tuple(handed)).write(output)
    console.print(f"wrote {output}: a cluster file with a {role} token")


@token_app.command("revoke")
def token_revoke(
    token_id: Annotated[
        str | None, typer.Argument(help="the token's id (quarry token create prints it)")
    ] = None,
    file: Annotated[
        Path | None,
        typer.Option(
            help="revoke the token in this file: a token, or a cluster file that carries one "
            "(a device's device.token too)"
        ),
    ] = None,
    cluster: ClusterOption = None,
) -> None:
    """Revoke a token: sign a new revocation list and push it to every device. A device that
    does not answer now learns it from its peers once back (within $QUARRY_REVOCATION_SYNC_S,
    docs/security.md)."""
    from quarry.coordinator.admin.revocations import every, push
    from quarry.coordinator.membership.cluster_file import ClusterFile
    from quarry.coordinator.membership.membership import client_of
    from quarry.errors import QuarryError as Failed

    listed = ClusterFile.read(cluster_file(cluster))
    authority = _authority(listed)
    entry = _revoked_entry(token_id, file, authority)
    held = authority.revoke((entry,))
    console.print(f"revoked {entry.id}: revocation list version {held.version}")
    specs = every(listed.devices)
    clients = {spec.name: client_of(spec) for spec in specs}
    try:
        results = push(clients, held, {spec.name: spec.address for spec in specs})
    finally:
        for client in clients.values():
            client.close()
    for name, result in results.items():
        if isinstance(result, Failed):
            console.print(
                f"[yellow]{name}: not reached[/yellow] ({result}): it learns the list from its "
                f"peers within ${settings.REVOCATION_SYNC_S.name} once back"
            )
        else:
            console.print(f"{name}: holds version {result.version}")


def _revoked_entry(token_id: str | None, file: Path | None, authority: Credentials) -> RevokedToken:
    """What to revoke: an id (kept as long as any token may live: its own expiry is not
    known), or the token in a file, checked as this cluster's, kept until it expires."""
    from quarry.auth.tokens import read_claims, verify
    from quarry.protocol.control import TOKEN_ID_CHARS_MAX, RevokedToken

    if (token_id is None) == (file is None):
        raise QuarryError("give the token's id, or --file FILE holding the token (one of them)")
    if token_id is not None:
        if not token_id or len(token_id) > TOKEN_ID_CHARS_MAX or not token_id.isalnum():
            raise QuarryError(f"{token_id!r} is not a token id (quarry token create prints it)")
        from quarry.auth.revocation import unknown_expiry

        return RevokedToken(token_id, unknown_expiry())
    assert file is not None
    token = _token_in(file)
    verify(authority.verify_key(), token, now=0.0)  # this cluster's (expired or not)
    claims = read_claims(token)
    return RevokedToken(claims.id, claims.expires_at)


def _token_in(file: Path) -> str:
    """The token a file holds: the file's text, or a cluster file's first inline token."""
    from quarry.coordinator.membership.cluster_file import ClusterFile

    try:
        text = file.read_text().strip()
    except OSError as error:
        raise QuarryError(f"cannot read {file}: {error}") from None
    if not text.startswith("{"):
        return text
    carried = [d.token for d in ClusterFile.read(file).devices if d.token]
    if not carried:
        raise QuarryError(f"{file} is a cluster file that carries no token")
    return carried[0]


@device_app.command("load")
def device_load(
    device: Annotated[str, typer.Option(help="device name, e.g. dev0")],
    cpu: Annotated[float, typer.Option(help="fraction of the drive's CPU to keep busy, 0..0.99")],
    seconds: Annotated[float, typer.Option(help="how long; the load stops by itself")] = 60.0,
    cluster: ClusterOption = None,
) -> None:
    """Run a bounded background load on a device, to reproduce a busy drive."""
    c = open_cluster(cluster)
    result = c.load(device, cpu, seconds)
    c.close()
    console.print(f"{device}: background load {result.cpu:.0%} for {result.seconds:.0f} s")


@quarantine_app.command("clear")
def quarantine_clear(
    device: Annotated[
        list[str] | None, typer.Option(help="only this device (repeat for more); all by default")
    ] = None,
    cluster: ClusterOption = None,
) -> None:
    """Lift the quarantine of sub-plan shapes whose stage failed on a device before it expires
    ($QUARRY_QUARANTINE_S): the next query of those shapes runs on the device again."""
    c = open_cluster(cluster)
    try:
        cleared = c.clear_quarantine(device or None)
    finally:
        c.close()
    for name, count in cleared.items():
        console.print(f"{name}: {count} quarantined sub-plan shapes lifted")


def _mount_optional() -> None:
    """Sub-commands that live with their feature, each registered once: `quarry de`, and
    `quarry genes ingest|get|collect|drop` for expression matrices."""
    from quarry.capacity.cli import app as capacity_app
    from quarry.genes import cli as genes_cli
    from quarry.offload import cli as offload_cli

    app.add_typer(
        capacity_app, name="capacity", help="Capacity planning for computational storage."
    )
    app.command("de")(genes_cli.de)
    app.command("run")(offload_cli.run_command)
    matrices = typer.Typer(
        no_args_is_help=True, help="Expression matrices: ingest, get (axis queries), collect, drop."
    )
    matrices.command("ingest")(genes_cli.ingest)
    matrices.command("get")(genes_cli.get)
    matrices.command("collect")(genes_cli.collect)
    matrices.command("drop")(genes_cli.drop)
    app.add_typer(matrices, name="genes")


_mount_optional()


def main() -> None:
    run(app)
