"""Partitions, not only kills: links cut silently in the middle of queries, ingests and repairs.

    sudo python bench/partitions.py [--query-rounds 20] [--single-rounds 5] [--ingest-rounds 10]
                                    [--repair-rounds 10] [--rebalance-rounds 10]
                                    [--sf 0.1] [--seed 32]

Three devices, each in a network namespace of its own on its own address (``quarry.netns``),
TLS on, every link a 50 MB/s token bucket each way, drives slow enough that a query lasts about
a second. Each round cuts a random device's link at a random moment (the veth's root end set
down: no reset, the way a pulled cable or a dead switch port looks), waits for the work, heals
the link and waits until the device answers again, without a restart:

- queries (replicas 2): TPC-H Q1, Q6, Q12 and a particle aggregate, pushdown always, auto or
  never at random; each answer is checked against DuckDB, timed from the cut, and its
  failovers read from EXPLAIN ANALYZE;
- queries with replicas 1: the error must name the device, timed from the cut;
- ingests (replicas 2): complete (every row listed and read back) or absent, no pending
  partition and no key left behind once the lease has run out;
- repairs: a device away, its partitions copied to the third while the link of the source or
  the target is cut: each copy complete or absent, every partition back at two replicas after
  healing, every row there;
- rebalances (replicas 2): a device drained while a random device's link is cut: the drain ends
  or fails with a clear error, never leaves a partition on fewer than two devices; after
  healing, the drain run again completes (the drained device holds nothing), every row there,
  no pending copy left once the lease has run out; then the device is taken back.

The bound each answer is held to is the silence bound (``QUARRY_DEVICE_SILENCE_S``, 5 s) plus
the query's own time measured alone. Writes ``bench/results/partitions.json`` and ``.png``
(time from the cut to the answer per round, beside the bound; wrong answers counted). Needs
root, ``ip`` and ``tc``; measures and reports, never fails on a time.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import matplotlib
import pyarrow as pa
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import png_path, write_json
from load import duckdb_with_tpch, same_rows

from quarry import netns, settings
from quarry.samples import particles

matplotlib.use("Agg")
NAME = "partitions"
PUSHDOWNS = ("always", "auto", "never")
PARTICLE_SQL = "SELECT floor(x) AS b, count(*) AS n, sum(ke) AS ke FROM particles GROUP BY 1"
PROFILES = (
    '[profiles.slow]\nfrom = "host"\ncompute_factor = 6.0\ncores = 2\nkv_bytes_max = 262144\n'
)
LINK_BYTES_PER_S = 50e6
LEASE_S = 3.0  # pending partitions of a cut ingest or copy outlive it this long
HEAL_S = 60.0
INGEST_ROWS = 400_000
REPAIR_ROWS = 300_000
REPAIR_BYTES_PER_S = 4e6  # slow enough that a cut lands in the middle of a copy
console = Console()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--query-rounds", type=int, default=20)
    parser.add_argument("--single-rounds", type=int, default=5)
    parser.add_argument("--ingest-rounds", type=int, default=10)
    parser.add_argument("--repair-rounds", type=int, default=10)
    parser.add_argument("--rebalance-rounds", type=int, default=10)
    parser.add_argument("--sf", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=32)
    args = parser.parse_args()
    reason = netns.missing()
    if reason is not None:
        sys.exit(f"bench/partitions.py: {reason}")
    settings_env(LEASE_S)
    rng = random.Random(args.seed)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="partitions-") as tmp:
        folder = Path(tmp)
        (folder / "profiles.toml").write_text(PROFILES)
        with netns.cluster(3, "slow", folder / "cluster", str(folder / "profiles.toml")) as running:
            for name in running.network.links:
                running.network.shape(name, LINK_BYTES_PER_S)
            cases = load(running, args.sf)
            results = {
                "queries": query_rounds(running, cases, args.query_rounds, rng),
                "single": single_rounds(running, args.single_rounds, rng),
                "ingests": ingest_rounds(running, args.ingest_rounds, rng),
                "repairs": repair_rounds(running, args.repair_rounds, rng),
                "rebalances": rebalance_rounds(running, args.rebalance_rounds, rng),
            }
    summary = summarize(results)
    path = write_json(
        NAME,
        {
            "silence_s": bound_s(),
            "link_bytes_per_s": LINK_BYTES_PER_S,
            "lease_s": LEASE_S,
            "sf": args.sf,
            "seconds": time.perf_counter() - started,
            "summary": summary,
            **results,
        },
    )
    plot(results)
    console.print(summary)
    console.print(f"wrote {path} and {png_path(NAME)}")


def settings_env(lease_s: float) -> None:
    """This process's ingests and repairs lease their partitions for ``lease_s``."""
    os.environ[settings.INGEST_LEASE_S.name] = str(lease_s)


def bound_s() -> float:
    return settings.DEVICE_SILENCE_S.get()


def load(running: netns.NamespacedCluster, sf: float) -> list[tuple[str, str, pa.Table]]:
    """TPC-H lineitem and orders and a particle table, replicas 2; the queries and DuckDB's
    answers."""
    cluster = running.cluster
    con = duckdb_with_tpch(sf)
    for table in ("lineitem", "orders"):
        rows = con.execute(f"SELECT * FROM {table}").fetch_arrow_table()
        cluster.ingest(rows, f"tpch/{table}", replicas=2)
    queries = dict(con.execute("SELECT query_nr, query FROM tpch_queries()").fetchall())
    table = particles.table(600_000, seed=4)
    cluster.ingest(table, "physics/particles", replicas=2)
    con.register("particles", table)
    cases = [(f"q{n}", queries[n]) for n in (1, 6, 12)] + [("particles", PARTICLE_SQL)]
    return [(name, sql, con.execute(sql).fetch_arrow_table()) for name, sql in cases]


def run_query(cluster: Any, sql: str, pushdown: str) -> tuple[pa.Table, list[dict]]:
    planned = cluster.query(sql, pushdown=pushdown)
    table = planned.execute().read_all()
    explain = planned.explain(analyze=True)
    return table, [f for d in explain.analyze.devices for f in d.failovers]


def heal(running: netns.NamespacedCluster, victim: str) -> float:
    """The link back; seconds until the cluster uses the device again (no restart)."""
    started = time.perf_counter()
    running.heal(victim)
    cluster = running.cluster

    def back() -> bool:
        cluster.settle()
        if victim in cluster.down and not cluster.devices[victim].heartbeat.silent:
            cluster.refresh()
        return victim not in cluster.down

    if not netns.wait_until(back, HEAL_S):
        raise RuntimeError(f"{victim} did not come back within {HEAL_S:.0f} s of its link")
    return time.perf_counter() - started


def query_rounds(running, cases, rounds: int, rng: random.Random) -> list[dict]:
    cluster = running.cluster
    alone = {}
    for name, sql, _ in cases:
        for pushdown in PUSHDOWNS:
            run_query(cluster, sql, pushdown)
            started = time.perf_counter()
            run_query(cluster, sql, pushdown)
            alone[(name, pushdown)] = time.perf_counter() - started
    out = []
    for number in range(rounds):
        name, sql, expected = cases[number % len(cases)]
        pushdown = rng.choice(PUSHDOWNS)
        victim = f"dev{rng.randrange(3)}"
        duration = alone[(name, pushdown)]
        outcome = netns.cut_during(
            running,
            victim,
            rng.uniform(0.05, 0.8) * duration,
            lambda sql=sql, pushdown=pushdown: run_query(cluster, sql, pushdown),
        )
        healed_s = heal(running, victim)
        row = {"round": number, "query": name, "pushdown": pushdown, **outcome.to_json()}
        row.update(alone_s=round(duration, 3), bound_s=round(bound_s() + duration, 3))
        row["healed_s"] = round(healed_s, 3)
        if outcome.error is None and not outcome.hung:
            table, failovers = outcome.result
            row.update(right=same_rows(table, expected), failovers=failovers)
        else:
            row.update(right=False, failovers=[])
        out.append(row)
        console.print(
            f"query {number:2d} {name:9s} {pushdown:6s} {victim} cut at "
            f"{outcome.cut_after_s:5.2f} s: answered {outcome.after_cut_s:5.2f} s after "
            f"(bound {row['bound_s']:.2f}), right={row['right']}, "
            f"{len(row['failovers'])} failover(s), back in {healed_s:.1f} s"
        )
    return out


def single_rounds(running, rounds: int, rng: random.Random) -> list[dict]:
    """Replicas 1: a cut mid-query is a clear error naming the device, within the bound."""
    cluster = running.cluster
    cluster.ingest(particles.table(300_000, seed=8), "physics/single", replicas=1)
    sql = PARTICLE_SQL.replace("particles", "physics.single")
    run_query(cluster, sql, "always")
    started = time.perf_counter()
    run_query(cluster, sql, "always")
    duration = time.perf_counter() - started
    holders = sorted({p.devices[0] for p in cluster.entry("physics/single").partitions})
    out = []
    for number in range(rounds):
        victim = rng.choice(holders)
        outcome = netns.cut_during(
            running,
            victim,
            rng.uniform(0.05, 0.5) * duration,
            lambda: run_query(cluster, sql, "always"),
        )
        heal(running, victim)
        error = "" if outcome.error is None else str(outcome.error)
        row = {"round": number, **outcome.to_json(), "bound_s": round(bound_s(), 3)}
        row["names_device"] = victim in error
        out.append(row)
        console.print(
            f"single {number:2d} {victim} cut at {outcome.cut_after_s:5.2f} s: "
            f"{'error naming it' if row['names_device'] else error or 'answered'}"
            f" {outcome.after_cut_s:5.2f} s after"
        )
    cluster.drop("physics/single")
    return out


def key_counts(cluster: Any) -> dict[str, int]:
    return {name: client.stats().keys for name, client in cluster.devices.items()}


def settled(cluster: Any) -> bool:
    stats = [client.stats() for client in cluster.devices.values()]
    return all(s.pending_partitions == 0 and s.ingesting == 0 for s in stats)


def ingest_rounds(running, rounds: int, rng: random.Random) -> list[dict]:
    cluster = running.cluster

    def ingest(name: str) -> Any:
        source = pa.RecordBatchReader.from_batches(
            particles.SCHEMA, particles.batches(INGEST_ROWS, batch_rows=20_000, seed=7)
        )
        return cluster.ingest(source, name, replicas=2)

    started = time.perf_counter()
    ingest("t/timed")
    duration = time.perf_counter() - started
    cluster.drop("t/timed")
    before = key_counts(cluster)
    out = []
    for number in range(rounds):
        victim = f"dev{rng.randrange(3)}"
        name = f"t/cut{number}"
        outcome = netns.cut_during(
            running, victim, rng.uniform(0.05, 0.95) * duration, lambda name=name: ingest(name)
        )
        heal(running, victim)
        clean = netns.wait_until(lambda: settled(cluster), HEAL_S)
        cluster.refresh()
        listed = name in cluster.catalog
        complete = (
            listed
            and cluster.entry(name).rows == INGEST_ROWS
            and cluster.scan(name).read_all().num_rows == INGEST_ROWS
        )
        if listed:
            cluster.drop(name)
        debris = {k: v - before[k] for k, v in key_counts(cluster).items() if v != before[k]}
        ended = "complete" if outcome.error is None else "absent"
        row = {"round": number, **outcome.to_json(), "ended": ended, "listed": listed}
        row.update(right=(complete if outcome.error is None else not listed) and not debris)
        row.update(settled=clean, debris=debris)
        out.append(row)
        console.print(
            f"ingest {number:2d} {victim} cut at {outcome.cut_after_s:5.2f} s of "
            f"{duration:.2f}: {ended}, right={row['right']}, debris={debris}"
        )
    return out


def repair_rounds(running, rounds: int, rng: random.Random) -> list[dict]:
    cluster = running.cluster
    cluster.ingest(particles.table(REPAIR_ROWS, seed=11), "t/repaired", replicas=2, partitions=6)
    out = []
    for number in range(rounds):
        entry = cluster.entry("t/repaired")
        gone = entry.partitions[number % len(entry.partitions)].devices[0]
        running.cut(gone)

        def down(gone: str = gone) -> bool:
            cluster.settle()
            return gone in cluster.down

        netns.wait_until(down, HEAL_S)
        victim = rng.choice([n for n in cluster.devices if n != gone])
        outcome = netns.cut_during(
            running,
            victim,
            rng.uniform(0.1, 1.5),
            lambda: cluster.repair(bandwidth_bytes_per_s=REPAIR_BYTES_PER_S),
        )
        for name in (victim, gone):
            heal(running, name)
        clean = netns.wait_until(lambda: settled(cluster), HEAL_S)
        cluster.refresh()
        healed = cluster.entry("t/repaired")
        replicas_ok = all(len(p.devices) >= 2 for p in healed.partitions)
        rows_ok = cluster.scan("t/repaired").read_all().num_rows == REPAIR_ROWS
        report = outcome.result.to_json() if outcome.result is not None else {}
        row = {"round": number, "away": gone, **outcome.to_json(), "settled": clean}
        row.update(copied=len(report.get("copied", [])), failed=len(report.get("failed", [])))
        row.update(right=replicas_ok and rows_ok and clean and not healed.unavailable)
        out.append(row)
        console.print(
            f"repair {number:2d} {gone} away, {victim} cut at {outcome.cut_after_s:4.2f} s: "
            f"{row['copied']} copied, {row['failed']} failed, right={row['right']}"
        )
        if number + 1 < rounds:  # back to two replicas each: the extra copies go
            cluster.drop("t/repaired")
            cluster.ingest(
                particles.table(REPAIR_ROWS, seed=11), "t/repaired", replicas=2, partitions=6
            )
    return out


def rebalance_rounds(running, rounds: int, rng: random.Random) -> list[dict]:
    cluster = running.cluster
    cluster.ingest(particles.table(REPAIR_ROWS, seed=12), "t/moved", replicas=2, partitions=6)
    names = sorted(cluster.devices)
    out = []
    for number in range(rounds):
        drained = names[number % len(names)]
        victim = rng.choice(names)
        outcome = netns.cut_during(
            running,
            victim,
            rng.uniform(0.1, 1.5),
            lambda drained=drained: cluster.drain(drained, REPAIR_BYTES_PER_S, progress=False),
        )
        heal(running, victim)
        cluster.refresh()
        fewest = min(len(p.devices) for p in cluster.entry("t/moved").partitions)
        finished = cluster.rebalance(REPAIR_BYTES_PER_S, progress=False)
        clean = netns.wait_until(lambda: settled(cluster), HEAL_S)
        cluster.refresh()
        entry = cluster.entry("t/moved")
        emptied = all(drained not in p.devices for p in entry.partitions)
        rows_ok = cluster.scan("t/moved").read_all().num_rows == REPAIR_ROWS
        row = {"round": number, "drained": drained, **outcome.to_json(), "settled": clean}
        row.update(
            fewest_replicas_after_cut=fewest,
            moved_after_heal=len(finished.moved),
            right=fewest >= 2 and emptied and rows_ok and clean and not entry.unavailable,
        )
        out.append(row)
        console.print(
            f"rebalance {number:2d} drain {drained}, {victim} cut at {outcome.cut_after_s:4.2f} s: "
            f"{'ended' if outcome.error is None else type(outcome.error).__name__}, "
            f"{row['moved_after_heal']} moved after healing, right={row['right']}"
        )
        cluster.drain(drained, REPAIR_BYTES_PER_S * 4, progress=False, undo=True)
    return out


def summarize(results: dict[str, list[dict]]) -> dict[str, Any]:
    queries = results["queries"]
    answered = [r for r in queries if not r["error"] and not r["hung"]]
    return {
        "queries": {
            "rounds": len(queries),
            "answered": len(answered),
            "wrong": sum(not r["right"] for r in answered),
            "cut_mid_query": sum(r["landed"] for r in queries),
            "failed_over": sum(bool(r["failovers"]) for r in queries),
            "within_bound": sum(r["after_cut_s"] <= r["bound_s"] for r in answered),
            "after_cut_s_max": max((r["after_cut_s"] for r in queries), default=0.0),
            "healed_s_max": max((r["healed_s"] for r in queries), default=0.0),
        },
        "single": {
            "rounds": len(results["single"]),
            "errors_naming_the_device": sum(r["names_device"] for r in results["single"]),
            "wrong": sum(bool(r["error"]) and not r["names_device"] for r in results["single"]),
            "after_cut_s_max": max((r["after_cut_s"] for r in results["single"]), default=0.0),
        },
        "ingests": {
            "rounds": len(results["ingests"]),
            "complete": sum(r["ended"] == "complete" for r in results["ingests"]),
            "absent": sum(r["ended"] == "absent" for r in results["ingests"]),
            "wrong": sum(not r["right"] for r in results["ingests"]),
        },
        "repairs": {
            "rounds": len(results["repairs"]),
            "cut_mid_repair": sum(r["landed"] for r in results["repairs"]),
            "wrong": sum(not r["right"] for r in results["repairs"]),
        },
        "rebalances": {
            "rounds": len(results["rebalances"]),
            "cut_mid_drain": sum(r["landed"] for r in results["rebalances"]),
            "wrong": sum(not r["right"] for r in results["rebalances"]),
        },
    }


def plot(results: dict[str, list[dict]]) -> None:
    import matplotlib.pyplot as plt

    queries, single = results["queries"], results["single"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [3, 1]})
    ax = axes[0]
    rounds = [r["round"] for r in queries]
    colors = ["#2ca02c" if r["right"] else "#d62728" for r in queries]
    ax.bar(rounds, [r["after_cut_s"] for r in queries], color=colors, label="cut to answer")
    ax.scatter(rounds, [r["bound_s"] for r in queries], marker="_", s=300, color="black")
    ax.plot([], [], "k_", markersize=14, label="bound: silence + the query's own time")
    for r in queries:
        ax.annotate(r["query"], (r["round"], r["after_cut_s"]), ha="center", va="bottom", size=6)
    wrong = sum(not r["right"] for r in queries)
    ax.set_title(f"replicas 2: a link cut mid-query ({wrong} wrong answers)", fontsize=10)
    ax.set_xlabel("round")
    ax.set_ylabel("seconds from the cut to the answer")
    ax.legend(fontsize=8)
    ax = axes[1]
    ax.bar(
        [r["round"] for r in single],
        [r["after_cut_s"] for r in single],
        color=["#1f77b4" if r["names_device"] else "#999999" for r in single],
    )
    ax.axhline(bound_s(), color="black", linestyle="--", label="silence bound")
    ax.set_title("replicas 1: the error naming the device", fontsize=10)
    ax.set_xlabel("round")
    ax.legend(fontsize=8)
    summary = summarize(results)
    fig.suptitle(
        f"Partitions on 3 namespaced devices (TLS, 50 MB/s links): ingests "
        f"{summary['ingests']['complete']} complete / {summary['ingests']['absent']} absent, "
        f"{summary['ingests']['wrong']} wrong; repairs {summary['repairs']['wrong']} wrong; "
        f"drains {summary['rebalances']['wrong']} wrong",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(png_path(NAME), dpi=120)


if __name__ == "__main__":
    main()
