"""The one cost model (DESIGN §4): ActivePy Eq. 1 (``cost.eq1``) per sub-plan, over the devices
of a scan.

    push down when   DS_raw / BW + CT_host   >   CT_device + DS_processed / BW       (Eq. 1)

For a scan spread over devices the times are per device, in parallel, and the host's share is
whatever it must finish itself. Three cuts are compared for each fragment: ``full`` (the whole
sub-plan on the devices), ``filter`` (devices filter, the host does the rest) and ``raw``
(devices ship the needed columns; the host does everything). The same numbers go to each
device so its run-time controller can check them against what it measures.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from quarry.cost.eq1 import device_path_s, transfer_s
from quarry.protocol.stage import STAGES_BY_DATA_SHIPPED, Stage

LINK_BYTES_PER_S_DEFAULT = 2.0e9  # loopback Flight on a small machine, when nothing is measured
# What a range handed back costs whatever its size (``handback_s``): the host opens a stream to
# fetch it, the device answers it, and the host runs the rest of the sub-plan over it. Measured
# on this project's 2-core machine with the host profile: a stream costs a device about 2 ms of
# CPU (a 1,000-row aggregate over 4 partitions took 14 ms of device CPU a query, over 16 took
# 37), and an engine run on the host about 1 ms. Per-byte prices alone made the model hand back
# small fragments (TPC-H Q2: part filtered on the devices, supplier and nation raw), each
# range a stream of its own, and lose to running them whole (SF 1: auto 0.51, always 0.56).
HANDBACK_DEVICE_S = 0.002
HANDBACK_HOST_S = 0.001
CUTS = STAGES_BY_DATA_SHIPPED  # full, filter, raw: in order of data moved, least first
CHOICE_TOLERANCE = 0.10


@dataclass
class DeviceFigures:
    """A device as the model sees it: calibrated (or profile) figures and its current load."""

    name: str
    stored_bytes: int  # bytes of the scan's slices on this device (after zone-map pruning)
    partitions: int
    compute_factor: float
    cores: int | None
    internal_bytes_per_s: float | None
    external_bytes_per_s: float | None
    cpu_busy: float = 0.0  # 0..1
    # ranges this device's slices go back in when it hands all of them back: one fetch each
    handbacks: int = 0

    @property
    def link_bytes_per_s(self) -> float:
        return link_bytes_per_s(self.external_bytes_per_s)


def link_bytes_per_s(external_bytes_per_s: float | None) -> float:
    """The device -> host link the model prices: measured or profiled, else the default."""
    return external_bytes_per_s or LINK_BYTES_PER_S_DEFAULT


def handback_s(ranges: int, completer_cores: float = 1.0) -> tuple[float, float]:
    """Fixed seconds of ``ranges`` handed back: the device's (each a stream it answers) and the
    completer's (each an engine run, spread over its cores)."""
    return ranges * HANDBACK_DEVICE_S, ranges * HANDBACK_HOST_S / max(completer_cores, 1e-6)


def host_share(host_cores: int, devices: int) -> float:
    """The fraction of the host one device's completion work may count on: the host's cores
    split evenly over the devices that may push work back at once, at most the whole host."""
    return min(1.0, host_cores / max(1, devices))


@dataclass
class SubPlanFigures:
    """What sampling a slice on the host taught us about one fragment."""

    full_s_per_byte: float  # host seconds per stored byte for the whole sub-plan
    filter_s_per_byte: float  # host seconds per stored byte for scan + filter
    raw_ratio: float  # raw bytes shipped (needed columns) per stored byte
    filter_ratio: float  # bytes left after the filter per stored byte
    output_ratio: float  # full sub-plan output bytes per stored byte
    read_ratio: float = 1.0  # bytes read off the store (the touched columns) per stored byte
    kept_rows: float = 1.0  # rows the filter stage keeps per row read


@dataclass(frozen=True)
class HostFigures:
    """The host as the model sees it: its cores, its seconds per second of this machine's for
    the same work, and its ingress link that every device's stream shares (None: unlimited)."""

    cores: int
    compute_factor: float = 1.0
    link_bytes_per_s: float | None = None


@dataclass
class Estimate:
    cut: Stage
    seconds: float
    per_device_s: dict[str, float] = field(default_factory=dict)
    host_s: float = 0.0


@dataclass
class Choice:
    cut: Stage
    estimates: dict[Stage, Estimate]
    figures: SubPlanFigures

    def to_json(self) -> dict[str, Any]:
        return {
            "cut": self.cut.value,
            "figures": asdict(self.figures),
            "estimates_s": {c.value: round(e.seconds, 6) for c, e in self.estimates.items()},
        }


def device_full_s_per_byte(d: DeviceFigures, f: SubPlanFigures) -> float:
    """This device's seconds per stored byte for the whole sub-plan, as the model sees it."""
    return f.full_s_per_byte * d.compute_factor / max(1e-3, 1.0 - d.cpu_busy)


def _device_compute_s(d: DeviceFigures, host_s_per_byte: float) -> float:
    parallel = max(1, min(d.cores or 1, d.partitions))
    share = max(1e-3, 1.0 - d.cpu_busy)
    return d.stored_bytes * host_s_per_byte * d.compute_factor / share / parallel


def estimate(
    cut: Stage, devices: list[DeviceFigures], f: SubPlanFigures, host: HostFigures
) -> Estimate:
    """Wall seconds of one cut: the slowest device, the host's own work, or everything shipped
    through the host's ingress, whichever is longest."""
    cut = Stage(cut)
    per_device: dict[str, float] = {}
    total_bytes = sum(d.stored_bytes for d in devices)
    shipped_total = 0.0
    handbacks = 0
    for d in devices:
        read_bytes = d.stored_bytes * f.read_ratio
        read_s = read_bytes / d.internal_bytes_per_s if d.internal_bytes_per_s else 0.0
        if cut is Stage.FULL:
            work_s = _device_compute_s(d, f.full_s_per_byte)
            shipped_bytes = d.stored_bytes * f.output_ratio
        elif cut is Stage.FILTER:
            work_s = _device_compute_s(d, f.filter_s_per_byte)
            shipped_bytes = d.stored_bytes * f.filter_ratio
        else:
            work_s = 0.0
            shipped_bytes = d.stored_bytes * f.raw_ratio
        # reading, computing and shipping overlap slice by slice; the slowest stage paces it
        device_s = device_path_s(work_s, transfer_s(shipped_bytes, d.link_bytes_per_s))
        if cut is not Stage.FULL:  # every range handed back is a fetch, whatever its size
            device_s += handback_s(d.handbacks)[0]
            handbacks += d.handbacks
        per_device[d.name] = max(read_s, device_s)
        shipped_total += shipped_bytes
    cores = max(1, host.cores) / host.compute_factor
    if cut is Stage.FULL:
        host_s = 0.0
    elif cut is Stage.FILTER:
        # what the whole sub-plan costs beyond its filter is the work on the rows that pass:
        # already per stored byte, so it is not scaled by the filter's selectivity again
        remaining = max(f.full_s_per_byte - f.filter_s_per_byte, 0.0)
        host_s = total_bytes * remaining / cores
    else:
        host_s = total_bytes * f.full_s_per_byte / cores
    host_s += handback_s(handbacks, cores)[1]
    # Eq. 1 adds CT_host to the transfer; over several devices the host completes one
    # device's rows while the others still ship, so the wall time is the longer of the two
    slowest = max(per_device.values(), default=0.0)
    ingress_s = shipped_total / host.link_bytes_per_s if host.link_bytes_per_s else 0.0
    return Estimate(cut, max(slowest, host_s, ingress_s), per_device, host_s)


def choose(
    devices: list[DeviceFigures],
    f: SubPlanFigures,
    host: HostFigures,
    allowed: tuple[Stage, ...] = CUTS,
    tolerance: float = CHOICE_TOLERANCE,
) -> Choice:
    """The cut to start from: the one that moves the least data (``CUTS`` order) among those
    within ``tolerance`` of the fastest estimate. Estimates from one sampled slice are not
    exact; a cut that ships more must win clearly (the devices switch on the same margin)."""
    estimates = {Stage(cut): estimate(cut, devices, f, host) for cut in allowed}
    fastest = min(e.seconds for e in estimates.values())
    best = next(
        c for c in CUTS if c in estimates and estimates[c].seconds <= fastest * (1 + tolerance)
    )
    return Choice(best, estimates, f)
