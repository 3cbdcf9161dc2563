"""One benchmark, two versions of quarry, in one run: before and after a change, side by side.

    python bench/ab.py --before REV [--after REV] [--rounds 3] --figure 'modes/*/median_ms' \
        -- overhead.py --queries 60

Each version is a checkout of its own (``git worktree``, removed at the end; ``--after``
defaults to ``HEAD``), so their results files stay out of this tree's. The benchmark script
runs as a whole process against each version in turn, ABBA within a round so that a drift of
the machine falls on both, and each run's JSON is read back. ``--figure`` picks numbers from
that JSON by path, with ``*`` for any key or list index (``results/*/auto_s``). Every figure's
runs, its median per version and the ratio after/before go to ``bench/results/ab_<script>.json``,
and the ratios to a PNG beside it: below 1 is faster (for times), and a ratio within the spread
of the runs is noise.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import matplotlib

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import png_path, write_json

matplotlib.use("Agg")
HERE = Path(__file__).resolve().parents[1]
RUN_TIMEOUT_S = 3600  # one run of one benchmark script
ROUNDS_MAX = 20


def flatten(value: Any, prefix: str = "") -> dict[str, float]:
    """Every number in a JSON document by its path (keys and list indices joined by ``/``)."""
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = ((str(i), v) for i, v in enumerate(value))
    elif isinstance(value, bool):
        return {}
    elif isinstance(value, int | float):
        return {prefix: float(value)}
    else:
        return {}
    out: dict[str, float] = {}
    for key, item in items:
        out.update(flatten(item, f"{prefix}/{key}" if prefix else str(key)))
    return out


def checkout(revision: str, folder: Path) -> Path:
    subprocess.run(
        ["git", "-C", str(HERE), "worktree", "add", "--detach", "-q", str(folder), revision],
        check=True,
    )
    return folder


def run_once(tree: Path, script: list[str]) -> dict[str, Any]:
    """The benchmark against one version; the JSON it wrote (the newest in its results)."""
    results = tree / "bench" / "results"
    started = time.time()
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    command = [sys.executable, str(tree / "bench" / script[0]), *script[1:]]
    subprocess.run(command, cwd=tree, env=env, check=True, timeout=RUN_TIMEOUT_S)
    written = [p for p in results.glob("*.json") if p.stat().st_mtime >= started]
    if not written:
        raise SystemExit(f"{script[0]} wrote no JSON under {results}")
    return json.loads(max(written, key=lambda p: p.stat().st_mtime).read_text())


def picked(document: dict[str, Any], patterns: list[str]) -> dict[str, float]:
    numbers = flatten(document)
    return {
        path: value
        for path, value in numbers.items()
        if any(fnmatch.fnmatchcase(path, pattern) for pattern in patterns)
    }


def summary(runs: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    paths = sorted(set(runs["before"][0]) & set(runs["after"][0]))
    for path in paths:
        before = [run[path] for run in runs["before"] if path in run]
        after = [run[path] for run in runs["after"] if path in run]
        b, a = statistics.median(before), statistics.median(after)
        figures[path] = {
            "before": before,
            "after": after,
            "before_median": b,
            "after_median": a,
            "after_over_before": a / b if b else None,
        }
    return figures


def plot(name: str, figures: dict[str, Any], before: str, after: str) -> Path:
    import matplotlib.pyplot as plt

    paths = [p for p, f in figures.items() if f["after_over_before"] is not None]
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(paths) + 1.5))
    ratios = [figures[p]["after_over_before"] for p in paths]
    spreads = [
        (
            min(figures[p]["after"]) / figures[p]["before_median"],
            max(figures[p]["after"]) / figures[p]["before_median"],
        )
        for p in paths
    ]
    ax.barh(range(len(paths)), ratios, color="#4a7ab5")
    for i, (low, high) in enumerate(spreads):
        ax.plot([low, high], [i, i], color="black", linewidth=1)
    ax.axvline(1.0, color="grey", linestyle="--")
    ax.set_yticks(range(len(paths)), paths, fontsize=7)
    ax.set_xlabel(f"after / before (medians; line: after's runs), {after} vs {before}")
    ax.set_title(f"{name}: the same benchmark on two versions, one run")
    fig.tight_layout()
    path = png_path(f"ab_{name}")
    fig.savefig(path, dpi=120)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--before", required=True, help="git revision of the baseline")
    parser.add_argument("--after", default="HEAD", help="git revision (default: HEAD)")
    parser.add_argument("--rounds", type=int, default=3, help="ABBA rounds (runs per version: 2x)")
    parser.add_argument("--figure", action="append", required=True, help="JSON path pattern")
    parser.add_argument("script", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS]")
    args = parser.parse_args()
    script = [s for s in args.script if s != "--"] if args.script[:1] == ["--"] else args.script
    assert script, "give the benchmark script after --"
    assert 1 <= args.rounds <= ROUNDS_MAX, f"--rounds is 1 to {ROUNDS_MAX}"
    name = Path(script[0]).stem

    with tempfile.TemporaryDirectory(prefix="quarry-ab-") as tmp:
        trees = {"before": checkout(args.before, Path(tmp) / "before")}
        trees["after"] = checkout(args.after, Path(tmp) / "after")
        try:
            runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
            for round_number in range(args.rounds):
                order = ("before", "after") if round_number % 2 == 0 else ("after", "before")
                for side in (*order, *reversed(order)):
                    print(f"round {round_number + 1}/{args.rounds}: {side}", flush=True)
                    runs[side].append(picked(run_once(trees[side], script), args.figure))
        finally:
            for tree in trees.values():
                subprocess.run(
                    ["git", "-C", str(HERE), "worktree", "remove", "--force", str(tree)],
                    check=False,
                )
    figures = summary(runs)
    result = {
        "script": script,
        "before": args.before,
        "after": args.after,
        "rounds": args.rounds,
        "figures": figures,
    }
    path = write_json(f"ab_{name}", result)
    picture = plot(name, figures, args.before, args.after)
    for figure, values in figures.items():
        ratio = values["after_over_before"]
        shown = "-" if ratio is None else f"{ratio:.3f}"
        print(
            f"{figure:60s} {values['before_median']:12.4g} {values['after_median']:12.4g} {shown}"
        )
    print(f"wrote {path} and {picture}")


if __name__ == "__main__":
    main()
