"""``quarry run SCRIPT``: a plain Python program over stored datasets.

``run`` executes the program line by line in one namespace, its file reads served from quarry
(``reads``), printing what a plain ``python SCRIPT`` would print. ``plan`` is the sampling phase
and Algorithm 1: the program runs quietly on samples at four scales, every line is timed and
fitted, and the lines that pay to run on the devices are chosen; ``quarry run --explain``
shows that cut with every line's estimate.

With ``offload`` other than ``host``, the cut is run (``cut.py``): the first run of moved lines
that starts with a read of a stored dataset runs on the devices as the ``offload.lines`` unit,
the rest here. While it runs, each device's controller compares its measured rate with the
host's estimate and hands the rest back when that pays (``migrate``, §III.D).
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from quarry.coordinator.query.cost_inputs import calibrated
from quarry.device.unit import host_cores
from quarry.offload import profile
from quarry.offload.assign import Cut, assign
from quarry.offload.cut import (
    Block,
    Migrate,
    NotOffloadable,
    Offloaded,
    blocks_of,
    run_on_devices,
    run_with_cut,
    shipped_values,
)
from quarry.offload.device import OffloadFailed
from quarry.offload.estimate import Devices, LineEstimate, estimate
from quarry.offload.partitions import Check, partitionable
from quarry.offload.program import Program, ProgramError
from quarry.offload.reads import Mounts, Reads

SCALES = (10, 9, 8, 7)  # samples of 2^-10 .. 2^-7 of the rows (§III.A)
SAMPLE_TRIES = 2  # runs per sample: each line's least time counts
SAMPLE_ROWS_MIN = 1 << 16  # rows in the largest sample, when the input has them
PROBE_SLICES = 2  # slices per device the probe runs
INTAKE_BYTES = 32 << 20  # read of a stored dataset timed to learn the host's intake
PROBE_FACTOR_MIN, PROBE_FACTOR_MAX = 0.5, 100.0


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
MIGRATES = ("auto", "never", "force")
LOOPBACK_BYTES_PER_S = 2e9  # a device with no link cap: about what loopback carries


def run(
    script: str | Path,
    cluster: Any,
    argv: Sequence[str] = (),
    mounts: dict[str, str] | None = None,
    offload: str = "auto",
    report: list[Offloaded] | None = None,
    migrate: str = "auto",
    device_lines: Collection[int] | None = None,
    planned: Plan | None = None,
) -> dict[str, Any]:
    """Run the program as ``python SCRIPT argv`` would, reading stored datasets; its namespace
    when it ends. ``offload``: ``host`` runs every line here; ``auto`` samples it and runs the
    lines Algorithm 1 moves on the devices; ``device`` moves every line that may move.
    ``device_lines`` forces a cut instead (of those lines, the ones that may move).
    ``migrate``: ``auto`` lets each device hand the rest back when its measured rate says the
    host would finish sooner; ``never``; ``force`` hands back the second half of every
    partition. What the devices did is appended to ``report``. ``planned``: a plan made
    already (the sampling phase is not run again)."""
    if offload not in OFFLOADS:
        raise ProgramError(f"offload must be one of {', '.join(OFFLOADS)}, not {offload!r}")
    if migrate not in MIGRATES:
        raise ProgramError(f"migrate must be one of {', '.join(MIGRATES)}, not {migrate!r}")
    program = Program.read(script)
    mount_map = Mounts.of(cluster, mounts)
    if offload != "host" or device_lines is not None:
        planned = planned or plan(script, cluster, argv, mounts)
        if device_lines is not None:
            planned.cut.device_lines = {
                line.number for line in planned.lines if line.movable
            } & set(device_lines)
        elif offload == "device":
            planned.cut.device_lines = {line.number for line in planned.lines if line.movable}
        blocks = blocks_of(program, planned)
        if blocks:
            how = [migration(planned, block, migrate) for block in blocks]
            return run_with_cut(program, cluster, mount_map, argv, blocks, how, report)
    return profile.run(program, Reads(cluster, mount_map), argv).namespace


def migration(planned: Plan, block: Block, mode: str) -> Migrate:
    """What each device's controller is told of the host (Eq. 1's terms, per stored byte)."""
    moved = [line for line in planned.lines if line.number in set(block.lines)]
    stored = max(1.0, planned.lines[block.first].stored_bytes)
    devices = planned.devices
    link = devices.link_bytes_per_s / max(1, devices.count)
    # a line's device time is spread over the devices: each runs its share of the bytes
    device_s = sum(line.device_s for line in moved) * max(1, devices.count)
    return Migrate(
        mode=mode,
        host_s_per_byte=sum(line.host_s for line in moved) / stored,
        device_s_per_byte=device_s / stored,
        link_bytes_per_s=link if link != float("inf") else LOOPBACK_BYTES_PER_S,
    )


def plan(
    script: str | Path,
    cluster: Any,
    argv: Sequence[str] = (),
    mounts: dict[str, str] | None = None,
    scales: Sequence[int] | None = None,
) -> Plan:
    """The sampling phase and Algorithm 1: every line's estimate at full scale, and the cut.
    ``scales``: the samples, as powers of two of the rows (default: ``sample_scales``)."""
    program = Program.read(script)
    mount_map = Mounts.of(cluster, mounts)
    runs = []
    full_rows = 0
    samples: dict = {}  # each sample drawn once, its runs timed twice
    if scales is None:
        scales = sample_scales(program, cluster, mount_map, argv, samples)
    for scale in scales:
        tries = []
        for _ in range(SAMPLE_TRIES):
            reads = Reads(cluster, mount_map, every=2**scale, cache=samples)
            tries.append(profile.run(program, reads, argv, quiet=True, tolerate=True))
        runs.append(profile.least(tries))
        full_rows = reads.full_rows
    check = partitionable(program, cluster, mount_map, argv, 2 ** min(scales))
    devices = devices_of(cluster, intake_rate(cluster, {r.dataset for r in check.reads}))
    lines = estimate(
        program.lines, runs, max(1, full_rows), devices, check.passing, set(check.reductions)
    )
    planned = Plan(
        lines,
        assign(lines, devices.link_bytes_per_s),
        devices,
        full_rows,
        [r.rows_read for r in runs],
        [r.failed for r in runs if r.failed],
        check,
    )
    return probed(planned, program, cluster, argv, runs[-1].namespace)


def probed(
    planned: Plan, program: Program, cluster: Any, argv: Sequence[str], namespace: dict
) -> Plan:
    """The devices' time measured: the first block the cut moved runs on a slice of one
    partition per device, and every line's device time is scaled by what that showed against
    the estimate (the offload path's own costs: a worker's round trip, pandas on a slice's
    rows). Algorithm 1 then cuts again with it."""
    blocks = blocks_of(program, planned)
    if not blocks:
        return planned
    block = blocks[0]
    try:
        payload = shipped_values(block, namespace)
        _, done = run_on_devices(
            cluster, program, block, argv, Migrate("never"), payload, probe_slices=PROBE_SLICES
        )
    except (NotOffloadable, OffloadFailed):
        return planned  # the run itself will say, or keep the block here
    rows = max(1, cluster.entry(block.dataset).rows)
    moved = {program.lines[block.first].number, *block.lines}
    host_s = sum(line.host_s for line in planned.lines if line.number in moved)
    expected = host_s * planned.devices.compute_factor * done.rows_read / rows
    if expected <= 0 or done.drive_s <= 0:
        return planned
    factor = min(PROBE_FACTOR_MAX, max(PROBE_FACTOR_MIN, done.drive_s / expected))
    factor *= shared_cores_factor(cluster, planned.devices)
    lines = [replace(line, device_s=line.device_s * factor) for line in planned.lines]
    devices = replace(planned.devices, probe_factor=factor)
    return replace(
        planned, lines=lines, devices=devices, cut=assign(lines, devices.link_bytes_per_s)
    )


def shared_cores_factor(cluster: Any, devices: Devices) -> float:
    """Devices emulated on this machine share its cores: their real CPU (1/C of their time)
    runs ``count / cores`` times slower when every device works at once."""
    if not getattr(cluster, "devices_on_this_machine", False):
        return 1.0
    crowding = max(1.0, devices.count / host_cores())
    c = max(1.0, devices.compute_factor)
    return (crowding + c - 1.0) / c


def sample_scales(
    program: Program, cluster: Any, mounts: Mounts, argv: Sequence[str], samples: dict
) -> tuple[int, ...]:
    """The paper's four scales, 2^-10 .. 2^-7 of the rows, assume inputs of gigabytes. On a
    smaller input a sample of a few thousand rows times pandas' cost per call, not per row, and
    extrapolates it a hundredfold: the four scales move up (each still half the next) until the
    largest holds ``SAMPLE_ROWS_MIN`` rows, or half the input."""
    reads = Reads(cluster, mounts, every=2 ** SCALES[0], cache=samples)
    profile.run(program, reads, argv, quiet=True, tolerate=True)  # how many rows it reads
    top = int(math.floor(math.log2(max(1, reads.full_rows) / SAMPLE_ROWS_MIN)))
    top = min(SCALES[-1], max(1, top))  # a sample, never the whole input
    return tuple(range(top + len(SCALES) - 1, top - 1, -1))


def intake_rate(cluster: Any, datasets: set[str]) -> float:
    """Bytes per second at which the host takes in a stored dataset the way the program reads
    it (an ordered scan, every column), measured on its first ``INTAKE_BYTES``."""
    taken, seconds = 0, 0.0
    for dataset in sorted(datasets):
        started = time.perf_counter()
        reader = cluster.scan(dataset, ordered=True)
        try:
            for batch in reader:
                taken += batch.nbytes
                if taken >= INTAKE_BYTES:
                    break
        finally:
            reader.close()
        seconds += time.perf_counter() - started
    return taken / seconds if taken and seconds > 0 else float("inf")


def devices_of(cluster: Any, measured_bytes_per_s: float = float("inf")) -> Devices:
    """C from the devices' calibration (``quarry calibrate``), else their profiles; BW_D2H the
    least of their links together (a device with no link cap: loopback) and the host's
    measured intake (``intake_rate``)."""
    profiles = [info.profile for info in cluster.info.values()]
    factors = [calibrated(cluster, name).compute_factor for name in cluster.info]
    factor = sum(factors) / max(1, len(factors))
    links = [p.external_bytes_per_s for p in profiles]
    link = float("inf") if any(x is None for x in links) else float(sum(links))
    return Devices(len(profiles), factor, min(link, measured_bytes_per_s))
