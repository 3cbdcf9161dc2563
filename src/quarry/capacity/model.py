"""Execution-time model of CSDPLAN (Byun et al., TECS 2024, §3.2.1, Eq. 1-7).

Two single-device systems and their arrays:

- SSD system: the host reads the working set from a block SSD and computes on ``n`` cores.
- CSD system: the drive loads the working set into its own memory and computes on it.

Inputs are four measured times (or three ratios, see ``CapacityInputs.from_ratios``); the host
conditions (cores, bus limit, slow-down factors) are a separate ``HostConfig`` because one
measurement is evaluated under many host conditions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from quarry.cost.eq1 import device_path_s, host_path_s

HOST_CORES_MAX = 4096
K_LIMIT_MAX = 4096
SLOW_DOWN_MAX = 1e6
DEVICES_MAX = 10**12


class CapacityInputError(ValueError):
    """A capacity-planning input is missing or out of range; ``field`` names it."""

    def __init__(self, field: str, problem: str, fix: str) -> None:
        self.field = field
        super().__init__(f"{field}: {problem}; {fix}")


def _number(field: str, value: Any, *, allow_zero: bool, fix: str) -> float:
    if value is None:
        raise CapacityInputError(field, "missing", fix)
    # bool is an int subclass; True as a time is always a mistake in a spec or JSON file.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CapacityInputError(field, f"expected a number, got {value!r}", fix)
    number = float(value)
    if not math.isfinite(number):
        raise CapacityInputError(field, f"must be finite, got {value!r}", fix)
    if number < 0 or (number == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise CapacityInputError(field, f"must be {bound}, got {value!r}", fix)
    return number


def _integer(field: str, value: Any, low: int, high: int, fix: str) -> int:
    if value is None:
        raise CapacityInputError(field, "missing", fix)
    if isinstance(value, bool) or not isinstance(value, int):
        raise CapacityInputError(field, f"expected an integer, got {value!r}", fix)
    if not low <= value <= high:
        raise CapacityInputError(field, f"must be between {low} and {high}, got {value}", fix)
    return value


@dataclass(frozen=True)
class Ratios:
    """The ratios of §3.2.2 for a host with ``host_cores`` cores (R_tx, R_(n)comp, R_(n)SSD)."""

    r_tx: float  # BW_internal / BW_external = T_SSD-tx / T_CSD-tx
    r_comp: float  # T_SSD(n)-comp / T_CSD-comp
    r_ssd: float  # T_SSD-tx / T_SSD(n)-comp
    host_cores: int


@dataclass(frozen=True)
class CapacityInputs:
    """Measured times of one workload on the host (one SSD, one core) and on one CSD.

    ``t_ssd_comp_s`` is the host's sequential (one-core) computation time; Eq. 2 divides it by
    the core count. When built from ratios the times are in units of T_SSD(n)-comp rather than
    seconds (``normalized``); break-even points do not depend on the unit.
    """

    t_ssd_tx_s: float
    t_ssd_comp_s: float
    t_csd_tx_s: float
    t_csd_comp_s: float
    data_bytes: int | None = None
    name: str = "custom"
    normalized: bool = False

    def __post_init__(self) -> None:
        fix = "give the measured time in seconds (quarry calibrate measures it)"
        for field in ("t_ssd_tx_s", "t_csd_tx_s", "t_csd_comp_s"):
            object.__setattr__(
                self, field, _number(field, getattr(self, field), allow_zero=True, fix=fix)
            )
        # Eq. 8 divides by the host's computation time, so it cannot be zero.
        object.__setattr__(
            self,
            "t_ssd_comp_s",
            _number("t_ssd_comp_s", self.t_ssd_comp_s, allow_zero=False, fix=fix),
        )
        if self.t_csd_tx_s + self.t_csd_comp_s == 0:
            raise CapacityInputError(
                "t_csd_tx_s", "t_csd_tx_s and t_csd_comp_s are both 0", "measure the CSD times"
            )
        if self.data_bytes is not None:
            _integer("data_bytes", self.data_bytes, 1, 2**62, "give the working-set size in bytes")

    @classmethod
    def from_ratios(
        cls,
        r_tx: float | None,
        r_comp: float | None,
        r_ssd: float | None,
        *,
        host_cores_measured: int = 1,
        data_bytes: int | None = None,
        name: str = "custom",
    ) -> CapacityInputs:
        """Inputs from R_tx, R_(n)comp and R_(n)SSD measured with ``host_cores_measured`` cores."""
        fix = "ratios are positive: R_tx = BW_int/BW_ext, R_comp and R_SSD as in CSDPLAN §3.2.2"
        r_tx = _number("r_tx", r_tx, allow_zero=False, fix=fix)
        r_comp = _number("r_comp", r_comp, allow_zero=False, fix=fix)
        r_ssd = _number("r_ssd", r_ssd, allow_zero=False, fix=fix)
        cores = _integer(
            "host_cores_measured", host_cores_measured, 1, HOST_CORES_MAX, "give the core count"
        )
        # Unit of time: T_SSD(n)-comp at the measured core count.
        t_ssd_tx = r_ssd
        return cls(
            t_ssd_tx_s=t_ssd_tx,
            t_ssd_comp_s=float(cores),
            t_csd_tx_s=t_ssd_tx / r_tx,
            t_csd_comp_s=1.0 / r_comp,
            data_bytes=data_bytes,
            name=name,
            normalized=True,
        )

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], *, name: str | None = None) -> CapacityInputs:
        """Inputs from a JSON object holding either the four times or the three ratios."""
        if not isinstance(values, Mapping):
            raise CapacityInputError("inputs", f"expected a JSON object, got {values!r}", _FORMAT)
        label = str(values.get("name", name or "custom"))
        data_bytes = values.get("data_bytes")
        time_fields = ("t_ssd_tx_s", "t_ssd_comp_s", "t_csd_tx_s", "t_csd_comp_s")
        ratio_fields = ("r_tx", "r_comp", "r_ssd")
        if any(field in values for field in time_fields):
            return cls(*(values.get(field) for field in time_fields), data_bytes, label)
        if any(field in values for field in ratio_fields):
            return cls.from_ratios(
                *(values.get(field) for field in ratio_fields),
                host_cores_measured=values.get("host_cores_measured", 1),
                data_bytes=data_bytes,
                name=label,
            )
        raise CapacityInputError("inputs", "neither times nor ratios given", _FORMAT)

    @classmethod
    def from_kernel_runs(
        cls, host: Mapping[str, Any], device: Mapping[str, Any], *, name: str = "measured"
    ) -> CapacityInputs:
        """Inputs from two ``run_kernel`` reports: the host's with one thread, the device's."""
        if host.get("threads", 1) != 1:
            raise CapacityInputError(
                "host.threads",
                f"the host run used {host.get('threads')} threads",
                "measure the host with threads=1; Eq. 2 scales it to n cores",
            )
        return cls(
            t_ssd_tx_s=host.get("transfer_s"),
            t_ssd_comp_s=host.get("compute_s"),
            t_csd_tx_s=device.get("transfer_s"),
            t_csd_comp_s=device.get("compute_s"),
            data_bytes=host.get("bytes") or None,
            name=name,
        )

    def ratios(self, host_cores: int = 1) -> Ratios:
        t_ssd_comp_n = t_ssd_comp_n_s(self, host_cores)
        return Ratios(
            r_tx=self.t_ssd_tx_s / self.t_csd_tx_s if self.t_csd_tx_s else math.inf,
            r_comp=t_ssd_comp_n / self.t_csd_comp_s if self.t_csd_comp_s else math.inf,
            r_ssd=self.t_ssd_tx_s / t_ssd_comp_n,
            host_cores=host_cores,
        )

    def scaled(self, csd_io_factor: float = 1.0, csd_compute_factor: float = 1.0) -> CapacityInputs:
        """The same workload on a CSD with x times the internal bandwidth and y times the compute.

        These are the axes of CSDPLAN Figure 10 (R_tx and R_comp multiplied by x and y).
        """
        fix = "a factor of 2 means twice as fast"
        x = _number("csd_io_factor", csd_io_factor, allow_zero=False, fix=fix)
        y = _number("csd_compute_factor", csd_compute_factor, allow_zero=False, fix=fix)
        return CapacityInputs(
            self.t_ssd_tx_s,
            self.t_ssd_comp_s,
            self.t_csd_tx_s / x,
            self.t_csd_comp_s / y,
            self.data_bytes,
            self.name,
            self.normalized,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_FORMAT = (
    "give t_ssd_tx_s, t_ssd_comp_s, t_csd_tx_s, t_csd_comp_s (seconds) "
    "or r_tx, r_comp, r_ssd (see docs/capacity.md)"
)


@dataclass(frozen=True)
class HostConfig:
    """The host under study: active cores n, bus limit k_limit (Eq. 6), slow-down factors (Eq. 4).

    k_limit = 8 is the paper's example: a PCIe 3.0 x32 host bus (32 GB/s) over SSDs of 4 GB/s.
    """

    host_cores: int = 1
    k_limit: int = 8
    sd_tx: float = 1.0
    sd_comp: float = 1.0

    def __post_init__(self) -> None:
        _integer("host_cores", self.host_cores, 1, HOST_CORES_MAX, "give the active host cores")
        _integer(
            "k_limit",
            self.k_limit,
            1,
            K_LIMIT_MAX,
            "k_limit is how many SSDs saturate the host bus (bus bandwidth / SSD bandwidth)",
        )
        for field in ("sd_tx", "sd_comp"):
            value = _number(
                field, getattr(self, field), allow_zero=False, fix="slow-down factors are >= 1"
            )
            # Eq. 4 defines slow-down factors as >= 1: overload only slows the host down.
            if not 1.0 <= value <= SLOW_DOWN_MAX:
                raise CapacityInputError(
                    field,
                    f"must be between 1 and {SLOW_DOWN_MAX:g}, got {value!r}",
                    "1 means no overload; model a faster host with more cores instead",
                )
            object.__setattr__(self, field, value)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def overloaded_host(
    normal: CapacityInputs, overloaded: CapacityInputs, host: HostConfig
) -> HostConfig:
    """``host`` with the slow-down factors (Eq. 4) measured on it: the SSD system's times under
    other work (``overloaded``) over its times without (``normal``), for the same working set.

    This is §4.4's first step: characterize the host under overload, then put the factors into
    Eq. 5 and Eq. 8 / 13. A factor measured below 1 (noise: the other work did not slow that
    term) counts as 1, the floor Eq. 4 sets.
    """
    if normal.data_bytes != overloaded.data_bytes:
        raise CapacityInputError(
            "overloaded.data_bytes",
            f"{overloaded.data_bytes} bytes against {normal.data_bytes} without overload",
            "measure both conditions on the same working set",
        )
    return replace(
        host,
        sd_tx=max(1.0, overloaded.t_ssd_tx_s / normal.t_ssd_tx_s),
        sd_comp=max(1.0, overloaded.t_ssd_comp_s / normal.t_ssd_comp_s),
    )


def k_limit_from_bus(bus_bandwidth_bytes_per_s: float, ssd_bandwidth_bytes_per_s: float) -> int:
    """SSDs that saturate the host bus: the paper's 32 GB/s / 4 GB/s = 8."""
    bus = _number(
        "bus_bandwidth_bytes_per_s", bus_bandwidth_bytes_per_s, allow_zero=False, fix="give B/s"
    )
    ssd = _number(
        "ssd_bandwidth_bytes_per_s", ssd_bandwidth_bytes_per_s, allow_zero=False, fix="give B/s"
    )
    return max(1, min(K_LIMIT_MAX, math.floor(bus / ssd)))


def _devices(m: int) -> int:
    return _integer("devices", m, 1, DEVICES_MAX, "the number of drives is at least 1")


def t_ssd_comp_n_s(inputs: CapacityInputs, host_cores: int) -> float:
    """Eq. 2: the host's computation divides evenly over n cores."""
    _integer("host_cores", host_cores, 1, HOST_CORES_MAX, "give the active host cores")
    return inputs.t_ssd_comp_s / host_cores


def t_ssd_system_s(inputs: CapacityInputs, host: HostConfig) -> float:
    """Eq. 1, and Eq. 4 when the host is overloaded (sd_tx, sd_comp > 1): ActivePy's host path,
    the host reads the data over its bus and computes on it."""
    return host_path_s(
        host.sd_tx * inputs.t_ssd_tx_s, host.sd_comp * t_ssd_comp_n_s(inputs, host.host_cores)
    )


def t_csd_system_s(inputs: CapacityInputs) -> float:
    """Eq. 3: ActivePy's device path, the drive computing on what it loaded over its own bus;
    the drive is not affected by the host's overload."""
    return device_path_s(inputs.t_csd_comp_s, inputs.t_csd_tx_s)


def m_ssd(m: int, k_limit: int) -> int:
    """Eq. 6: SSDs beyond k_limit add no bandwidth because the host bus is saturated."""
    return min(_devices(m), k_limit)


def t_ssd_array_s(inputs: CapacityInputs, host: HostConfig, m: int) -> float:
    """Eq. 5: transfer divides over the SSDs the bus can use; computation stays on the host."""
    effective = m_ssd(m, host.k_limit)
    return host_path_s(
        host.sd_tx * inputs.t_ssd_tx_s / effective,
        host.sd_comp * t_ssd_comp_n_s(inputs, host.host_cores),
    )


def t_csd_array_s(inputs: CapacityInputs, m: int) -> float:
    """Eq. 7: each CSD has its own bus and compute, so both terms divide by m."""
    devices = _devices(m)
    return device_path_s(inputs.t_csd_comp_s, inputs.t_csd_tx_s) / devices


def throughput_bytes_per_s(data_bytes: int, time_s: float) -> float:
    assert time_s > 0, f"execution time must be positive, got {time_s}"
    return data_bytes / time_s
