"""Skytether Exp 2 (Figure 6): per-slice latency on a host-speed device vs an emulated Kinetic
drive, the compute factor between them, the first-slice outliers, and that the device's
run-time decisions ignore those outliers.

    python bench/warmup.py [--rows 2000000]

Each profile runs on a freshly started one-device cluster (cold, like a drive that just booted
its query engine), executing an aggregate sub-plan one slice at a time with a per-slice trace.
The device's decision logic (quarry.device.controller.Adaptive) is then fed the measured
latencies twice: as it runs (the first chunk ignored as warm-up) and with nothing ignored,
showing which decision each would take at every slice.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import matplotlib

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import png_path, write_json

import quarry
from quarry.device.controller import Adaptive
from quarry.protocol.stage import Stage
from quarry.protocol.work import HostCost, Policy
from quarry.samples import particles

matplotlib.use("Agg")
SQL = (
    "SELECT CAST(x / 10 AS INT) AS cell, count(*) AS n, avg(ke) AS ke_avg, "
    "var_samp(ke) AS ke_var FROM physics.particles GROUP BY 1"
)
OUTLIER_SLICES = 5  # plotted apart, as in the paper's Figure 6


# The host-speed device gets Kinetic's 1 MiB key-value limit, so both hold identical slices and
# per-slice latencies compare like for like (the paper runs the same partition on both).
PROFILES_TOML = """
[profiles.host_1mib]
from = "host"
kv_bytes_max = 1048576
"""
PROFILES = {"host": "host_1mib", "kinetic": "kinetic"}


def trace_for(profile: str, rows: int, profiles_file: str) -> list[dict]:
    with quarry.local(devices=1, profile=PROFILES[profile], profiles_file=profiles_file) as cluster:
        cluster.ingest(particles.reader(rows), "physics/particles", partitions=1)
        planned = cluster.query(SQL, pushdown="always", trace=True, chunk_slices=1)
        planned.execute().read_all()
        (partition,) = planned.explain(analyze=True).to_json()["analyze"]["partitions"]
        return [
            {**t, "ms_per_mib": 1e3 * t["seconds"] / (t["bytes_stored"] / 2**20)}
            for t in partition["trace"]
        ]


def replay(trace: list[dict], warmup_chunks: int, host_s_per_byte: float) -> list[str]:
    """The decision the device's controller takes after each slice, fed these latencies."""
    host = HostCost(
        full_s_per_byte=host_s_per_byte,
        raw_ratio=0.4,
        filter_ratio=0.4,
        link_bytes_per_s=312.5e6,
        host_share=0.5,
        start=Stage.FULL,
    )
    policy = Policy(warmup_chunks=warmup_chunks, sample_chunks=1, probe_after_s=1e9)
    controller = Adaptive(
        policy, host, lambda: {"cpu_busy": 0.0, "run_queue": 0.0, "background_load": 0.0}
    )
    decisions = []
    for t in trace:
        controller.observe(Stage.FULL, t["bytes_stored"], t["bytes_shipped"], t["seconds"])
        decisions.append(controller.stage_for(t["first"] + 1)[0])
    return decisions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=2_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        profiles_file = Path(tmp) / "profiles.toml"
        profiles_file.write_text(PROFILES_TOML)
        traces = {
            profile: trace_for(profile, args.rows, str(profiles_file)) for profile in PROFILES
        }
    summary = {}
    for profile, trace in traces.items():
        steady = [t["ms_per_mib"] for t in trace[OUTLIER_SLICES:]]
        first = [t["ms_per_mib"] for t in trace[:OUTLIER_SLICES]]
        summary[profile] = {
            "slices": len(trace),
            "steady_median_ms_per_mib": statistics.median(steady),
            "steady_stdev_ms_per_mib": statistics.pstdev(steady),
            "first_slice_ms_per_mib": first[0],
            "first_slices_ms_per_mib": first,
            "first_over_steady": first[0] / statistics.median(steady),
        }
    factor = (
        summary["kinetic"]["steady_median_ms_per_mib"] / summary["host"]["steady_median_ms_per_mib"]
    )
    # The host's own cost: the host profile's steady latency. A kinetic drive is worth using
    # only when Eq. 1 says so; the threshold sits between its steady cost and its first slice.
    kinetic = traces["kinetic"]
    steady_s_per_byte = summary["kinetic"]["steady_median_ms_per_mib"] / 1e3 / 2**20
    first_s_per_byte = summary["kinetic"]["first_slice_ms_per_mib"] / 1e3 / 2**20
    host_s_per_byte = (steady_s_per_byte + first_s_per_byte) / 2 * 0.5  # host_share 0.5
    decisions = {
        "ignoring_warmup": replay(kinetic, 1, host_s_per_byte),
        "trusting_every_slice": replay(kinetic, 0, host_s_per_byte),
    }
    for profile, s in summary.items():
        print(
            f"{profile:8s} {s['slices']:4d} slices  steady {s['steady_median_ms_per_mib']:7.2f}"
            f" ms/MiB  first slice {s['first_slice_ms_per_mib']:8.2f} ms/MiB "
            f"({s['first_over_steady']:.1f}x steady)"
        )
    print(f"measured compute factor kinetic/host: {factor:.1f}x (profile says 15x)")
    for name, ds in decisions.items():
        print(
            f"controller {name:22s}: first decisions {ds[:6]} ... "
            f"{sum(d == 'full' for d in ds)}/{len(ds)} slices executed"
        )
    path = write_json(
        "warmup",
        {
            "rows": args.rows,
            "sql": SQL,
            "summary": summary,
            "compute_factor_measured": factor,
            "traces": traces,
            "replayed_decisions": decisions,
            "replay_host_s_per_byte": host_s_per_byte,
        },
    )
    plot(traces, summary, decisions, factor)
    print(f"wrote {path}")


def plot(traces: dict, summary: dict, decisions: dict, factor: float) -> None:
    import matplotlib.pyplot as plt

    fig, (left, middle, right) = plt.subplots(
        1, 3, figsize=(14, 4.5), gridspec_kw={"width_ratios": [1, 1.3, 1.6]}
    )
    labels = list(traces)
    left.boxplot(
        [[t["ms_per_mib"] for t in traces[p][:OUTLIER_SLICES]] for p in labels], tick_labels=labels
    )
    left.set_yscale("log")
    left.set_title(f"first {OUTLIER_SLICES} slices (outliers)")
    left.set_ylabel("device latency per slice (ms per MiB stored)")
    middle.boxplot(
        [[t["ms_per_mib"] for t in traces[p][OUTLIER_SLICES:]] for p in labels],
        tick_labels=labels,
        showmeans=True,
    )
    middle.set_yscale("log")
    middle.set_title(f"remaining slices: kinetic/host = {factor:.1f}x")
    for profile in labels:
        right.plot(
            range(len(traces[profile])),
            [t["ms_per_mib"] for t in traces[profile]],
            marker=".",
            label=profile,
        )
    kinetic = traces["kinetic"]
    for name, marker in (("trusting_every_slice", "x"), ("ignoring_warmup", "o")):
        pushed = [i for i, d in enumerate(decisions[name]) if d != "full"]
        right.scatter(
            pushed,
            [kinetic[i]["ms_per_mib"] for i in pushed],
            marker=marker,
            s=40,
            label=f"kinetic pushes back ({name.replace('_', ' ')})",
        )
    right.set_yscale("log")
    right.set_xlabel("slice number (write order)")
    right.set_ylabel("ms per MiB")
    right.set_title("per slice, and the controller's decisions")
    right.legend(fontsize=7)
    fig.suptitle("Skytether Exp 2: host vs emulated Kinetic drive, per-slice latency")
    fig.tight_layout()
    fig.savefig(png_path("warmup"), dpi=120)


if __name__ == "__main__":
    main()
