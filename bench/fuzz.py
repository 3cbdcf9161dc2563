"""Fuzz every decoder a device exposes and every reader ingest runs; count what they do.

    python bench/fuzz.py [--inputs 100000] [--live-inputs 8000] [--workers 2] [--seed 1]

In-process targets (``quarry.fuzz.decoders``: wire frames, Substrait stages, stored slices,
Parquet, CSV, Arrow IPC, h5ad, 10x MTX) run in child processes, ``--workers`` at a time, in
chunks; a chunk whose process dies is a crash, one that outlives its time a hang, each with the
command that reproduces it. Then a live cluster (2 devices, one dataset) records the requests
its coordinator sends while it runs queries, a scan, an ingest and a drop, and a device is fed
``--live-inputs`` mutations of them (action bodies, tickets, exchange and put descriptors);
after every chunk a health query through the coordinator must give its first answer.

Writes bench/results/fuzz.json (inputs, outcomes and error classes per target) and fuzz.png.
Crashes and hangs must be 0, and so must unclear errors: each is a bug with its example.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Any

import matplotlib
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import png_path, progress, write_json

import quarry
from quarry.errors import QuarryError
from quarry.fuzz import live, workers
from quarry.fuzz.core import Outcomes
from quarry.samples import particles

matplotlib.use("Agg")
import matplotlib.pyplot as plt

# Share of the in-process inputs per target: cheap decoders get more; h5ad starts a child
# process per input (its structure is walked there, see genes.readers.check_hdf5_structure).
SHARES = {
    "frames": 0.28,
    "substrait": 0.20,
    "slices": 0.16,
    "parquet": 0.10,
    "csv": 0.09,
    "arrow": 0.09,
    "mtx": 0.06,
    "h5ad": 0.02,
}
CHUNK_INPUTS = 2_000
LIVE_CHUNK_INPUTS = 500
HEALTH_SQL = "SELECT count(*) AS n, sum(ke) AS ke FROM physics.particles WHERE ke > 1"


def in_process(total: int, worker_count: int, seed: int, console: Console) -> dict[str, Outcomes]:
    plan = {target: max(1, round(total * share)) for target, share in SHARES.items()}
    chunks = workers.chunks(plan, CHUNK_INPUTS, seed)
    with progress(console) as bar:
        task = bar.add_task("in-process targets", total=sum(plan.values()))
        totals = workers.run(chunks, worker_count, lambda chunk, _: bar.advance(task, chunk.inputs))
    return totals


def on_a_device(total: int, seed: int, console: Console) -> tuple[dict[str, Outcomes], dict]:
    rng = random.Random(seed)
    with quarry.local(devices=2) as cluster:
        cluster.ingest(particles.table(50_000, seed=3), "physics/particles")
        expected = cluster.sql(HEALTH_SQL).read_all().to_pylist()
        recorded = live.everyday(cluster, "physics/particles", HEALTH_SQL, "fuzz/scratch")
        target = live.on(cluster, recorded)
        totals: dict[str, Outcomes] = {call: Outcomes() for call in live.CALLS}
        health = {"checks": 0, "wrong": 0, "failed": 0}
        per_call = total // len(live.CALLS)
        with progress(console) as bar:
            task = bar.add_task("live device", total=per_call * len(live.CALLS))
            for call in live.CALLS:
                for first in range(0, per_call, LIVE_CHUNK_INPUTS):
                    inputs = min(LIVE_CHUNK_INPUTS, per_call - first)
                    totals[call].add(target.fuzz(call, inputs, rng))
                    _check(cluster, expected, health)
                    bar.advance(task, inputs)
        target.close()
        health["seeds"] = {call: len(seeds) for call, seeds in target.seeds.items()}
    return totals, health


def _check(cluster: Any, expected: list[dict], health: dict[str, int]) -> None:
    health["checks"] += 1
    try:
        answer = cluster.sql(HEALTH_SQL).read_all().to_pylist()
    except QuarryError:
        health["failed"] += 1
        return
    health["wrong"] += answer != expected


def plot(results: dict[str, Outcomes], path: Path) -> None:
    names = list(results)
    accepted = [results[n].accepted for n in names]
    clear = [sum(results[n].clear.values()) for n in names]
    bad = [sum(results[n].unclear.values()) + results[n].hangs + results[n].crashes for n in names]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    ax.barh(names, accepted, label="accepted")
    ax.barh(names, clear, left=accepted, label="clear error (QuarryError)")
    left = [a + c for a, c in zip(accepted, clear)]
    ax.barh(names, bad, left=left, label="unclear, hang or crash", color="crimson")
    ax.set_xlabel("inputs")
    ax.set_title("What each decoder did with mutated inputs")
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=100_000)
    parser.add_argument("--live-inputs", type=int, default=8_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    console = Console(stderr=True)
    started = time.perf_counter()
    offline = in_process(args.inputs, args.workers, args.seed, console)
    offline_s = time.perf_counter() - started
    started = time.perf_counter()
    online, health = on_a_device(args.live_inputs, args.seed, console)
    online_s = time.perf_counter() - started
    results = {**offline, **{f"device {call}": o for call, o in online.items()}}
    total = Outcomes()
    for outcomes in results.values():
        total.add(outcomes)
    body = {
        "inputs": total.inputs,
        "crashes": total.crashes,
        "hangs": total.hangs,
        "unclear_errors": sum(total.unclear.values()),
        "clear_errors": sum(total.clear.values()),
        "accepted": total.accepted,
        "error_classes": dict(total.clear.most_common()),
        "in_process_seconds": round(offline_s, 1),
        "live_seconds": round(online_s, 1),
        "live_health": health,
        "targets": {name: o.to_json() for name, o in results.items()},
    }
    path = write_json("fuzz", body)
    plot(results, png_path("fuzz"))
    console.print(
        f"{total.inputs:,} inputs: {total.accepted:,} accepted, "
        f"{sum(total.clear.values()):,} clear errors, {sum(total.unclear.values())} unclear, "
        f"{total.hangs} hangs, {total.crashes} crashes; live health checks "
        f"{health['checks']} ({health['wrong']} wrong, {health['failed']} failed) -> {path}"
    )


if __name__ == "__main__":
    main()
