"""Sweeps: Figure 7 curves, BEP surfaces, combinations, and the PNG + JSON they write."""

import json
from pathlib import Path

import pytest

from quarry.capacity.model import CapacityInputError, CapacityInputs, HostConfig
from quarry.capacity.presets import PRESETS, WORKLOADS
from quarry.capacity.sweep import (
    SweepConfig,
    combinations_for_bep,
    csd_surface,
    overload_surface,
    run_sweep,
    throughput_curves,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_figure7_curves_cross_where_the_bep_says() -> None:
    devices = {d: WORKLOADS["count"].inputs(d) for d in ("smartssd", "newport")}
    curves = throughput_curves(devices)
    assert curves["devices"] == list(range(1, 17))
    assert set(curves["host"]) == {"1", "4", "16", "64"}
    for device, beps in curves["bep"].items():
        for cores, bep in beps.items():
            if bep <= 16:
                host, csd = curves["host"][cores], curves["csd"][device]
                assert csd[bep - 1] >= host[bep - 1] * (1 - 1e-9)
                assert bep == 1 or csd[bep - 2] < host[bep - 2]
    # CSD arrays scale linearly; the host stops at k_limit.
    csd = curves["csd"]["smartssd"]
    assert csd[15] == pytest.approx(16 * csd[0])
    assert curves["host"]["1"][7] == curves["host"]["1"][15]
    assert curves["unit"] == "bytes per second"


def test_figure7_rejects_devices_measured_on_different_hosts() -> None:
    with pytest.raises(CapacityInputError, match="host times differ"):
        throughput_curves({"a": PRESETS["count-newport"], "b": PRESETS["pagerank-newport"]})


def test_surfaces_fall_as_the_csd_improves_or_the_host_slows() -> None:
    inputs = PRESETS["vector_addition-newport"]
    factors = [1, 2, 4, 8]
    for surface in (
        csd_surface(inputs, HostConfig(), factors),
        overload_surface(inputs, HostConfig(), factors),
    ):
        for row in surface.bep:
            assert row == sorted(row, reverse=True)
        for column in zip(*surface.bep, strict=True):
            assert list(column) == sorted(column, reverse=True)
        assert min(min(row) for row in surface.bep) >= 1


def test_combinations_list_exact_points_and_least_changes() -> None:
    surface = overload_surface(PRESETS["vector_addition-newport"], HostConfig(), range(1, 11))
    combinations = combinations_for_bep(surface, 4)
    for point in combinations["exact"]:
        i, j = surface.xs.index(point["x"]), surface.ys.index(point["y"])
        assert surface.bep[j][i] == 4
    corners = combinations["corners"]
    assert corners and all(c["bep"] <= 4 for c in corners)
    for corner in corners:
        others = [c for c in corners if c is not corner]
        assert not any(o["x"] <= corner["x"] and o["y"] <= corner["y"] for o in others)
    with pytest.raises(CapacityInputError, match="^bep: "):
        combinations_for_bep(surface, 0)


def test_run_sweep_writes_readable_pngs_and_json(tmp_path: Path) -> None:
    summary = run_sweep(SweepConfig.paper(), tmp_path, prefix="x_")
    for name, filename in summary["files"].items():
        path = tmp_path / filename
        assert filename.startswith("x_") and path.suffix == ".png", name
        assert path.read_bytes()[:8] == PNG_SIGNATURE
        assert path.stat().st_size > 20_000, f"{name} looks empty"
    document = json.loads((tmp_path / "x_sweep.json").read_text())
    assert [panel["title"].split(" (")[0] for panel in document["figure7"]] == [
        "count",
        "vector addition",
        "array merge",
        "pagerank",
    ]
    assert document["figure8"]["bep"] == {"8": 13, "12": 18, "16": 21}
    stars = [(c["x"], c["y"]) for c in document["figure10"]["combinations"]["corners"]]
    assert stars == [(2, 7), (3, 4), (4, 3), (8, 2)]
    assert document["figure14"]["x_label"].startswith("host I/O slow-down")


def test_ratio_inputs_plot_as_workloads_per_time_unit() -> None:
    inputs = CapacityInputs.from_ratios(1.5, 0.5, 2.0, name="mine")
    config = SweepConfig.single(inputs, HostConfig(host_cores=2), 3)
    curves = throughput_curves(config.figure7["mine"])
    assert curves["unit"] == "workloads per time unit"
    assert curves["bep"]["csd"]["1"] == 2
