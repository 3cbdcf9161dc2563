"""Break-even point (BEP) of CSDPLAN §3.2.2: Eq. 8, 9, 12 and 13, and the k_limit-aware BEP.

The BEP is the least number of drives m at which a CSD array is at least as fast as an SSD array
of the same m drives: T_CSD-array(m) <= T_SSD(n)-array(m).

Eq. 8 is derived with M_SSD = M_CSD = m, i.e. it ignores the bus cap of Eq. 6. It is exact while
its answer is <= k_limit; beyond that the SSD array stops getting faster, the CSD array catches up
sooner, and ``break_even`` solves Eq. 5-7 with the cap instead (docs/capacity.md, case 1).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from quarry.capacity.model import (
    DEVICES_MAX,
    CapacityInputError,
    CapacityInputs,
    HostConfig,
    Ratios,
    t_csd_array_s,
    t_csd_system_s,
    t_ssd_array_s,
    t_ssd_comp_n_s,
)

# Floating-point sums such as 0.1 * 3 land a hair above an integer; without slack ceil() would
# report one drive more than a tie needs.
CEIL_SLACK = 1e-9


def ceil_bep(x: float) -> int:
    """max(ceil(x), 1): the least integer >= x, and never fewer than one drive (Eq. 12)."""
    bep = max(math.ceil(x - CEIL_SLACK * max(1.0, abs(x))), 1) if math.isfinite(x) else None
    if bep is None or bep > DEVICES_MAX:
        raise CapacityInputError(
            "inputs",
            f"the break-even point is {x:.3g} drives, beyond {DEVICES_MAX:.0e}",
            "the CSD never catches up in practice; check that the times are in seconds",
        )
    return bep


def eq8_terms_s(inputs: CapacityInputs, host: HostConfig) -> tuple[float, float]:
    """Numerator and denominator of Eq. 8 (seconds, or normalized units)."""
    numerator = inputs.t_csd_tx_s + inputs.t_csd_comp_s - host.sd_tx * inputs.t_ssd_tx_s
    denominator = host.sd_comp * t_ssd_comp_n_s(inputs, host.host_cores)
    assert denominator > 0, "validated inputs give a positive host computation time"
    return numerator, denominator


def bep_eq8(inputs: CapacityInputs, host: HostConfig) -> int:
    """Eq. 8 (Eq. 9 when sd_tx = sd_comp = 1), floored at one drive."""
    numerator, denominator = eq8_terms_s(inputs, host)
    return ceil_bep(numerator / denominator)


def _positive_ratio(field: str, value: float) -> float:
    if not value > 0:
        raise CapacityInputError(field, f"must be > 0, got {value!r}", "ratios are positive")
    return value


def eq13_value(r_tx: float, r_comp: float, r_ssd: float, sd_tx: float, sd_comp: float) -> float:
    """The bracket of Eq. 13: sd_comp^-1 * ((R_tx^-1 - sd_tx) * R_(n)SSD + R_(n)comp^-1)."""
    for field, value in (("r_tx", r_tx), ("r_comp", r_comp), ("r_ssd", r_ssd)):
        _positive_ratio(field, value)
    for field, value in (("sd_tx", sd_tx), ("sd_comp", sd_comp)):
        if not value >= 1:
            raise CapacityInputError(field, f"must be >= 1, got {value!r}", "1 means no overload")
    return ((1.0 / r_tx - sd_tx) * r_ssd + 1.0 / r_comp) / sd_comp


def bep_eq12(r_tx: float, r_comp: float, r_ssd: float) -> int:
    """Eq. 12: max(ceil((R_tx^-1 - 1) * R_(n)SSD + R_(n)comp^-1), 1)."""
    return ceil_bep(eq13_value(r_tx, r_comp, r_ssd, 1.0, 1.0))


def bep_eq13(r_tx: float, r_comp: float, r_ssd: float, sd_tx: float, sd_comp: float) -> int:
    """Eq. 13, the overloaded host: Eq. 12 with the host's terms slowed by sd_tx and sd_comp."""
    return ceil_bep(eq13_value(r_tx, r_comp, r_ssd, sd_tx, sd_comp))


@dataclass(frozen=True)
class BreakEven:
    """A BEP with every term that produced it, for printing and JSON."""

    bep: int
    bep_eq8: int
    eq8_value: float
    eq8_numerator_s: float
    eq8_denominator_s: float
    k_limit_binds: bool
    capped_value: float | None
    ratios: Ratios
    t_ssd_comp_n_s: float
    t_ssd_array_at_bep_s: float
    t_csd_array_at_bep_s: float
    t_ssd_array_before_bep_s: float | None
    t_csd_array_before_bep_s: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def break_even(inputs: CapacityInputs, host: HostConfig) -> BreakEven:
    """The BEP of Eq. 5-7 including the bus cap, with the Eq. 8 closed form alongside."""
    numerator, denominator = eq8_terms_s(inputs, host)
    eq8_value = numerator / denominator
    closed = ceil_bep(eq8_value)
    capped_value: float | None = None
    if closed <= host.k_limit:
        bep = closed
    else:
        # Past k_limit the SSD array's time is constant, so the CSD array (time C/m) meets it at
        # m = C / T_SSD-array(k_limit); that m is > k_limit because Eq. 8's value is.
        capped_value = t_csd_system_s(inputs) / t_ssd_array_s(inputs, host, host.k_limit)
        bep = ceil_bep(capped_value)
        assert bep > host.k_limit, (bep, host.k_limit)
    assert bep <= closed, "the bus cap can only make the SSD array slower"
    t_ssd_at, t_csd_at = t_ssd_array_s(inputs, host, bep), t_csd_array_s(inputs, bep)
    assert t_csd_at <= t_ssd_at * (1 + 1e-6), (bep, t_csd_at, t_ssd_at)
    before = bep - 1
    return BreakEven(
        bep=bep,
        bep_eq8=closed,
        eq8_value=eq8_value,
        eq8_numerator_s=numerator,
        eq8_denominator_s=denominator,
        k_limit_binds=closed > host.k_limit,
        capped_value=capped_value,
        ratios=inputs.ratios(host.host_cores),
        t_ssd_comp_n_s=t_ssd_comp_n_s(inputs, host.host_cores),
        t_ssd_array_at_bep_s=t_ssd_at,
        t_csd_array_at_bep_s=t_csd_at,
        t_ssd_array_before_bep_s=t_ssd_array_s(inputs, host, before) if before else None,
        t_csd_array_before_bep_s=t_csd_array_s(inputs, before) if before else None,
    )
