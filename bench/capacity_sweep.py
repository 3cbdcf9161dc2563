"""CSDPLAN Figures 7, 8, 10 and 14 and Table 4 from the model, into bench/results/.

Run: python bench/capacity_sweep.py [--out DIR]

Reports the break-even points the figures show and the hardware combinations that reach the
target BEP; it measures the model, not this machine, so it does not pass or fail.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from quarry.capacity.break_even import break_even
from quarry.capacity.model import HostConfig
from quarry.capacity.presets import PRESETS
from quarry.capacity.report import write_json
from quarry.capacity.sweep import HOST_CORES_FIGURE7, SweepConfig, run_sweep
from quarry.capacity.tco import compute_tco, load_spec

ROOT = Path(__file__).resolve().parent.parent
TABLE4_SPEC = ROOT / "docs" / "examples" / "csdplan-table4.toml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--bep", type=int, default=4, help="target BEP for Figures 10 and 14")
    arguments = parser.parse_args()

    started = time.perf_counter()
    summary = run_sweep(
        SweepConfig.paper(target_bep=arguments.bep), arguments.out, prefix="capacity_"
    )
    breaks = {
        name: {
            cores: break_even(inputs, HostConfig(host_cores=cores)).bep
            for cores in HOST_CORES_FIGURE7
        }
        for name, inputs in PRESETS.items()
    }
    costs = [cost.to_dict() for cost in compute_tco(load_spec(TABLE4_SPEC))]
    write_json(
        {"bep_by_host_cores": breaks, "table4": costs}, arguments.out / "capacity_bep_and_tco.json"
    )
    elapsed_s = time.perf_counter() - started

    print("BEP (drives) by host cores, k_limit 8:")
    for name, row in breaks.items():
        print(f"  {name:26s} " + "  ".join(f"Host({cores})={bep}" for cores, bep in row.items()))
    for figure in ("figure10", "figure14"):
        corners = summary[figure]["combinations"]["corners"]
        print(
            f"{figure}: BEP <= {arguments.bep} first reached at "
            + ", ".join(f"({c['x']:g}, {c['y']:g})" for c in corners)
        )
    print(
        "Table 4: "
        + "; ".join(
            f"{c['name']}: {c['performance_per_usd']:.1f}/$, {c['capacity_gb_per_usd']:.2f} GB/$"
            for c in costs
        )
    )
    for path in [*summary["files"].values(), summary["json"], "capacity_bep_and_tco.json"]:
        print(f"wrote {arguments.out / path}")
    print(f"took {elapsed_s:.1f} s")


if __name__ == "__main__":
    main()
