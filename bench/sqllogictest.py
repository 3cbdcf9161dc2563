"""SQLite's sqllogictest corpus through quarry beside DuckDB: which answers each gets right.

    sh scripts/fetch_sqllogictest.sh /tmp/sqllogictest
    python bench/sqllogictest.py --corpus /tmp/sqllogictest [--aggregates 130] [--every 10]
                                 [--devices 3] [--files test/select1.test,...]

Each file's tables are built by its statements in DuckDB and ingested into a local cluster of
``--devices`` devices; each query runs in DuckDB (``integer_division`` on, as SQLite divides)
and in quarry under auto, and one in ``--every`` also under always and never, every answer
compared with the file's expected values (``tests/sqllogictest/runner.py``). Files:
``test/select1.test`` .. ``select5.test`` and the first ``--aggregates`` files of
``test/random/aggregates/`` (about 10,000 queries each). Per file: queries, right in DuckDB,
right in quarry auto, refused (a ``QuarryError``), crashed (anything else: never acceptable),
right in DuckDB but not in quarry, and of those run in every mode, how many answered the same.
A measurement of correctness, not of time. Results: ``bench/results/sqllogictest.json``.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import write_json

import quarry
from quarry.errors import QuarryError
from tests.sqllogictest import runner

console = Console(width=170)
SELECT_FILES = tuple(f"test/select{n}.test" for n in range(1, 6))
FAILURES_KEPT_MAX = 50  # per file, in the JSON


def corpus_files(corpus: Path, aggregates: int) -> list[str]:
    folder = corpus / "test" / "random" / "aggregates"
    numbered = sorted(folder.glob("slt_good_*.test"), key=lambda p: int(p.stem.split("_")[-1]))
    return [*SELECT_FILES, *(str(p.relative_to(corpus)) for p in numbered[:aggregates])]


def run_file(cluster: Any, corpus: Path, name: str, every: int) -> dict[str, Any]:
    started = time.perf_counter()
    script = runner.read_script(corpus / name)
    connection = runner.reference(script)
    with runner.Ingested(cluster, runner.tables_of(connection)) as ingested:
        result = runner.run_script(
            script,
            ingested.answer,
            (QuarryError,),
            modes_every=every,
            duckdb_connection=connection,
        )
    kinds: collections.Counter[str] = collections.Counter()
    for failure in result.failures():
        verdict = next(v for v in failure.quarry.values() if not v.right)
        kinds[f"{verdict.outcome.value}: {verdict.detail[:100]}"] += 1
    return {
        "file": name,
        **result.figures(),
        "seconds": time.perf_counter() - started,
        "failure_kinds": dict(kinds.most_common(20)),
        "failures": [
            {
                "line": r.line,
                "sql": r.sql,
                "quarry": {m: f"{v.outcome.value} {v.detail}" for m, v in r.quarry.items()},
            }
            for r in result.failures()[:FAILURES_KEPT_MAX]
        ],
    }


def totals(rows: list[dict[str, Any]]) -> dict[str, int]:
    keys = (
        "queries",
        "duckdb_right",
        "quarry_auto_right",
        "quarry_auto_refused",
        "quarry_crashed",
        "duckdb_right_quarry_not",
        "checked_in_every_mode",
        "same_in_every_mode",
    )
    return {key: sum(row[key] for row in rows) for key in keys}


def report(rows: list[dict[str, Any]], summed: dict[str, int]) -> None:
    table = Table(title="sqllogictest: right answers per file")
    columns = ("file", "queries", "DuckDB right", "quarry auto right", "refused", "crashed")
    for column in (*columns, "DuckDB right, quarry not", "every mode: same / run"):
        table.add_column(column, justify="right")
    for r in [*rows, {"file": "total", **summed}]:
        table.add_row(
            r["file"],
            str(r["queries"]),
            str(r["duckdb_right"]),
            str(r["quarry_auto_right"]),
            str(r["quarry_auto_refused"]),
            str(r["quarry_crashed"]),
            str(r["duckdb_right_quarry_not"]),
            f"{r['same_in_every_mode']} / {r['checked_in_every_mode']}",
        )
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, required=True, help="a sqllogictest checkout")
    parser.add_argument("--aggregates", type=int, default=130, help="files of random/aggregates")
    parser.add_argument("--files", help="comma-separated files instead (relative to --corpus)")
    parser.add_argument("--every", type=int, default=10, help="one query in this many: all modes")
    parser.add_argument("--devices", type=int, default=3)
    parser.add_argument("--name", default="sqllogictest")
    args = parser.parse_args()
    files = args.files.split(",") if args.files else corpus_files(args.corpus, args.aggregates)
    started = time.perf_counter()
    rows = []
    with quarry.local(devices=args.devices) as cluster:
        for name in files:
            row = run_file(cluster, args.corpus, name, args.every)
            console.print(
                f"{name}: {row['quarry_auto_right']} / {row['queries']} right in quarry, "
                f"{row['duckdb_right']} in DuckDB ({row['seconds']:.0f} s)"
            )
            rows.append(row)
    summed = totals(rows)
    report(rows, summed)
    write_json(
        args.name,
        {
            "devices": args.devices,
            "every": args.every,
            "files": rows,
            "summary": summed,
            "elapsed_s": time.perf_counter() - started,
        },
    )


if __name__ == "__main__":
    main()
