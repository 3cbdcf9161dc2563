"""Total cost of ownership, CSDPLAN §4.5 / Table 4: performance per dollar, capacity per dollar.

A spec (TOML or JSON) lists CPUs (PassMark score, price), drives (capacity, price) and systems
(a CPU, a drive, a drive count). As in the paper, only the CPU and the drives are costed, and the
CSD systems are sized (by their BEP) to deliver the baseline's throughput, so every system's
performance is the baseline CPU's score unless the system gives its own ``performance``.
See docs/examples/csdplan-table4.toml.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from quarry.capacity.model import CapacityInputError

SPEC_BYTES_MAX = 1 * 2**20
SYSTEMS_MAX = 256
DRIVE_COUNT_MAX = 100_000


@dataclass(frozen=True)
class SystemCost:
    name: str
    cpu: str
    cpu_score: float
    cpu_slowdown: float  # baseline CPU score / this CPU's score
    cpu_cost_usd: float
    drive: str
    drive_count: int
    storage_cost_usd: float
    total_cost_usd: float
    performance: float
    capacity_gb: float
    performance_per_usd: float
    capacity_gb_per_usd: float
    performance_per_usd_vs_baseline: float
    capacity_gb_per_usd_vs_baseline: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _positive(field: str, table: Mapping[str, Any], key: str, fix: str) -> float:
    value = table.get(key)
    if value is None:
        raise CapacityInputError(f"{field}.{key}", "missing", fix)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise CapacityInputError(f"{field}.{key}", f"expected a number, got {value!r}", fix)
    if value <= 0:
        raise CapacityInputError(f"{field}.{key}", f"must be > 0, got {value!r}", fix)
    return float(value)


def _table(spec: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    table = spec.get(key)
    if not isinstance(table, Mapping) or not table:
        raise CapacityInputError(
            key, "missing or empty", f"add a [{key}.NAME] table per {key[:-1]} (docs/capacity.md)"
        )
    return table


def _entry(spec: Mapping[str, Any], kind: str, name: Any, system: str) -> Mapping[str, Any]:
    table = _table(spec, kind)
    if name not in table or not isinstance(table[name], Mapping):
        raise CapacityInputError(
            f"systems.{system}.{kind[:-1]}",
            f"no {kind[:-1]} named {name!r}",
            f"choose one of {', '.join(sorted(table))}",
        )
    return table[name]


def load_spec(path: Path) -> dict[str, Any]:
    """Read a TOML or JSON spec (by suffix; other suffixes are tried as TOML, then JSON)."""
    path = Path(path)
    if not path.is_file():
        raise CapacityInputError("spec", f"no such file {path}", "give a TOML or JSON spec file")
    if path.stat().st_size > SPEC_BYTES_MAX:
        raise CapacityInputError("spec", f"{path} is larger than 1 MiB", "give a spec, not data")
    text = path.read_text()
    try:
        if path.suffix == ".json":
            return json.loads(text)
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError:
            if path.suffix == ".toml":
                raise
            return json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as error:
        raise CapacityInputError("spec", f"{path} does not parse ({error})", "fix it") from None


def compute_tco(spec: Mapping[str, Any]) -> list[SystemCost]:
    """Cost, performance per dollar and capacity per dollar of every system in ``spec``."""
    systems = spec.get("systems")
    if not isinstance(systems, list) or not systems:
        raise CapacityInputError("systems", "missing or empty", "add [[systems]] entries")
    if len(systems) > SYSTEMS_MAX:
        raise CapacityInputError("systems", f"{len(systems)} systems", f"give <= {SYSTEMS_MAX}")
    names = [system.get("name") if isinstance(system, Mapping) else None for system in systems]
    for index, name in enumerate(names):
        if not isinstance(name, str) or not name:
            raise CapacityInputError(f"systems[{index}].name", "missing", "name every system")
    if len(set(names)) != len(names):
        raise CapacityInputError("systems", "duplicate system names", "name each system once")
    baseline_name = spec.get("baseline", names[0])
    if baseline_name not in names:
        raise CapacityInputError(
            "baseline", f"no system named {baseline_name!r}", f"choose one of {', '.join(names)}"
        )

    def cpu_of(system: Mapping[str, Any]) -> tuple[str, float, float]:
        cpu_name = system.get("cpu")
        cpu = _entry(spec, "cpus", cpu_name, system["name"])
        field = f"cpus.{cpu_name}"
        score = _positive(field, cpu, "passmark", "give the CPU's PassMark CPU Mark")
        price = _positive(field, cpu, "price_usd", "give the CPU's price in US dollars")
        return str(cpu_name), score, price

    baseline = systems[names.index(baseline_name)]
    baseline_score = cpu_of(baseline)[1]
    costs = []
    for system in systems:
        cpu_name, score, cpu_price = cpu_of(system)
        drive_name = system.get("drive")
        drive = _entry(spec, "drives", drive_name, system["name"])
        field = f"drives.{drive_name}"
        drive_price = _positive(field, drive, "price_usd", "give the drive's price in US dollars")
        capacity = _positive(field, drive, "capacity_gb", "give the drive's capacity in GB")
        count = system.get("drive_count")
        whole = isinstance(count, int) and not isinstance(count, bool)
        if not whole or not 1 <= count <= DRIVE_COUNT_MAX:
            raise CapacityInputError(
                f"systems.{system['name']}.drive_count",
                f"expected an integer from 1 to {DRIVE_COUNT_MAX}, got {count!r}",
                "give the number of drives (for CSD systems, the BEP from `quarry capacity bep`)",
            )
        performance = (
            _positive(f"systems.{system['name']}", system, "performance", "give a positive score")
            if "performance" in system
            else baseline_score
        )
        storage = count * drive_price
        total = cpu_price + storage
        costs.append(
            SystemCost(
                name=system["name"],
                cpu=cpu_name,
                cpu_score=score,
                cpu_slowdown=baseline_score / score,
                cpu_cost_usd=cpu_price,
                drive=str(drive_name),
                drive_count=count,
                storage_cost_usd=storage,
                total_cost_usd=total,
                performance=performance,
                capacity_gb=count * capacity,
                performance_per_usd=performance / total,
                capacity_gb_per_usd=count * capacity / total,
                performance_per_usd_vs_baseline=math.nan,
                capacity_gb_per_usd_vs_baseline=math.nan,
            )
        )
    reference = costs[names.index(baseline_name)]
    return [
        SystemCost(
            **{
                **cost.to_dict(),
                "performance_per_usd_vs_baseline": cost.performance_per_usd
                / reference.performance_per_usd,
                "capacity_gb_per_usd_vs_baseline": cost.capacity_gb_per_usd
                / reference.capacity_gb_per_usd,
            }
        )
        for cost in costs
    ]
