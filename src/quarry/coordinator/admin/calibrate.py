"""``quarry calibrate``: measure every device's compute factor and bandwidths (CSDPLAN step 1).

The report (``CalibrationReport``) keeps what the profile says beside what was measured; it is
stored on each device (key ``~sys/calibration``, the report's JSON) so any coordinator, and the
cost model, can read it later. A report an older coordinator stored reads the same way: the
fields added since (``attempts``, ``settled``) have defaults.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from quarry.device.calibration import EXTERNAL_BATCH_ROWS, time_kernel
from quarry.device.unit import host_emulator
from quarry.errors import DeviceUnavailable
from quarry.protocol.control import CalibratePart, CalibrationReport, Measured
from quarry.protocol.work import CalibrationTransfer

if TYPE_CHECKING:
    from quarry.coordinator.membership.device_client import DeviceClient
    from quarry.coordinator.membership.membership import Membership

CALIBRATION_KEY = "~sys/calibration"
CALIBRATE_TIMEOUT_S = 600.0
EXTERNAL_BYTES = 256 << 20
EXTERNAL_BYTES_MAX = 4 << 30
MEASURE_S = 1.0
EXTERNAL_RUNS = 3
TOLERANCE = 0.10
KERNEL_ROUNDS_MIN = 6
KERNEL_ROUNDS_MAX = 16
KERNEL_RUNS = 3  # runs per side per round, the best taken
CONFIRMED = 0.03  # a round this close to a side's best confirms it ...
CONFIRMED_ROUNDS = 3  # ... once this many rounds did
ATTEMPTS_MAX = 3  # a figure that does not settle is measured again, at most this often
SETTLE_PAUSE_S = 2.0
SETTLED = 0.03  # the two best bandwidth runs this close: the link set them
EXTERNAL_BATCH_BYTES = EXTERNAL_BATCH_ROWS * 8
HOST_LINK_BATCHES = 8  # the host's ingress is timed over at least this many batches ...
HOST_LINK_S = 2.0  # ... and about this long at its expected rate


@dataclass(frozen=True)
class Reading:
    """A figure once it settled, or the best seen when it never did."""

    value: float
    settled: bool
    attempts: int
    spread: float | None = None


def settle(measure: Callable[[], tuple[float, bool, float | None]]) -> Reading:
    """Measure until the figure settles, at most ``ATTEMPTS_MAX`` times with a pause between.

    Other work on the machine only ever slows a kernel or a transfer, so each measurement keeps
    its best runs; but right after a heavy job (caches cold, clocks and the scheduler still
    settling) even the best runs can be off. A measurement whose best runs do not agree is not
    reported: it is taken again after a pause, and if it never agrees the report says so
    (``settled`` false) rather than offering a wrong figure as right."""
    value, settled, spread = measure()
    attempt = 1
    while not settled and attempt < ATTEMPTS_MAX:
        time.sleep(SETTLE_PAUSE_S)
        value, settled, spread = measure()
        attempt += 1
    return Reading(value, settled, attempt, spread)


def _best_agree(values: list[float]) -> bool:
    """The two highest rates within ``SETTLED`` of each other: the link set them, not the
    machine's load (which only lowers a rate)."""
    ranked = sorted(values, reverse=True)
    return len(ranked) < 2 or ranked[1] >= ranked[0] * (1 - SETTLED)


def _external_bytes_per_s(client: DeviceClient, total_bytes: int) -> float:
    reader = client.get(CalibrationTransfer(total_bytes))
    received = 0
    started = time.perf_counter()
    while (chunk := client.guard(lambda: next(reader, None))) is not None:
        received += chunk.data.get_total_buffer_size()  # each batch dropped once counted
    elapsed = time.perf_counter() - started
    return received / elapsed


def _within(expected: float | None, measured: float) -> bool | None:
    if expected is None:
        return None
    return abs(measured - expected) <= TOLERANCE * expected


def measured(expected: float | None, reading: Reading) -> Measured:
    within = _within(expected, reading.value) if reading.settled else None
    spread = None if reading.spread is None else round(reading.spread, 4)
    return Measured(expected, reading.value, within, spread, reading.attempts, reading.settled)


def compute_factor(client: DeviceClient) -> tuple[float, float, float, float, bool]:
    """The drive's best kernel time over the host's best, the two taken back to back in each
    round so a change in the machine's load hits both alike.

    Other work on the machine can only make a kernel slower, never faster, so each side's
    fastest run is its truest figure; the ratio of medians would carry the noise of both. But
    a shared machine's speed drifts by a third over seconds, so a side's best only counts once
    it has come back: rounds continue (bounded) until ``CONFIRMED_ROUNDS`` rounds of each side
    came within ``CONFIRMED`` of that side's best. Returns the factor, the spread of the
    per-round ratios (their median absolute deviation over their median, shown in the report)
    and the best host and device kernel times.
    """
    return kernel_factor(
        lambda: (
            client.calibrate(
                CalibratePart.KERNEL, KERNEL_RUNS, timeout_s=CALIBRATE_TIMEOUT_S
            ).kernel_s
        )
    )


def kernel_factor(emulated: Callable[[], float]) -> tuple[float, float, float, float, bool]:
    """``compute_factor`` against any emulated side: a device's slot, or the host's own."""
    hosts: list[float] = []
    devices: list[float] = []
    for round_number in range(KERNEL_ROUNDS_MAX):
        hosts.append(time_kernel(None, KERNEL_RUNS))
        devices.append(emulated())
        if round_number + 1 >= KERNEL_ROUNDS_MIN and _confirmed(hosts) and _confirmed(devices):
            break
    ratios = [device_s / host_s for host_s, device_s in zip(hosts, devices, strict=True)]
    median = statistics.median(ratios)
    spread = statistics.median(abs(r - median) for r in ratios) / median
    settled = _confirmed(hosts) and _confirmed(devices)
    return min(devices) / min(hosts), spread, min(hosts), min(devices), settled


def _confirmed(times_s: list[float]) -> bool:
    best_s = min(times_s)
    return sum(t <= best_s * (1 + CONFIRMED) for t in times_s) >= CONFIRMED_ROUNDS


def calibrate_device(client: DeviceClient) -> CalibrationReport:
    profile = client.hello().profile
    kernel: dict[str, float] = {}

    def factor() -> tuple[float, bool, float | None]:
        value, spread, kernel["host"], kernel["device"], settled = compute_factor(client)
        return value, settled, spread

    def internal() -> tuple[float, bool, float | None]:
        runs = [
            client.calibrate(
                CalibratePart.READS, timeout_s=CALIBRATE_TIMEOUT_S
            ).internal_bytes_per_s
            or 0.0
            for _ in range(2)
        ]
        return max(runs), _best_agree(runs), None

    # About a second of traffic at the expected rate, so the bucket's small idle credit does
    # not count (bounded for very fast or unlimited links). The first run warms the link (the
    # first second after idle ran 30% slow over loopback); then the best of a few.
    expected = profile.external_bytes_per_s or 0
    transfer_bytes = int(min(EXTERNAL_BYTES_MAX, max(EXTERNAL_BYTES, expected * MEASURE_S)))

    def external() -> tuple[float, bool, float | None]:
        _external_bytes_per_s(client, transfer_bytes)
        runs = [_external_bytes_per_s(client, transfer_bytes) for _ in range(EXTERNAL_RUNS)]
        return max(runs), _best_agree(runs) or expected == 0, None

    report = CalibrationReport(
        device=client.name,
        profile=profile.name,
        compute_factor=measured(profile.compute_factor, settle(factor)),
        internal_bytes_per_s=measured(profile.internal_bytes_per_s, settle(internal)),
        external_bytes_per_s=measured(profile.external_bytes_per_s, settle(external)),
        host_kernel_s=kernel["host"],
        device_kernel_s=kernel["device"],
        measured_at=time.time(),
    )
    client.kv_put(CALIBRATION_KEY, report.to_bytes())
    return report


def calibrate_host(cluster: Membership) -> CalibrationReport:
    """The host's own profile measured like a drive's: its compute factor (the kernel in one of
    its slots against the machine's own), and its ingress, timed as devices stream into it at
    once (enough of them that their own links together carry twice the host's)."""
    emulator = host_emulator()
    profile = emulator.profile
    kernel: dict[str, float] = {}

    def factor() -> tuple[float, bool, float | None]:
        value, spread, kernel["host"], kernel["device"], settled = kernel_factor(
            lambda: time_kernel(emulator, KERNEL_RUNS)
        )
        return value, settled, spread

    link = profile.external_bytes_per_s
    senders = _senders(cluster.live_devices(), cluster, link)
    total = int(max(HOST_LINK_BATCHES * EXTERNAL_BATCH_BYTES, (link or 0) * HOST_LINK_S))
    total = min(total, EXTERNAL_BYTES_MAX) if link else EXTERNAL_BYTES

    def ingress() -> tuple[float, bool, float | None]:
        _ingress_bytes_per_s(senders, total)
        runs = [_ingress_bytes_per_s(senders, total) for _ in range(EXTERNAL_RUNS)]
        return max(runs), _best_agree(runs) or link is None, None

    report = CalibrationReport(
        device="host",
        profile=profile.name,
        compute_factor=measured(profile.compute_factor, settle(factor)),
        internal_bytes_per_s=Measured(None, 0.0),
        external_bytes_per_s=measured(link, settle(ingress)),
        host_kernel_s=kernel["host"],
        device_kernel_s=kernel["device"],
        measured_at=time.time(),
    )
    return report


def _senders(
    clients: list[DeviceClient], cluster: Membership, link: float | None
) -> list[DeviceClient]:
    """The fewest devices whose links together carry at least twice the host's ingress."""
    if not clients:
        raise DeviceUnavailable("no device answers: the host's link is timed as devices send")
    chosen, carried = [], 0.0
    for client in clients:
        chosen.append(client)
        rate = cluster.info[client.name].profile.external_bytes_per_s
        carried = float("inf") if rate is None else carried + rate
        if link is None or carried >= 2 * link:
            break
    return chosen


def _ingress_bytes_per_s(senders: list[DeviceClient], total_bytes: int) -> float:
    """Bytes per second the host takes in while ``senders`` stream ``total_bytes`` together,
    every batch through the host's ingress (``DeviceClient.batches``)."""
    share = max(1, total_bytes // len(senders))
    received = [0] * len(senders)

    def drain(index: int) -> None:
        client = senders[index]
        for batch in client.batches(client.get(CalibrationTransfer(share))):
            received[index] += batch.nbytes

    started = time.perf_counter()
    with ThreadPoolExecutor(len(senders)) as pool:
        for future in [pool.submit(drain, i) for i in range(len(senders))]:
            future.result()
    return sum(received) / (time.perf_counter() - started)


def calibrate(cluster: Membership) -> list[CalibrationReport]:
    """One report per device; devices are measured one at a time so they do not disturb each
    other's numbers."""
    return [calibrate_device(client) for client in cluster.live_devices()]


def stored(client: DeviceClient) -> CalibrationReport | None:
    """The last calibration stored on a device, if any."""
    from quarry.errors import KeyNotFound

    try:
        value, _ = client.kv_get(CALIBRATION_KEY)
    except KeyNotFound:
        return None
    return CalibrationReport.from_bytes(value)
