"""``quarry run SCRIPT [ARGS]``: a plain Python program over the cluster's datasets."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

from quarry.cli_common import ClusterOption, JsonOption, console, human_bytes, open_cluster
from quarry.cli_common import print_json as print_json_body
from quarry.offload.cut import Offloaded
from quarry.offload.estimate import LineEstimate
from quarry.offload.reads import MountError
from quarry.offload.run import Plan, plan, run

CODE_CHARS_MIN = 40  # a code column narrower than this is unreadable: lines go on rows
err_console = Console(stderr=True)


def run_command(
    script: Annotated[
        Path, typer.Argument(help="a Python script; its reads of files name datasets")
    ],
    args: Annotated[list[str] | None, typer.Argument(help="the script's own arguments")] = None,
    mount: Annotated[
        list[str] | None,
        typer.Option(help="PATH=DOMAIN/NAME: serve reads of PATH from that dataset (repeat)"),
    ] = None,
    explain: Annotated[
        bool, typer.Option(help="sample it at four scales and show which lines would offload")
    ] = False,
    offload: Annotated[
        str,
        typer.Option(
            help="auto (the cut Algorithm 1 chooses), host, or device (every line that may)"
        ),
    ] = "auto",
    migrate: Annotated[
        str,
        typer.Option(
            help="auto (a device hands the rest back when the host would finish sooner), "
            "never, or force (the second half of every partition runs on the host)"
        ),
    ] = "auto",
    json: JsonOption = False,
    cluster: ClusterOption = None,
) -> None:
    """Run an unmodified Python program whose file reads are stored datasets (ActivePy).

    Reads of a file a dataset was ingested from (pd.read_parquet, pq.read_table, pd.read_csv)
    are answered from the devices; anything else reads the file system. The program prints what
    `python SCRIPT ARGS` prints. Pass the script's own options after `--`.
    """
    mounts = _mounts(mount or [])
    c = open_cluster(cluster)
    try:
        if explain:
            planned = plan(script, c, args or [], mounts)
            print_json_body(_plan_json(planned)) if json else _print_plan(planned)
        else:
            done: list = []
            run(script, c, args or [], mounts, offload, done, migrate=migrate)
            for part in done:  # on stderr: standard output is the program's own
                _print_offloaded(part)
    finally:
        c.close()


def _print_offloaded(part: Offloaded) -> None:
    if part.declined is not None:
        err_console.print(
            f"kept lines {list(part.lines)} on the host ({part.declined}): "
            f"{escape(part.declined_reason)}"
        )
        return
    err_console.print(
        f"offloaded lines {list(part.lines)} to {', '.join(part.devices)} in "
        f"{part.wall_s:.2f} s: {human_bytes(part.bytes_read)} read on the devices, "
        f"{human_bytes(part.bytes_shipped)} shipped to the host"
    )
    for m in part.migrations:
        err_console.print(
            f"  migrated ({m.pushed_back or 'raw'}): {m.device} partition {m.partition}, "
            f"{m.slices} of {m.slices_total} slices ran on the host (first done at "
            f"{m.at_s:.2f} s): {escape(m.reason)}"
        )


def _mounts(values: list[str]) -> dict[str, str]:
    mounts = {}
    for value in values:
        path, sep, dataset = value.partition("=")
        if not sep or not path or "/" not in dataset:
            raise MountError(f"--mount {value!r}: expected PATH=DOMAIN/NAME")
        mounts[path] = dataset
    return mounts


def _plan_json(planned: Plan) -> dict[str, Any]:
    return {
        "devices": vars(planned.devices),
        "full_rows": planned.full_rows,
        "sample_rows": planned.sample_rows,
        "sample_failures": planned.failed,
        "host_s": planned.cut.host_s,
        "offloaded_s": planned.cut.csd_s,
        "lines": [
            {
                "line": line.number,
                "text": line.text,
                "time": line.time_fit.curve,
                "output": line.out_fit.curve,
                "host_s": line.host_s,
                "device_s": line.device_s,
                "din_bytes": line.din_bytes,
                "dout_bytes": line.out_bytes,
                "per_partition": line.partitionable,
                "reduction": line.reduction,
                "on": "device" if line.number in planned.cut.device_lines else "host",
                "if_device_s": step.if_device_s,
            }
            for line, step in zip(planned.lines, planned.cut.steps)
        ],
    }


def _split(line: LineEstimate) -> str:
    if line.reduction:
        return "partial"
    return "rows" if line.partitionable else "no"


def _print_plan(planned: Plan, out: Console = console) -> None:
    devices = planned.devices
    link = (
        "unlimited"
        if devices.link_bytes_per_s == float("inf")
        else (f"{human_bytes(devices.link_bytes_per_s)}/s")
    )
    out.print(
        f"sampled {planned.sample_rows} of {planned.full_rows:,} rows; {devices.count} devices, "
        f"C = {devices.compute_factor:g}, links {link}; a probe on the devices took "
        f"{devices.probe_factor:.2f}x their estimate (device times below include it)"
    )
    figures = _lines_table(planned, code=False)
    figures_chars = Measurement.get(out, out.options, figures).maximum
    if out.width - figures_chars >= CODE_CHARS_MIN:
        out.print(_lines_table(planned, code=True))
    else:  # a narrow terminal: the program's lines on rows of their own, then their figures
        out.print(_listing(planned))
        out.print(figures)
    for failure in sorted(set(planned.failed)):
        out.print(f"on a sample: {escape(failure)} (from there, lines run on the host)")
    out.print(
        f"all on the host: {planned.cut.host_s:.3f} s; with the cut: {planned.cut.csd_s:.3f} s "
        "(the devices run the first moved run that starts with a read of a stored dataset)"
    )


def _lines_table(planned: Plan, code: bool) -> Table:
    """Each line's estimates; with ``code``, the line itself in a column of its own, folded
    onto more rows where it is long (never cut: a user reads their own code here)."""
    table = Table(
        title="lines, estimated at full scale (Algorithm 1)",
        caption="split: rows — per partition, concatenated, the line gives what it gives on the "
        "whole; partial — a reduction, its partials combined on the host",
    )
    table.add_column("line", justify="right")
    if code:
        table.add_column("code", overflow="fold", min_width=CODE_CHARS_MIN)
    for column in ("time", "host s", "device s", "in", "out", "split", "on"):
        table.add_column(column, justify="left" if column in ("split", "on") else "right")
    for line in planned.lines:
        text = [escape(" ".join(line.text.split()))] if code else []
        table.add_row(
            str(line.number),
            *text,
            line.time_fit.curve,
            f"{line.host_s:.4f}",
            f"{line.device_s:.4f}",
            human_bytes(line.din_bytes),
            human_bytes(line.out_bytes),
            _split(line),
            "device" if line.number in planned.cut.device_lines else "host",
        )
    return table


def _listing(planned: Plan) -> Table:
    """The program's lines as written, numbered, long ones folded under themselves."""
    listing = Table.grid(padding=(0, 1))
    listing.title = "the program, by line (its estimates below)"
    listing.add_column(justify="right", style="dim")
    listing.add_column(overflow="fold")
    for line in planned.lines:
        listing.add_row(str(line.number), escape(line.text.rstrip()))
    return listing
