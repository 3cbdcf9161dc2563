"""A line's estimated cost at full scale, from its sample runs (§III.A).

For every line: host compute time, and output and input bytes, each fitted over the four
sample runs against the rows the program read, then taken at the dataset's full rows. Bytes
read from storage scale with the rows (a sample of every k-th row reads about 1/k of them).
The device's time is the host's times the device factor C (from the devices' profiles or their
calibration), spread over the devices that hold the data: each runs its own partitions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from quarry.offload.fit import Fit, fit
from quarry.offload.profile import Run
from quarry.offload.program import Line

TIME_FLOOR_S = 0.002  # a line's sample times all below this show no curve, only noise


@dataclass(frozen=True)
class Devices:
    """What the cost model needs of the devices that hold a program's data."""

    count: int
    compute_factor: float  # C: device seconds per host second
    link_bytes_per_s: float  # BW_D2H, all devices' links together
    probe_factor: float = 1.0  # the devices' measured time over the estimate (``run.probed``)


@dataclass(frozen=True)
class LineEstimate:
    number: int
    text: str
    time_fit: Fit
    out_fit: Fit
    host_s: float  # CT_host
    device_s: float  # CT_device
    stored_bytes: float  # read from storage
    in_bytes: float  # earlier lines' values
    out_bytes: float  # Dout
    pinned: bool = False  # prints or writes files: stays on the host
    partitionable: bool = False  # per partition, concatenated, it gives the whole's values
    reduction: bool = False  # per partition it gives partials the host combines
    reads: frozenset[str] = frozenset()  # names of earlier lines' values it reads
    binds: frozenset[str] = frozenset()

    @property
    def movable(self) -> bool:
        return self.partitionable and not self.pinned

    @property
    def din_bytes(self) -> float:
        """Din: everything the line consumes."""
        return self.stored_bytes + self.in_bytes


def estimate(
    lines: Sequence[Line],
    runs: Sequence[Run],
    full_rows: int,
    devices: Devices,
    partitionable: set[int] = frozenset(),
    reductions: set[int] = frozenset(),
) -> list[LineEstimate]:
    """Per line, its costs at ``full_rows`` from ``runs`` at smaller scales."""
    sizes = [max(1, run.rows_read) for run in runs]
    estimates = []
    ran = min(len(run.lines) for run in runs)  # lines every sample run reached
    for index, first in enumerate(runs[0].lines[:ran]):
        samples = [run.lines[index] for run in runs]
        time_fit = fit(sizes, [s.compute_s for s in samples], floor=TIME_FLOOR_S)
        out_fit = fit(sizes, [s.out_bytes for s in samples])
        in_fit = fit(sizes, [s.in_bytes for s in samples])
        stored_per_row = max(s.access.bytes / n for s, n in zip(samples, sizes))
        host_s = time_fit.at(full_rows)
        estimates.append(
            LineEstimate(
                number=first.line.number,
                text=first.line.text,
                time_fit=time_fit,
                out_fit=out_fit,
                host_s=host_s,
                device_s=host_s * devices.compute_factor / max(1, devices.count),
                stored_bytes=stored_per_row * full_rows,
                in_bytes=in_fit.at(full_rows),
                out_bytes=out_fit.at(full_rows),
                pinned=first.line.pinned,
                partitionable=first.line.number in partitionable,
                reduction=first.line.number in reductions,
                reads=first.line.reads,
                binds=first.line.binds,
            )
        )
    return estimates + [_unknown(line) for line in lines[ran:]]


def _unknown(line: Line) -> LineEstimate:
    """A line the samples did not reach (an earlier line failed on them): it runs on the
    host, and nothing is claimed about its cost."""
    nothing = Fit("O(1)", 0.0, 0.0, 0.0)
    return LineEstimate(line.number, line.text, nothing, nothing, 0.0, 0.0, 0.0, 0.0, 0.0, True)
