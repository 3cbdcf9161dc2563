"""``quarry run SCRIPT``: a plain Python program over stored datasets.

``run`` executes the program line by line in one namespace, its file reads served from quarry
(``reads``), printing what a plain ``python SCRIPT`` would print. ``plan`` is the sampling phase
and Algorithm 1: the program runs quietly on samples at four scales, every line is timed and
fitted, and the lines that pay to run on the devices are chosen; ``quarry run --explain``
shows that cut with every line's estimate.

With ``offload`` other than ``host``, the cut is run (``cut.py``): the first run of moved lines
that starts with a read of a stored dataset runs on the devices as the ``offload.lines`` unit,
the rest here. Push-back and migration of that unit are the next step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quarry.offload import profile
from quarry.offload.assign import Cut, assign
from quarry.offload.cut import Offloaded, block_of, run_with_cut
from quarry.offload.estimate import Devices, LineEstimate, estimate
from quarry.offload.partitions import Check, partitionable
from quarry.offload.program import Program, ProgramError
from quarry.offload.reads import Mounts, Reads

SCALES = (10, 9, 8, 7)  # samples of 2^-10 .. 2^-7 of the rows (§III.A)


@dataclass(frozen=True)
class Plan:
    lines: list[LineEstimate]
    cut: Cut
    devices: Devices
    full_rows: int
    sample_rows: list[int]
    failed: list[str]  # sample runs that raised, where (the lines from there stay on the host)
    check: Check  # the per-partition check: what passed, the whole sample's values, its reads


OFFLOADS = ("auto", "host", "device")


def run(
    script: str | Path,
    cluster: Any,
    argv: Sequence[str] = (),
    mounts: dict[str, str] | None = None,
    offload: str = "auto",
    report: list[Offloaded] | None = None,
) -> dict[str, Any]:
    """Run the program as ``python SCRIPT argv`` would, reading stored datasets; its namespace
    when it ends. ``offload``: ``host`` runs every line here; ``auto`` samples it and runs the
    lines Algorithm 1 moves on the devices; ``device`` moves every line that may move. What
    the devices did is appended to ``report``."""
    if offload not in OFFLOADS:
        raise ProgramError(f"offload must be one of {', '.join(OFFLOADS)}, not {offload!r}")
    program = Program.read(script)
    mount_map = Mounts.of(cluster, mounts)
    if offload != "host":
        planned = plan(script, cluster, argv, mounts)
        if offload == "device":
            planned.cut.device_lines = {line.number for line in planned.lines if line.movable}
        block = block_of(program, planned)
        if block is not None:
            namespace, done = run_with_cut(program, cluster, mount_map, argv, block)
            if report is not None:
                report.append(done)
            return namespace
    return profile.run(program, Reads(cluster, mount_map), argv).namespace


def plan(
    script: str | Path,
    cluster: Any,
    argv: Sequence[str] = (),
    mounts: dict[str, str] | None = None,
    scales: Sequence[int] = SCALES,
) -> Plan:
    """The sampling phase and Algorithm 1: every line's estimate at full scale, and the cut."""
    program = Program.read(script)
    mount_map = Mounts.of(cluster, mounts)
    runs = []
    full_rows = 0
    for scale in scales:
        reads = Reads(cluster, mount_map, every=2**scale)
        runs.append(profile.run(program, reads, argv, quiet=True, tolerate=True))
        full_rows = reads.full_rows
    devices = devices_of(cluster)
    check = partitionable(program, cluster, mount_map, argv, 2 ** min(scales))
    lines = estimate(program.lines, runs, max(1, full_rows), devices, check.passing)
    return Plan(
        lines,
        assign(lines, devices.link_bytes_per_s),
        devices,
        full_rows,
        [r.rows_read for r in runs],
        [r.failed for r in runs if r.failed],
        check,
    )


def devices_of(cluster: Any) -> Devices:
    """C and BW_D2H from the devices' profiles (a device with no link cap: loopback, free)."""
    profiles = [info.profile for info in cluster.info.values()]
    factor = sum(p.compute_factor for p in profiles) / max(1, len(profiles))
    links = [p.external_bytes_per_s for p in profiles]
    link = float("inf") if any(x is None for x in links) else float(sum(links))
    return Devices(len(profiles), factor, link)
