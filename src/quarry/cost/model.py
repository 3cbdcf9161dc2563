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

from dataclasses import dataclass, field

from quarry.cost.eq1 import device_path_s, transfer_s
from quarry.protocol.stage import STAGES_BY_DATA_SHIPPED, Stage

LINK_BYTES_PER_S_DEFAULT = 2.0e9  # loopback Flight on a small machine, when nothing is measured
# What a cut costs whatever its size: the engine runs and streams it makes. Measured on this
# project's 2-core machine with the host profile, a table of 1,000 rows, one partition a device:
# a device costs 2.2 ms of its CPU to run a unit of work over a partition (its loop, an engine
# run, its report), 0.6 ms to answer a stream that only reads and ships (a scan, a fetch of a
# range handed back), and the host about 1 ms for an engine run over what came back. Per-byte
# prices alone made the model hand small fragments back in many ranges, each a stream of its
# own (TPC-H Q2: part filtered on the devices, supplier and nation raw: SF 1 auto 0.51 against
# 0.56 with every device running everything).
UNIT_RUN_DEVICE_S = 0.002  # per partition a device runs the unit over
STREAM_DEVICE_S = 0.0006  # per stream a device only reads and ships on
HOST_RUN_S = 0.001  # per engine run of the completer over a range that came back
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
    # the device computes on the completer's own cores (an unemulated device on the same
    # machine: the embedded default): its work and the completer's add up on those cores
    shares_host: bool = False

    @property
    def link_bytes_per_s(self) -> float:
        return link_bytes_per_s(self.external_bytes_per_s)


def link_bytes_per_s(external_bytes_per_s: float | None) -> float:
    """The device -> host link the model prices: measured or profiled, else the default."""
    return external_bytes_per_s or LINK_BYTES_PER_S_DEFAULT


def handback_s(ranges: int, completer_cores: float = 1.0) -> tuple[float, float]:
    """Fixed seconds of ``ranges`` handed back: the device's (a stream each) and the
    completer's (an engine run each, spread over its cores)."""
    return ranges * STREAM_DEVICE_S, ranges * HOST_RUN_S / max(completer_cores, 1e-6)


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


def device_full_s_per_byte(d: DeviceFigures, f: SubPlanFigures) -> float:
    """This device's seconds per stored byte for the whole sub-plan, as the model sees it."""
    return f.full_s_per_byte * d.compute_factor / max(1e-3, 1.0 - d.cpu_busy)


def _device_compute_s(d: DeviceFigures, host_s_per_byte: float) -> float:
    """Wall seconds of the device's compute: its CPU seconds over its cores, which take its
    chunks at once whatever partitions they come from (``device.loop.ChunkSlots``)."""
    return _device_cpu_s(d, host_s_per_byte) / max(1, d.cores or 1)


def _device_cpu_s(d: DeviceFigures, host_s_per_byte: float) -> float:
    share = max(1e-3, 1.0 - d.cpu_busy)
    return d.stored_bytes * host_s_per_byte * d.compute_factor / share


def estimate(
    cut: Stage, devices: list[DeviceFigures], f: SubPlanFigures, host: HostFigures
) -> Estimate:
    """Wall seconds of one cut: the slowest device, the host's own work, or everything shipped
    through the host's ingress, whichever is longest. Devices that share the host's cores
    (``shares_host``) add their work, streams included, to the host's on those cores."""
    cut = Stage(cut)
    per_device: dict[str, float] = {}
    total_bytes = sum(d.stored_bytes for d in devices)
    shipped_total = shared_s = 0.0
    handbacks = 0
    cores = max(1, host.cores) / host.compute_factor
    for d in devices:
        read_s = (
            d.stored_bytes * f.read_ratio / d.internal_bytes_per_s
            if d.internal_bytes_per_s
            else 0.0
        )
        s_per_byte, shipped_ratio = _device_share(cut, f)
        shipped_bytes = d.stored_bytes * shipped_ratio
        ranges = 0 if cut is Stage.FULL else d.handbacks
        runs = 0 if cut is Stage.RAW else d.partitions
        fixed_s = runs * UNIT_RUN_DEVICE_S + handback_s(ranges)[0]
        link_s = transfer_s(shipped_bytes, d.link_bytes_per_s)
        if d.shares_host:  # its cores are the host's: every second of it is the host's too
            shared_s += _device_cpu_s(d, s_per_byte) + fixed_s + link_s
            per_device[d.name] = read_s
        else:  # reading, computing and shipping overlap slice by slice; the slowest paces it
            work_s = _device_compute_s(d, s_per_byte)
            per_device[d.name] = max(read_s, device_path_s(work_s, link_s) + fixed_s)
        shipped_total += shipped_bytes
        handbacks += ranges
    if cut is Stage.FULL:
        host_s = 0.0
    elif cut is Stage.FILTER:
        # what the whole sub-plan costs beyond its filter is the work on the rows that pass:
        # already per stored byte, so it is not scaled by the filter's selectivity again
        remaining = max(f.full_s_per_byte - f.filter_s_per_byte, 0.0)
        host_s = total_bytes * remaining / cores
    else:
        host_s = total_bytes * f.full_s_per_byte / cores
    host_s += handback_s(handbacks, cores)[1] + shared_s / cores
    # Eq. 1 adds CT_host to the transfer; over several devices the host completes one
    # device's rows while the others still ship, so the wall time is the longer of the two
    slowest = max(per_device.values(), default=0.0)
    ingress_s = shipped_total / host.link_bytes_per_s if host.link_bytes_per_s else 0.0
    return Estimate(cut, max(slowest, host_s, ingress_s), per_device, host_s)


def _device_share(cut: Stage, f: SubPlanFigures) -> tuple[float, float]:
    """A device's seconds per stored byte and bytes shipped per stored byte under ``cut``."""
    if cut is Stage.FULL:
        return f.full_s_per_byte, f.output_ratio
    if cut is Stage.FILTER:
        return f.filter_s_per_byte, f.filter_ratio
    return 0.0, f.raw_ratio


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
