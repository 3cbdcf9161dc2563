"""Model inputs from `quarry calibrate` reports, the emulated host bus, the input gatherer."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pytest

from quarry.capacity.kernel_data import (
    Gatherer,
    KernelInputError,
    as_table,
    make_inputs,
    materialize,
    working_set_bytes,
)
from quarry.capacity.kernels import KERNELS
from quarry.capacity.measure import HostBus, calibration_inputs, calibration_report
from quarry.capacity.model import CapacityInputError
from quarry.protocol.control import CalibrationReport, Measured


def report(
    device: str,
    profile: str = "kinetic",
    compute: float = 14.0,
    internal: float = 250e6,
    external: float = 300e6,
) -> CalibrationReport:
    """What `Cluster.calibrate()` returns for one device."""
    return CalibrationReport(
        device=device,
        profile=profile,
        compute_factor=Measured(15.0, compute),
        internal_bytes_per_s=Measured(261e6, internal),
        external_bytes_per_s=Measured(312.5e6, external),
    )


def test_calibration_gives_the_four_times() -> None:
    inputs = calibration_inputs(
        report("dev0"),
        data_bytes=10**9,
        host_compute_s=0.2,
        device_compute_s=0.12,
        name="count-kinetic",
    )
    assert inputs.t_ssd_tx_s == pytest.approx(10**9 / 250e6)  # the slower of the two links
    assert inputs.t_ssd_comp_s == 0.2
    assert inputs.t_csd_tx_s == pytest.approx(10**9 / 250e6)
    assert inputs.t_csd_comp_s == pytest.approx(14.0 * 0.12)
    fast_medium = calibration_inputs(
        report("dev0", internal=1e9), data_bytes=10**9, host_compute_s=0.2
    )
    assert fast_medium.t_ssd_tx_s == pytest.approx(10**9 / 300e6)
    assert fast_medium.t_csd_comp_s == pytest.approx(14.0 * 0.2)  # one device thread


def test_calibration_reports_of_a_cluster() -> None:
    reports = [
        report("dev0", compute=14.0),
        report("dev1", compute=16.0),
        report("dev2", compute=15.5),
    ]
    merged = calibration_report(reports)
    assert merged.compute_factor.measured == 15.5  # the median
    assert merged.compute_factor.expected == 15.0 and merged.profile == "kinetic"
    assert calibration_report(reports, "dev1").compute_factor.measured == 16.0
    with pytest.raises(CapacityInputError, match="device"):
        calibration_report(reports, "dev9")
    with pytest.raises(CapacityInputError, match="several profiles"):
        calibration_report([report("dev0"), report("dev1", profile="newport")])
    with pytest.raises(CapacityInputError, match="calibration"):
        calibration_report([])
    broken = replace(report("dev0"), internal_bytes_per_s=Measured(261e6, float("nan")))
    with pytest.raises(CapacityInputError, match="internal_bytes_per_s.measured"):
        calibration_inputs(broken, data_bytes=100, host_compute_s=1.0)


def test_the_host_bus_carries_no_more_than_its_bandwidth() -> None:
    bus = HostBus(100e6)
    started = time.monotonic()

    def reader() -> None:
        for _ in range(5):
            bus.carry(1_000_000)

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    bus.drain()
    # 20 MB over a 100 MB/s bus: 0.2 s, however fast the readers delivered them.
    assert 0.19 < time.monotonic() - started < 0.5
    with pytest.raises(CapacityInputError, match="host_bus_bytes_per_s"):
        HostBus(0)


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_gathering_batch_by_batch_equals_materializing(kernel: str) -> None:
    table = as_table(make_inputs(kernel, 40_000, seed=5))
    gatherer = Gatherer(kernel, table.schema, table.num_rows)
    for batch in table.to_batches(max_chunksize=37):
        gatherer.add(batch)
    gathered = gatherer.finish()
    expected = materialize(kernel, table)
    assert gathered.keys() == expected.keys()
    for name, array in expected.items():
        np.testing.assert_array_equal(gathered[name], array)
    assert sum(a.nbytes for a in gathered.values()) == working_set_bytes(kernel, 40_000)


def test_gathering_rejects_what_a_kernel_cannot_use() -> None:
    with pytest.raises(KernelInputError, match="missing input column values"):
        Gatherer("count", pa.schema([("other", pa.int32())]), 1)
    with pytest.raises(KernelInputError, match="not numbers"):
        Gatherer("count", pa.schema([("values", pa.string())]), 1)
    gatherer = Gatherer("count", pa.schema([("values", pa.int32())]), 2)
    with pytest.raises(KernelInputError, match="nulls"):
        gatherer.add(pa.record_batch([pa.array([1, None], pa.int32())], names=["values"]))
    with pytest.raises(KernelInputError, match="expected 2"):
        gatherer.finish()
