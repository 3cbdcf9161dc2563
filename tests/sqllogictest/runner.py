"""A sqllogictest runner: SQLite's corpus of statements and queries with their expected answers.

The corpus (``gregrahn/sqllogictest``) is the suite SQL engines run themselves against
(DataFusion does in CI). A file is a list of records: ``statement ok`` (SQL that builds tables),
``query <types> <sort> [label]`` (SQL, a line ``----``, then the expected values, one a line, or
``N values hashing to <md5>``), ``hash-threshold N``, ``skipif <engine>`` / ``onlyif <engine>``
before a record, and ``halt``. What a value looks like is SQLite's driver's (``slt_sqlite.c``):
NULL is ``NULL``; a ``T`` column's empty string is ``(empty)`` and every byte outside printable
ASCII is ``@``; an ``I`` column's value is a C ``int`` (a real truncated toward zero, a 64-bit
integer cut to its low 32 bits); an ``R`` column's is ``%.3f``. ``rowsort`` sorts rows,
``valuesort`` every value on its own, both by byte comparison; when there are more values than the
hash threshold (0: never) the answer is compared by the MD5 of its values, each followed by a
newline.

The engine is none of those a ``skipif`` or ``onlyif`` names: a record under ``onlyif X`` is
skipped, one under ``skipif X`` runs. Tables are built by DuckDB from the file's statements (the
reference engine here too) and handed to the engines under test as Arrow tables.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

INT32_RANGE = 2**32
HASHED = re.compile(r"^(\d+) values hashing to ([0-9a-f]{32})$")
ENGINE_NAME = "quarry"  # matches no skipif/onlyif of the corpus: SQLite's expected answers
VALUES_SHOWN_MAX = 12  # of an answer, in a report of a wrong one
DEFAULT_HASH_THRESHOLD = 8  # the driver's, until a file says ``hash-threshold N``


@dataclass(frozen=True)
class Statement:
    sql: str
    expect_ok: bool
    line: int


@dataclass(frozen=True)
class Query:
    sql: str
    types: str  # one of T, I, R per column
    sort: str  # nosort, rowsort or valuesort
    label: str
    expected: tuple[str, ...]  # values one a line, or one line "N values hashing to <md5>"
    hash_threshold: int  # in force where the query stands (0: never hash)
    line: int

    @property
    def columns(self) -> int:
        return len(self.types)


Record = Statement | Query


@dataclass(frozen=True)
class Script:
    """A file's records that this engine runs, in order (``skipif``/``onlyif`` applied)."""

    path: str
    statements: tuple[Statement, ...]
    queries: tuple[Query, ...]
    skipped: int  # records an ``onlyif`` reserved for another engine


def parse(text: str, path: str = "") -> Script:
    """The records of a sqllogictest file. A ``halt`` ends it; records are separated by blank
    lines; ``#`` starts a comment line."""
    statements: list[Statement] = []
    queries: list[Query] = []
    skipped = 0
    threshold = DEFAULT_HASH_THRESHOLD
    for line_number, lines in _blocks(text):
        header, lines = _conditions(lines)
        if header is None:
            skipped += 1
            continue
        tokens = header.split()
        kind = tokens[0]
        if kind == "halt":
            break
        if kind == "hash-threshold":
            threshold = int(tokens[1])
        elif kind == "statement":
            statements.append(Statement("\n".join(lines), tokens[1] == "ok", line_number))
        elif kind == "query":
            sql_lines, expected = _split_answer(lines)
            queries.append(
                Query(
                    sql="\n".join(sql_lines),
                    types=tokens[1],
                    sort=tokens[2] if len(tokens) > 2 else "nosort",
                    label=tokens[3] if len(tokens) > 3 else "",
                    expected=tuple(expected),
                    hash_threshold=threshold,
                    line=line_number,
                )
            )
        else:
            raise ValueError(f"{path}:{line_number}: unknown record {kind!r}")
    return Script(path, tuple(statements), tuple(queries), skipped)


def _blocks(text: str) -> Iterator[tuple[int, list[str]]]:
    block: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip("\r")
        if line.strip() == "":
            if block:
                yield start, block
            block = []
            continue
        if line.startswith("#") and not block:
            continue
        if not block:
            start = number
        block.append(line)
    if block:
        yield start, block


def _conditions(lines: list[str]) -> tuple[str | None, list[str]]:
    """The record's header line and body, or None when a condition skips it."""
    run = True
    index = 0
    while lines[index].split()[0] in ("skipif", "onlyif"):
        word, engine = lines[index].split()[:2]
        matches = engine.lower() == ENGINE_NAME
        if (word == "skipif" and matches) or (word == "onlyif" and not matches):
            run = False
        index += 1
    return (lines[index] if run else None), lines[index + 1 :]


def _split_answer(lines: list[str]) -> tuple[list[str], list[str]]:
    if "----" in lines:
        at = lines.index("----")
        return lines[:at], lines[at + 1 :]
    return lines, []


# ---- what an answer looks like -------------------------------------------------------------


def values(table: pa.Table, types: str) -> list[str]:
    """The answer's values, row by row, as SQLite's driver prints them for ``types``."""
    if table.num_columns != len(types):
        raise ColumnCountMismatch(f"{table.num_columns} columns where the query says {types}")
    columns = [column.to_pylist() for column in table.columns]
    out: list[str] = []
    for row in range(table.num_rows):
        for kind, column in zip(types, columns):
            out.append(shown(column[row], kind))
    return out


class ColumnCountMismatch(ValueError):
    """The engine answered another number of columns than the query's type string."""


def shown(value: Any, kind: str) -> str:
    if value is None:
        return "NULL"
    if kind == "I":
        return str(_as_c_int(value))
    if kind == "R":
        return f"{_as_double(value):.3f}"
    text = _as_text(value)
    if text == "":
        return "(empty)"
    # byte by byte, as the driver's C loop over the UTF-8 text
    return "".join(chr(b) if 0x20 <= b <= 0x7E else "@" for b in text.encode())


def _as_c_int(value: Any) -> int:
    """``sqlite3_column_int``: reals truncate toward zero (saturating at 64 bits), text takes
    its leading number, and the result is the low 32 bits, signed."""
    if isinstance(value, bool):
        number = int(value)
    elif isinstance(value, int):
        number = value
    elif isinstance(value, float | Decimal):
        if isinstance(value, float) and math.isnan(value):
            number = 0
        elif isinstance(value, float) and math.isinf(value):
            number = 2**63 - 1 if value > 0 else -(2**63)
        else:
            number = max(-(2**63), min(2**63 - 1, int(value)))
    else:
        match = re.match(r"\s*([+-]?\d+)", str(value))
        number = int(match.group(1)) if match else 0
    return (number + 2**31) % INT32_RANGE - 2**31


def _as_double(value: Any) -> float:
    if isinstance(value, int | float | Decimal | bool):
        return float(value)
    match = re.match(r"\s*([+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?)", str(value))
    return float(match.group(1)) if match else 0.0


def _as_text(value: Any) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, float):
        # SQLite prints a real with 15 significant digits, and a whole one with ".0"
        text = f"{value:.15g}"
        return text if any(c in text for c in ".eEn") else f"{text}.0"
    return str(value)


def arranged(found: list[str], query: Query) -> list[str]:
    """``found`` sorted as the query says, by byte comparison (C's ``strcmp``)."""
    if query.sort == "rowsort":
        width = query.columns
        rows = [found[i : i + width] for i in range(0, len(found), width)]
        rows.sort(key=lambda row: [v.encode() for v in row])
        return [v for row in rows for v in row]
    if query.sort == "valuesort":
        return sorted(found, key=str.encode)
    return found


def as_expected(found: list[str], query: Query) -> tuple[str, ...]:
    """The values as the file writes them: themselves, or their count and MD5 past the hash
    threshold."""
    found = arranged(found, query)
    if query.hash_threshold and len(found) > query.hash_threshold:
        digest = hashlib.md5("".join(f"{v}\n" for v in found).encode()).hexdigest()
        return (f"{len(found)} values hashing to {digest}",)
    return tuple(found)


# ---- engines and outcomes ------------------------------------------------------------------


class Outcome(StrEnum):
    RIGHT = "right"
    WRONG = "wrong"  # an answer, not the expected one
    REFUSED = "refused"  # an error of the kind the engine promises (QuarryError for quarry)
    CRASHED = "crashed"  # any other exception: never acceptable from quarry


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    detail: str = ""  # the error, or the answer against the expected one

    @property
    def right(self) -> bool:
        return self.outcome is Outcome.RIGHT


Answer = Callable[[str], pa.Table]


def judge(
    query: Query, answer: Answer, refusals: tuple[type[BaseException], ...] = (Exception,)
) -> Verdict:
    """Run ``query`` through ``answer`` and compare with its expected values. An exception of
    ``refusals`` is the engine's refusal; any other is a crash."""
    try:
        table = answer(query.sql)
    except refusals as error:
        return Verdict(Outcome.REFUSED, _first_line(error))
    except Exception as error:  # what is not a refusal is what we look for
        return Verdict(Outcome.CRASHED, f"{type(error).__name__}: {_first_line(error)}")
    try:
        got = as_expected(values(table, query.types), query)
    except ColumnCountMismatch as error:
        return Verdict(Outcome.WRONG, str(error))
    if got == query.expected:
        return Verdict(Outcome.RIGHT)
    return Verdict(Outcome.WRONG, f"got {_short(got)} expected {_short(query.expected)}")


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return (text.splitlines() or [type(error).__name__])[0][:300]


def _short(shown_values: Sequence[str]) -> str:
    head = list(shown_values[:VALUES_SHOWN_MAX])
    more = len(shown_values) - len(head)
    return repr(head) + (f" (+{more})" if more > 0 else "")


# ---- tables ---------------------------------------------------------------------------------


def reference(script: Script) -> duckdb.DuckDBPyConnection:
    """DuckDB with the file's tables built by its statements, dividing integers as SQLite does
    (``integer_division``: ``7 / 2`` is 3, not 3.5), so its answers are comparable."""
    connection = duckdb.connect()
    connection.execute("SET integer_division = true")
    for statement in script.statements:
        try:
            connection.execute(statement.sql)
        except duckdb.Error:
            if statement.expect_ok:
                raise
    return connection


def tables_of(connection: duckdb.DuckDBPyConnection) -> dict[str, pa.Table]:
    """Every table the statements made, its integers widened to 64 bits (SQLite's INTEGER)."""
    names = [row[0] for row in connection.execute("SHOW TABLES").fetchall()]
    out = {}
    for name in names:
        table = connection.execute(f'SELECT * FROM "{name}"').fetch_arrow_table()
        out[name] = table.cast(_widened(table.schema))
    return out


def _widened(schema: pa.Schema) -> pa.Schema:
    fields = []
    for f in schema:
        kind = f.type
        if pa.types.is_integer(kind):
            kind = pa.int64()
        elif pa.types.is_floating(kind):
            kind = pa.float64()
        elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
            kind = pa.string()
        fields.append(pa.field(f.name, kind, f.nullable))
    return pa.schema(fields)


# ---- a file, run -----------------------------------------------------------------------------


@dataclass
class QueryResult:
    line: int
    sql: str
    duckdb: Verdict
    quarry: dict[str, Verdict]  # pushdown mode -> verdict ("auto" always; some: always, never)


@dataclass
class FileResult:
    path: str
    results: list[QueryResult] = field(default_factory=list)
    skipped: int = 0

    def figures(self) -> dict[str, Any]:
        """Counts per file: queries, right in DuckDB, right in quarry under auto, and of those
        also run under always and never, how many agreed with auto."""
        results = self.results
        both = [r for r in results if "always" in r.quarry]
        return {
            "queries": len(results),
            "skipped_records": self.skipped,
            "duckdb_right": sum(r.duckdb.right for r in results),
            "quarry_auto_right": sum(r.quarry["auto"].right for r in results),
            "quarry_auto_refused": sum(
                r.quarry["auto"].outcome is Outcome.REFUSED for r in results
            ),
            "quarry_crashed": sum(
                any(v.outcome is Outcome.CRASHED for v in r.quarry.values()) for r in results
            ),
            "duckdb_right_quarry_not": sum(
                r.duckdb.right and not r.quarry["auto"].right for r in results
            ),
            "checked_in_every_mode": len(both),
            "same_in_every_mode": sum(_same_everywhere(r) for r in both),
        }

    def failures(self) -> list[QueryResult]:
        """Queries that break the acceptance: DuckDB right and quarry not, in any mode run, or
        quarry raising anything but its own errors."""
        return [r for r in self.results if not acceptable(r)]


def _same_everywhere(result: QueryResult) -> bool:
    outcomes = {
        (v.outcome, v.detail if v.outcome is Outcome.WRONG else "") for v in result.quarry.values()
    }
    return len(outcomes) == 1


def acceptable(result: QueryResult) -> bool:
    for verdict in result.quarry.values():
        if verdict.outcome is Outcome.CRASHED:
            return False
        if result.duckdb.right and not verdict.right:
            return False
    return True


def every_mode(index: int, every: int) -> bool:
    """Whether the ``index``-th query of a file also runs under always and never: one in
    ``every``."""
    return every > 0 and index % every == 0


def run_script(
    script: Script,
    quarry_answer: Callable[[str, str], pa.Table],
    refusals: tuple[type[BaseException], ...],
    queries: Iterable[int] | None = None,
    modes_every: int = 10,
    duckdb_connection: duckdb.DuckDBPyConnection | None = None,
) -> FileResult:
    """Each chosen query (indices into ``script.queries``; all by default) through DuckDB and
    through ``quarry_answer(sql, pushdown)`` under auto, and one in ``modes_every`` also under
    always and never."""
    connection = duckdb_connection or reference(script)
    result = FileResult(script.path, skipped=script.skipped)
    chosen = range(len(script.queries)) if queries is None else queries
    for index in chosen:
        query = script.queries[index]
        duck = judge(query, lambda sql: connection.execute(sql).fetch_arrow_table())
        modes = ("auto", "always", "never") if every_mode(index, modes_every) else ("auto",)
        verdicts = {
            mode: judge(query, lambda sql, m=mode: quarry_answer(sql, m), refusals)
            for mode in modes
        }
        result.results.append(QueryResult(query.line, query.sql, duck, verdicts))
    return result


def read_script(path: Path) -> Script:
    return parse(path.read_text(encoding="utf-8", errors="replace"), str(path))


class Ingested:
    """A file's tables ingested into a quarry cluster as ``slt/<table>`` (SQL: the bare name),
    dropped again on exit so the next file's tables of the same names are its own."""

    DOMAIN = "slt"

    def __init__(self, cluster: Any, tables: dict[str, pa.Table]) -> None:
        self.cluster = cluster
        self.tables = tables

    def __enter__(self) -> Ingested:
        for name, table in self.tables.items():
            self.cluster.ingest(table, f"{self.DOMAIN}/{name}")
        return self

    def __exit__(self, *exc: object) -> None:
        for name in self.tables:
            self.cluster.drop(f"{self.DOMAIN}/{name}")

    def answer(self, sql: str, pushdown: str) -> pa.Table:
        return self.cluster.sql(sql, pushdown=pushdown).read_all()


# ---- writing a file back (the checked-in subset) ---------------------------------------------


def written(script: Script, queries: Iterable[int]) -> str:
    """A sqllogictest file of ``script``'s statements and the chosen queries (indices), each
    under the hash threshold it had: what ``scripts/sqllogictest_subset.py`` checks in."""
    parts = [f"statement {'ok' if s.expect_ok else 'error'}\n{s.sql}\n" for s in script.statements]
    threshold = None
    for index in queries:
        query = script.queries[index]
        if query.hash_threshold != threshold:
            threshold = query.hash_threshold
            parts.append(f"hash-threshold {threshold}\n")
        header = " ".join(w for w in ("query", query.types, query.sort, query.label) if w)
        parts.append(f"{header}\n{query.sql}\n----\n" + "".join(f"{v}\n" for v in query.expected))
    return "\n".join(parts)
