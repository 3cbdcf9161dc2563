"""``quarry calibrate``: measure every device's compute factor and bandwidths (CSDPLAN step 1).

The report keeps what the profile says beside what was measured; the numbers are stored on each
device (key ``~sys/calibration``) so any coordinator, and the cost model, can read them later.
"""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Any

from quarry.device.calibration import time_kernel
from quarry.protocol.control import CalibratePart, CalibrationReport, Measured
from quarry.protocol.work import CalibrationTransfer

if TYPE_CHECKING:
    from quarry.coordinator.client import DeviceClient
    from quarry.coordinator.membership import Membership

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


def compute_factor(client: DeviceClient) -> tuple[float, float, float, float]:
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
    hosts: list[float] = []
    devices: list[float] = []
    for round_number in range(KERNEL_ROUNDS_MAX):
        hosts.append(time_kernel(None, KERNEL_RUNS))
        devices.append(
            client.calibrate(
                CalibratePart.KERNEL, KERNEL_RUNS, timeout_s=CALIBRATE_TIMEOUT_S
            ).kernel_s
        )
        if round_number + 1 >= KERNEL_ROUNDS_MIN and _confirmed(hosts) and _confirmed(devices):
            break
    ratios = [device_s / host_s for host_s, device_s in zip(hosts, devices, strict=True)]
    median = statistics.median(ratios)
    spread = statistics.median(abs(r - median) for r in ratios) / median
    return min(devices) / min(hosts), spread, min(hosts), min(devices)


def _confirmed(times_s: list[float]) -> bool:
    best_s = min(times_s)
    return sum(t <= best_s * (1 + CONFIRMED) for t in times_s) >= CONFIRMED_ROUNDS


def calibrate_device(client: DeviceClient) -> dict[str, Any]:
    profile = client.hello().profile
    factor, spread, host_kernel_s, device_kernel_s = compute_factor(client)
    internal = client.calibrate(CalibratePart.READS, timeout_s=CALIBRATE_TIMEOUT_S)
    # About a second of traffic at the expected rate, so the bucket's small idle credit does
    # not count (bounded for very fast or unlimited links). The first run warms the link (the
    # first second after idle ran 30% slow over loopback); then the best of a few, since other
    # work on the machine only slows a transfer and the bucket keeps it under the profile.
    expected = profile.external_bytes_per_s or 0
    transfer_bytes = int(min(EXTERNAL_BYTES_MAX, max(EXTERNAL_BYTES, expected * MEASURE_S)))
    _external_bytes_per_s(client, transfer_bytes)
    external = max(_external_bytes_per_s(client, transfer_bytes) for _ in range(EXTERNAL_RUNS))

    def measured(expected: float | None, value: float, spread: float | None = None) -> Measured:
        return Measured(expected, value, _within(expected, value), spread)

    report = CalibrationReport(
        device=client.name,
        profile=profile.name,
        compute_factor=measured(profile.compute_factor, factor, round(spread, 4)),
        internal_bytes_per_s=measured(
            profile.internal_bytes_per_s, internal.internal_bytes_per_s or 0.0
        ),
        external_bytes_per_s=measured(profile.external_bytes_per_s, external),
        host_kernel_s=host_kernel_s,
        device_kernel_s=device_kernel_s,
        measured_at=time.time(),
    )
    client.kv_put(CALIBRATION_KEY, report.to_bytes())
    return report.to_json()


def calibrate(cluster: Membership) -> list[dict[str, Any]]:
    """One report per device; devices are measured one at a time so they do not disturb each
    other's numbers."""
    return [calibrate_device(client) for client in cluster.live_devices()]


def stored(client: DeviceClient) -> dict[str, Any] | None:
    """The last calibration stored on a device, if any."""
    from quarry.errors import KeyNotFound

    try:
        value, _ = client.kv_get(CALIBRATION_KEY)
    except KeyNotFound:
        return None
    return CalibrationReport.from_bytes(value).to_json()
