"""Resource profiles: what kind of drive a device process behaves like (DESIGN §5).

Figures come from the papers: Kinetic drives (Skytether §6.1: Cortex-A53, measured ~15x slower
than the host; HDD internal read 261 MB/s; 2.5 GbE), Newport (Linux on the drive, ~4-5x slower,
PCIe 3 x4), SmartSSD (FPGA kernels only), ScaleFlux (scan engines evaluating simple comparisons,
decompression in the drive). User-defined profiles come from a TOML file.
"""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from quarry import machine
from quarry.errors import UnknownProfile

MiB = 1 << 20
GiB = 1 << 30
PCIE3_X4_BYTES_PER_S = 3.5e9  # usable of 3.94 GB/s raw

# What a device can evaluate of a sub-plan.
CAPABILITIES = ("full", "scan_filter", "kernels")
# The column cache takes at most this fraction of the memory it is sized from (the machine's, or
# a profile's): on a machine of four devices, half its memory, the rest left to the page cache,
# the host's queries and the devices' own work.
CACHE_MEMORY_SHARE = 8


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    compute_factor: float  # device CPU seconds per host CPU second for the same work (1 = host)
    cores: int | None  # None: all of the machine's
    memory_bytes: int | None
    internal_bytes_per_s: float | None  # store -> device memory; None: unlimited (the disk's own)
    external_bytes_per_s: float | None  # device -> host link; None: unlimited (loopback)
    kv_bytes_max: int
    capabilities: str = "full"
    # Operators / functions the device evaluates; empty means everything DataFusion runs.
    expressions: tuple[str, ...] = field(default_factory=tuple)
    # memory kept for decoded columns (``device.column_cache``); None: ``cache_bytes`` says
    column_cache_bytes: int | None = None

    def __post_init__(self) -> None:
        assert self.compute_factor > 0, self
        assert self.kv_bytes_max >= 4096, self
        assert self.capabilities in CAPABILITIES, self

    @property
    def emulated(self) -> bool:
        return not (
            self.compute_factor == 1.0
            and self.internal_bytes_per_s is None
            and self.external_bytes_per_s is None
        )

    def cache_bytes(self, default_bytes: int | None) -> int:
        """Memory for decoded columns: the profile's figure, else none for an emulated drive
        (its calibrations, and the papers' experiments it reproduces, are of the drive reading
        every time), else ``default_bytes`` (``QUARRY_DEVICE_CACHE_MIB``; None: an eighth of
        the machine's memory), at most an eighth of the device's memory."""
        if self.column_cache_bytes is not None:
            return self.column_cache_bytes
        if self.emulated:
            return 0
        if default_bytes is None:
            default_bytes = machine.memory_bytes() // CACHE_MEMORY_SHARE
        if self.memory_bytes is not None:
            return min(default_bytes, self.memory_bytes // CACHE_MEMORY_SHARE)
        return default_bytes

    def to_json(self) -> dict[str, Any]:
        body = asdict(self)
        body["expressions"] = list(self.expressions)
        return body


SCAN_ENGINE_EXPRESSIONS = ("=", "!=", "<", "<=", ">", ">=", "is_null", "is_not_null", "and", "or")

BUILTIN: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            "host",
            "no emulation: the machine's own CPU and disk",
            1.0,
            None,
            None,
            None,
            None,
            4 * MiB,
        ),
        Profile(
            "kinetic",
            "Kinetic HDD with an ARM Cortex-A53 (Skytether)",
            15.0,
            2,
            1 * GiB,
            261e6,
            2.5e9 / 8,
            1 * MiB,
        ),
        Profile(
            "newport",
            "NGD Newport SSD with Linux on the drive",
            4.5,
            4,
            8 * GiB,
            0.43 * PCIE3_X4_BYTES_PER_S,
            PCIE3_X4_BYTES_PER_S,
            4 * MiB,
        ),
        Profile(
            "activepy",
            "the CSD of ActivePy §IV.A: 8 Cortex-A72 cores (about 3.5x slower), 9 GB/s to its "
            "flash, NVMe at 5 GB/s",
            3.5,
            8,
            8 * GiB,
            9e9,
            5e9,
            4 * MiB,
        ),
        Profile(
            "smartssd",
            "Samsung SmartSSD: FPGA kernels beside an SSD",
            1.0,
            None,
            4 * GiB,
            0.84 * PCIE3_X4_BYTES_PER_S,
            PCIE3_X4_BYTES_PER_S,
            4 * MiB,
            "kernels",
        ),
        Profile(
            "scaleflux",
            "ScaleFlux drive with hardware scan engines (POLARDB)",
            1.0,
            None,
            None,
            3.0e9,
            PCIE3_X4_BYTES_PER_S,
            4 * MiB,
            "scan_filter",
            SCAN_ENGINE_EXPRESSIONS,
        ),
    )
}


def load_profiles(path: str | Path | None = None) -> dict[str, Profile]:
    """Built-in profiles, plus user-defined ones from a TOML file.

    Each ``[profiles.NAME]`` table may start ``from = "kinetic"`` and override any field.
    """
    profiles = dict(BUILTIN)
    if path is None:
        return profiles
    try:
        document = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise UnknownProfile(f"cannot read profile file {path}: {error}") from None
    for name, table in document.get("profiles", {}).items():
        base = profiles.get(table.pop("from", "host"))
        if base is None:
            raise UnknownProfile(f"profile {name!r} in {path} starts from an unknown profile")
        if "expressions" in table:
            table["expressions"] = tuple(table["expressions"])
        try:
            profiles[name] = replace(base, name=name, **table)
        except TypeError as error:
            raise UnknownProfile(f"profile {name!r} in {path}: {error}") from None
    return profiles


def get_profile(name: str, path: str | Path | None = None) -> Profile:
    profiles = load_profiles(path)
    if name not in profiles:
        raise UnknownProfile(
            f"unknown profile {name!r}: choose one of {', '.join(sorted(profiles))}, or define it "
            "in a profile TOML file (--profiles FILE)"
        )
    return profiles[name]
