"""SQLite's sqllogictest corpus through quarry: every query DuckDB answers right, quarry answers
right, under auto and (one query in ten) under always and never; anything else quarry raises is
a ``QuarryError``. The files are a pinned subset checked in (``corpus/NOTICE``); the whole
corpus runs in ``bench/sqllogictest.py``. The runner's own semantics (sorting, hashing, how a
value prints) are tested first, on small made-up records."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

import quarry
from quarry.errors import QuarryError
from tests.sqllogictest import runner

CORPUS = Path(__file__).parent / "corpus"
FILES = sorted(str(p.relative_to(CORPUS)) for p in CORPUS.rglob("*.test"))
MODES_EVERY = 10


def test_values_print_as_sqlites_driver_prints_them():
    table = pa.table(
        {
            "i": [1, None, 2**32 + 5, 7],
            "f": [2.5, -2.5, 1.0, None],
            "t": ["a", "", "é", "x"],
        }
    )
    assert runner.values(table, "IRT")[:3] == ["1", "2.500", "a"]
    assert runner.values(table, "IIT")[3:6] == ["NULL", "-2", "(empty)"]
    assert runner.values(table, "RIT")[6:9] == ["4294967301.000", "1", "@@"]
    assert runner.shown(-3.7, "I") == "-3" and runner.shown(True, "T") == "1"
    with pytest.raises(runner.ColumnCountMismatch):
        runner.values(table, "II")


SCRIPT = """\
hash-threshold 4

statement ok
CREATE TABLE t(a INTEGER, b INTEGER)

onlyif mysql # their syntax
query I nosort
SELECT a DIV 2 FROM t
----
1

skipif mysql # not theirs
query II rowsort
SELECT b, a FROM t
----
1
20
10
3

query I valuesort label-1
SELECT a FROM t UNION ALL SELECT b FROM t
----
4 values hashing to 4c9b5c8c3e1a25a4b3c6ab21be9c0d22
"""


def test_records_parse_and_answers_sort_and_hash_as_the_driver_does():
    script = runner.parse(SCRIPT)
    assert script.skipped == 1 and len(script.statements) == 1
    rowsort, hashed = script.queries
    assert (rowsort.types, rowsort.sort, rowsort.hash_threshold) == ("II", "rowsort", 4)
    assert runner.as_expected(["10", "3", "1", "20"], rowsort) == ("1", "20", "10", "3")
    assert hashed.label == "label-1" and hashed.columns == 1
    import hashlib

    digest = hashlib.md5(b"1\n20\n3\n4\n5\n").hexdigest()  # byte order: "20" < "3"
    assert runner.as_expected(["5", "3", "20", "1", "4"], hashed) == (
        f"5 values hashing to {digest}",
    )
    assert runner.parse(runner.written(script, range(2))) == runner.parse(
        runner.written(runner.parse(runner.written(script, range(2))), range(2))
    )


def test_an_engine_that_raises_other_errors_crashes_and_fails_the_acceptance():
    (query,) = runner.parse("query I nosort\nSELECT 1\n----\n1\n").queries

    def crash(sql):
        raise AssertionError("an invariant")

    def refuse(sql):
        raise QuarryError("not supported")

    crashed = runner.judge(query, crash, (QuarryError,))
    refused = runner.judge(query, refuse, (QuarryError,))
    right = runner.judge(query, lambda sql: pa.table({"x": [1]}), (QuarryError,))
    assert (crashed.outcome, refused.outcome, right.outcome) == ("crashed", "refused", "right")
    duck = runner.Verdict(runner.Outcome.RIGHT)
    assert not runner.acceptable(runner.QueryResult(1, "", duck, {"auto": refused}))
    wrong = runner.Verdict(runner.Outcome.WRONG)
    assert runner.acceptable(runner.QueryResult(1, "", wrong, {"auto": refused}))
    assert not runner.acceptable(runner.QueryResult(1, "", wrong, {"auto": crashed}))


@pytest.fixture(scope="module")
def cluster():
    with quarry.local(devices=3) as cluster:
        yield cluster


@pytest.mark.slow
@pytest.mark.parametrize("name", FILES)
def test_the_corpus_answers_as_duckdb_does(cluster, name):
    script = runner.read_script(CORPUS / name)
    connection = runner.reference(script)
    with runner.Ingested(cluster, runner.tables_of(connection)) as ingested:
        result = runner.run_script(
            script,
            ingested.answer,
            (QuarryError,),
            modes_every=MODES_EVERY,
            duckdb_connection=connection,
        )
    figures = result.figures()
    failures = [
        f"line {r.line}: {r.sql!r}: "
        + "; ".join(f"{m}: {v.outcome.value} {v.detail}" for m, v in r.quarry.items())
        for r in result.failures()
    ]
    assert not failures, f"{len(failures)} of {figures['queries']}:\n" + "\n".join(failures[:20])
    assert figures["checked_in_every_mode"] * MODES_EVERY >= figures["queries"]
    assert figures["same_in_every_mode"] == figures["checked_in_every_mode"]
