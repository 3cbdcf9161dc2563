"""Sweeps over hardware: Figure 7 throughput curves, Figure 8 k_limit curves, and the BEP
surfaces of Figures 10 and 14 with the hardware combinations that give a chosen BEP.

Everything here is data (plain dicts, JSON-ready); figures.py draws it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from quarry.capacity.break_even import break_even
from quarry.capacity.model import (
    CapacityInputError,
    CapacityInputs,
    HostConfig,
    t_csd_array_s,
    t_ssd_array_s,
)
from quarry.capacity.presets import PRESETS, WORKLOADS
from quarry.capacity.report import write_json

HOST_CORES_FIGURE7 = (1, 4, 16, 64)
DEVICES_FIGURE7 = 16
K_LIMITS_FIGURE8 = (8, 12, 16)
DEVICES_FIGURE8 = 24
FACTORS_MAX = 64
SURFACE_WORKLOAD = "vector_addition-newport"  # the workload of the paper's Figures 10 and 14


def _throughput(inputs: CapacityInputs, time_s: float) -> float:
    # Without a working-set size (ratio inputs) a rate of whole workloads per time unit still
    # compares the systems correctly.
    return (inputs.data_bytes or 1) / time_s


def throughput_unit(inputs: CapacityInputs) -> str:
    if inputs.data_bytes is None:
        return "workloads per time unit"
    return "bytes per second"


def throughput_curves(
    devices: Mapping[str, CapacityInputs],
    *,
    host_cores: Sequence[int] = HOST_CORES_FIGURE7,
    k_limit: int = 8,
    devices_max: int = DEVICES_FIGURE7,
    title: str = "",
) -> dict[str, Any]:
    """Figure 7: host with n cores over m SSDs against each CSD array of m drives."""
    if not devices:
        raise CapacityInputError("devices", "no CSD inputs given", "give at least one CSD")
    first = next(iter(devices.values()))
    for name, inputs in devices.items():
        # One panel compares one host; mixing host measurements would draw a wrong host curve.
        same_host = (inputs.t_ssd_tx_s, inputs.t_ssd_comp_s, inputs.data_bytes) == (
            first.t_ssd_tx_s,
            first.t_ssd_comp_s,
            first.data_bytes,
        )
        if not same_host:
            raise CapacityInputError(
                f"devices.{name}", "host times differ between devices", "use one host measurement"
            )
    drives = list(range(1, devices_max + 1))
    host_curves: dict[str, list[float]] = {}
    breaks: dict[str, dict[str, int]] = {name: {} for name in devices}
    for cores in host_cores:
        host = HostConfig(host_cores=cores, k_limit=k_limit)
        host_curves[str(cores)] = [
            _throughput(first, t_ssd_array_s(first, host, m)) for m in drives
        ]
        for name, inputs in devices.items():
            breaks[name][str(cores)] = break_even(inputs, host).bep
    csd_curves = {
        name: [_throughput(inputs, t_csd_array_s(inputs, m)) for m in drives]
        for name, inputs in devices.items()
    }
    return {
        "title": title,
        "unit": throughput_unit(first),
        "k_limit": k_limit,
        "devices": drives,
        "host": host_curves,
        "csd": csd_curves,
        "bep": breaks,
    }


def k_limit_curves(
    inputs: CapacityInputs,
    *,
    host_cores: int = 16,
    k_limits: Sequence[int] = K_LIMITS_FIGURE8,
    devices_max: int = DEVICES_FIGURE8,
) -> dict[str, Any]:
    """Figure 8: the SSD array's throughput stops growing at k_limit drives."""
    drives = list(range(1, devices_max + 1))
    hosts = {k: HostConfig(host_cores=host_cores, k_limit=k) for k in k_limits}
    return {
        "title": inputs.name,
        "unit": throughput_unit(inputs),
        "host_cores": host_cores,
        "devices": drives,
        "host": {
            str(k): [_throughput(inputs, t_ssd_array_s(inputs, host, m)) for m in drives]
            for k, host in hosts.items()
        },
        "csd": [_throughput(inputs, t_csd_array_s(inputs, m)) for m in drives],
        "bep": {str(k): break_even(inputs, host).bep for k, host in hosts.items()},
    }


@dataclass(frozen=True)
class Surface:
    """BEP over a grid: ``bep[j][i]`` is the BEP at x = xs[i], y = ys[j]."""

    kind: str
    title: str
    x_label: str
    y_label: str
    xs: list[float]
    ys: list[float]
    bep: list[list[int]]
    host: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _factors(factors: Sequence[float]) -> list[float]:
    values = [float(f) for f in factors]
    if not values or len(values) > FACTORS_MAX or any(not v >= 1 for v in values):
        raise CapacityInputError(
            "factors", f"got {factors!r}", f"give 1 to {FACTORS_MAX} factors, each >= 1"
        )
    return sorted(set(values))


def csd_surface(inputs: CapacityInputs, host: HostConfig, factors: Sequence[float]) -> Surface:
    """Figure 10: BEP as the CSD's internal bandwidth (x) and compute power (y) improve."""
    values = _factors(factors)
    grid = [[break_even(inputs.scaled(x, y), host).bep for x in values] for y in values]
    return Surface(
        kind="csd",
        title=f"{inputs.name}: BEP vs CSD hardware (Host({host.host_cores}))",
        x_label="CSD internal I/O bandwidth (x measured)",
        y_label="CSD compute power (x measured)",
        xs=values,
        ys=values,
        bep=grid,
        host=host.to_dict(),
    )


def overload_surface(inputs: CapacityInputs, host: HostConfig, factors: Sequence[float]) -> Surface:
    """Figure 14: BEP as the host's transfer (x) and computation (y) slow down (Eq. 13)."""
    values = _factors(factors)
    grid = [
        [
            break_even(inputs, HostConfig(host.host_cores, host.k_limit, sd_tx=x, sd_comp=y)).bep
            for x in values
        ]
        for y in values
    ]
    return Surface(
        kind="overload",
        title=f"{inputs.name}: BEP vs host overload (Host({host.host_cores}))",
        x_label="host I/O slow-down sd_tx (x)",
        y_label="host compute slow-down sd_comp (x)",
        xs=values,
        ys=values,
        bep=grid,
        host=host.to_dict(),
    )


def combinations_for_bep(surface: Surface, target: int) -> dict[str, Any]:
    """Hardware combinations giving BEP = ``target``.

    ``exact`` lists every grid point with that BEP. ``corners`` lists the least changes that
    reach it: points with BEP <= target that no other such point beats on both axes (the red
    stars of Figure 10: (2, 7), (3, 4), (4, 3), (8, 2) for Vector Addition on Newport).
    """
    if isinstance(target, bool) or not isinstance(target, int) or target < 1:
        raise CapacityInputError("bep", f"got {target!r}", "give a whole number of drives >= 1")
    points = [
        (x, y, surface.bep[j][i])
        for j, y in enumerate(surface.ys)
        for i, x in enumerate(surface.xs)
    ]
    reaching = [(x, y, b) for x, y, b in points if b <= target]
    corners = [
        (x, y, b)
        for x, y, b in reaching
        if not any((x2, y2) != (x, y) and x2 <= x and y2 <= y for x2, y2, _ in reaching)
    ]
    return {
        "target": target,
        "exact": [{"x": x, "y": y} for x, y, b in points if b == target],
        "corners": [{"x": x, "y": y, "bep": b} for x, y, b in sorted(corners)],
    }


@dataclass(frozen=True)
class SweepConfig:
    """What one sweep draws; ``paper()`` is the paper's own set of figures."""

    figure7: dict[str, dict[str, CapacityInputs]]
    figure8_inputs: CapacityInputs
    figure8_host_cores: int
    surface_inputs: CapacityInputs
    host: HostConfig
    target_bep: int = 4
    factors: tuple[float, ...] = tuple(range(1, 11))

    @classmethod
    def paper(cls, host: HostConfig | None = None, target_bep: int = 4) -> SweepConfig:
        return cls(
            figure7={
                kernel: {device: workload.inputs(device) for device in workload.devices}
                for kernel, workload in WORKLOADS.items()
            },
            figure8_inputs=PRESETS["count-smartssd"],
            figure8_host_cores=16,
            surface_inputs=PRESETS[SURFACE_WORKLOAD],
            host=host or HostConfig(),
            target_bep=target_bep,
        )

    @classmethod
    def single(cls, inputs: CapacityInputs, host: HostConfig, target_bep: int = 4) -> SweepConfig:
        return cls(
            figure7={inputs.name: {"csd": inputs}},
            figure8_inputs=inputs,
            figure8_host_cores=host.host_cores,
            surface_inputs=inputs,
            host=host,
            target_bep=target_bep,
        )


def _panel_title(kernel: str, devices: Mapping[str, CapacityInputs]) -> str:
    data_bytes = next(iter(devices.values())).data_bytes
    size = f" ({data_bytes / 1e9:g} GB working set)" if data_bytes else ""
    return kernel.replace("_", " ") + size


def run_sweep(config: SweepConfig, out_dir: Path, *, prefix: str = "") -> dict[str, Any]:
    """Compute every figure's data, draw the PNGs and write ``sweep.json`` into ``out_dir``;
    ``prefix`` goes in front of every file name (for directories shared with other results)."""
    from quarry.capacity import figures  # matplotlib is slow to import; only sweeps need it

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    figure7 = [
        throughput_curves(devices, k_limit=config.host.k_limit, title=_panel_title(kernel, devices))
        for kernel, devices in config.figure7.items()
    ]
    figure8 = k_limit_curves(config.figure8_inputs, host_cores=config.figure8_host_cores)
    surfaces = {
        "figure10": csd_surface(config.surface_inputs, config.host, config.factors),
        "figure14": overload_surface(config.surface_inputs, config.host, config.factors),
    }
    combinations = {
        name: combinations_for_bep(surface, config.target_bep) for name, surface in surfaces.items()
    }
    drawn = {name: surface.to_dict() for name, surface in surfaces.items()}
    files = {
        "figure7": figures.plot_throughput(figure7, out_dir / f"{prefix}figure7_throughput.png"),
        "figure8": figures.plot_k_limit(figure8, out_dir / f"{prefix}figure8_k_limit.png"),
    }
    for name, surface in drawn.items():
        stem = "figure10_bep_csd_hardware" if name == "figure10" else "figure14_bep_host_overload"
        files[name] = figures.plot_surface(
            surface, combinations[name], out_dir / f"{prefix}{stem}.png"
        )
    summary = {
        "host": config.host.to_dict(),
        "target_bep": config.target_bep,
        "figure7": figure7,
        "figure8": figure8,
        "figure10": {**drawn["figure10"], "combinations": combinations["figure10"]},
        "figure14": {**drawn["figure14"], "combinations": combinations["figure14"]},
        "files": {name: path.name for name, path in files.items()},
        "json": f"{prefix}sweep.json",
    }
    write_json(summary, out_dir / summary["json"])
    return summary
