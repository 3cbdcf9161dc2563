"""The paper's four workloads on its two CSDs, as named inputs, and loading inputs from JSON.

CSDPLAN prints no table of measured times: §4 shows them only as plots (Figures 2, 4-7). The
presets below are reconstructed so that the model reproduces every break-even point the text
states (checked by tests/capacity/test_capacity_presets.py):

- Count, SmartSSD: meets Host(1) at 2 drives, Host(4) at 8, Host(16) at 13 with k_limit 8 and
  beyond 16 with k_limit 12 or 16 (Figure 7a, Figure 8).
- Count, Newport: meets Host(1) at 12 drives (Figure 7a).
- Vector Addition, SmartSSD: BEP 5, and 1 with a 5x faster FPGA (§1).
- Vector Addition, Newport: the BEP = 4 corners (2, 7), (3, 4), (4, 3), (8, 2) of Figure 10.
- Array Merge, Newport: meets Host(1) at 12 drives and Host(4) beyond 16 (Figure 7c); 6 drives
  with a 2x slower host CPU (Figure 15).
- Array Merge / Page Rank: Newport 2.2x and 10x the throughput of SmartSSD (§4.2.3).

Shared across the 4.8 GB workloads, because transfer time depends on the bytes and the bus only:
the host reads from a SmartSSD used as a block device at 3.2 GB/s (1.5 s), SmartSSD loads
internally at 4.8 GB/s (1.0 s), Newport at 0.6 GB/s (8.0 s). The paper's own plots disagree with
each other in places; docs/capacity.md lists where and why these values were chosen.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quarry.capacity.model import CapacityInputError, CapacityInputs

GB = 10**9
INPUTS_FILE_BYTES_MAX = 16 * 2**20


@dataclass(frozen=True)
class WorkloadPreset:
    """One workload: the host's times (one SSD, one core) and each CSD's (tx, comp) times."""

    kernel: str
    data_bytes: int
    t_ssd_tx_s: float
    t_ssd_comp_s: float
    devices: Mapping[str, tuple[float, float]]

    def inputs(self, device: str) -> CapacityInputs:
        t_csd_tx_s, t_csd_comp_s = self.devices[device]
        return CapacityInputs(
            self.t_ssd_tx_s,
            self.t_ssd_comp_s,
            t_csd_tx_s,
            t_csd_comp_s,
            data_bytes=self.data_bytes,
            name=f"{self.kernel}-{device}",
        )


# Page Rank's working set is 0.2 GB, so its transfers are 0.2/4.8 of the others'.
_PAGERANK_SHARE = 0.2 / 4.8

WORKLOADS: dict[str, WorkloadPreset] = {
    "count": WorkloadPreset(
        "count", int(4.8 * GB), 1.5, 0.75, {"smartssd": (1.0, 1.925), "newport": (8.0, 3.0)}
    ),
    "vector_addition": WorkloadPreset(
        "vector_addition", int(4.8 * GB), 1.5, 0.96, {"smartssd": (1.0, 4.8), "newport": (8.0, 8.5)}
    ),
    "array_merge": WorkloadPreset(
        "array_merge", int(4.8 * GB), 1.5, 1.4, {"smartssd": (1.0, 38.6), "newport": (8.0, 10.0)}
    ),
    "pagerank": WorkloadPreset(
        "pagerank",
        int(0.2 * GB),
        1.5 * _PAGERANK_SHARE,
        10.0,
        {"smartssd": (1.0 * _PAGERANK_SHARE, 603.0), "newport": (8.0 * _PAGERANK_SHARE, 60.0)},
    ),
}

DEVICES = ("smartssd", "newport")

PRESETS: dict[str, CapacityInputs] = {
    f"{kernel}-{device}": workload.inputs(device)
    for kernel, workload in WORKLOADS.items()
    for device in DEVICES
}


def preset(name: str) -> CapacityInputs:
    """The named preset, e.g. ``count-smartssd`` or ``array_merge-newport``."""
    try:
        return PRESETS[name]
    except KeyError:
        raise CapacityInputError(
            "workload",
            f"no preset named {name!r}",
            f"choose one of {', '.join(sorted(PRESETS))}, or give --times, --ratios or --inputs",
        ) from None


def load_inputs(path: Path, workload: str | None = None) -> CapacityInputs:
    """Inputs from a JSON file: one object of times or ratios, or ``{"workloads": {name: ...}}``.

    ``quarry calibrate`` writes the second form; ``workload`` picks an entry from it.
    """
    path = Path(path)
    if not path.is_file():
        raise CapacityInputError("inputs", f"no such file {path}", "give a JSON file path")
    if path.stat().st_size > INPUTS_FILE_BYTES_MAX:
        raise CapacityInputError("inputs", f"{path} is larger than 16 MiB", "give the inputs only")
    try:
        document: Any = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise CapacityInputError(
            "inputs", f"{path} is not valid JSON ({error})", "fix the file"
        ) from None
    if isinstance(document, Mapping) and "workloads" in document:
        entries = document["workloads"]
        if not isinstance(entries, Mapping) or not entries:
            raise CapacityInputError(
                "workloads", f"{path}: expected a non-empty object", "map names to inputs"
            )
        if workload is None:
            if len(entries) != 1:
                raise CapacityInputError(
                    "workload",
                    f"{path} holds {len(entries)} workloads",
                    f"choose one with --workload: {', '.join(sorted(entries))}",
                )
            workload = next(iter(entries))
        if workload not in entries:
            raise CapacityInputError(
                "workload",
                f"{path} has no workload {workload!r}",
                f"choose one of {', '.join(sorted(entries))}",
            )
        return CapacityInputs.from_mapping(entries[workload], name=workload)
    return CapacityInputs.from_mapping(document, name=workload or path.stem)
