"""`quarry demo`: a local cluster, a particle table, and where it was stored."""

from __future__ import annotations

import time

from rich.console import Console
from rich.table import Table

import quarry
from quarry.cli_common import human_bytes
from quarry.pushdown import Pushdown
from quarry.samples import particles


def run_demo(console: Console, rows: int, devices: int, profile: str) -> None:
    console.rule("[bold]quarry demo")
    console.print(f"starting {devices} local devices (profile {profile}) ...")
    with quarry.local(devices=devices, profile=profile) as cluster:
        console.print(f"generating {rows:,} particles (id, x, y, z, ke) and ingesting ...")
        started = time.perf_counter()
        entry = cluster.ingest(particles.reader(rows), "physics/particles", progress=True)
        elapsed = time.perf_counter() - started
        console.print(
            f"stored [bold]physics/particles[/bold]: {entry.rows:,} rows, "
            f"{human_bytes(entry.bytes_arrow)} in {elapsed:.1f} s "
            f"({human_bytes(entry.bytes_arrow / elapsed)}/s)"
        )
        table = Table(title="where it went")
        for column in ("device", "profile", "partitions", "rows", "slices", "stored"):
            table.add_column(column, justify="right")
        info = cluster.describe("physics/particles")
        per_device: dict[str, list[int]] = {}
        for p in info.partitions_detail:
            for device in p.devices:
                agg = per_device.setdefault(device, [0, 0, 0, 0])
                agg[0] += 1
                agg[1] += p.rows
                agg[2] += p.slices
                agg[3] += p.bytes_stored
        for device, (count, device_rows, slices, stored) in sorted(per_device.items()):
            table.add_row(
                device,
                cluster.info[device].profile.name,
                str(count),
                f"{device_rows:,}",
                str(slices),
                human_bytes(stored),
            )
        console.print(table)
        _queries(console, cluster)
        scanned = cluster.scan("physics/particles").read_all()
        console.print(
            f"full scan back: {scanned.num_rows:,} rows; "
            f"ids intact: {scanned.column('id').to_numpy().sum() == rows * (rows - 1) // 2}"
        )
    console.rule("done")


def _queries(console: Console, cluster: quarry.Cluster) -> None:
    """Kinetic Pipe's two queries at 1% selectivity: what pushing down saves.

    Each query runs once untimed first: a device's first query of a kind pays for starting its
    engine and reading its store cold, and timing that beside a warm mode would credit the
    difference to pushdown."""
    x = particles.ke_threshold(0.01)
    table = Table(
        title=f"queries at 1% selectivity (ke > {x:.2f})",
        caption="each query timed after one untimed run of it: its cold start (engines starting, "
        "stores read cold) is left out",
    )
    for column in ("query", "pushdown", "rows", "seconds", "shipped to host"):
        table.add_column(column, justify="right")
    for sql in (
        f"SELECT * FROM particles WHERE ke > {x}",
        f"SELECT sum(ke) FROM particles WHERE ke > {x}",
    ):
        for mode in (Pushdown.NEVER, Pushdown.ALWAYS, Pushdown.AUTO):
            cluster.query(sql, pushdown=mode).execute().read_all()  # its cold start, untimed
            planned = cluster.query(sql, pushdown=mode)
            started = time.perf_counter()
            rows = planned.execute().read_all().num_rows
            elapsed = time.perf_counter() - started
            analyzed = planned.explain(analyze=True).analyze
            assert analyzed is not None
            shipped = analyzed.bytes_shipped
            table.add_row(
                sql.split(" FROM")[0],
                mode,
                f"{rows:,}",
                f"{elapsed:.2f}",
                human_bytes(shipped),
            )
    console.print(table)
    console.print("the same answers in every mode; see `quarry sql --explain` for the cut")
