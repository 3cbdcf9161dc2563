"""Capacity planning for computational storage: CSDPLAN (Byun et al., TECS 2024).

How many computational storage drives beat a host with plain SSDs (the break-even point), how
that moves with hardware and host load, and what each option costs. See docs/capacity.md.
"""

from quarry.capacity.break_even import (
    BreakEven,
    bep_eq8,
    bep_eq12,
    bep_eq13,
    break_even,
)
from quarry.capacity.model import (
    CapacityInputError,
    CapacityInputs,
    HostConfig,
    Ratios,
    k_limit_from_bus,
)
from quarry.capacity.presets import PRESETS, load_inputs, preset

__all__ = [
    "PRESETS",
    "BreakEven",
    "CapacityInputError",
    "CapacityInputs",
    "HostConfig",
    "Ratios",
    "bep_eq8",
    "bep_eq12",
    "bep_eq13",
    "break_even",
    "k_limit_from_bus",
    "load_inputs",
    "preset",
]
