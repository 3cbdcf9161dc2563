"""A super-plan DataFusion cannot run, run by DuckDB over the same fragment streams.

DataFusion 55 turns a correlated subquery into a join only when it is correlated by equalities;
one correlated otherwise (``(SELECT count(*) FROM t1 AS x WHERE x.b < t1.b)``, an ``EXISTS``
whose subquery compares with ``<``) stays a subquery that its Substrait producer cannot write
(``Cannot convert OuterRef``) and its physical planner cannot run. It also refuses a query
whose output names repeat (``SELECT a, a FROM t``, two ``(SELECT ...)`` columns), which SQL
allows. DuckDB answers both: it unnests any correlated subquery (Neumann and Kemper,
"Unnesting Arbitrary Queries") and names columns as they come. Decorrelating inside quarry would
mean rewriting DataFusion's logical plan, which its Python API cannot build, or SQL, which quarry
does not parse; so such a query keeps quarry's cut below the super-plan and hands the super-plan
to DuckDB:

- every dataset the query reads is one fragment, its scan narrowed to the columns DataFusion's
  plan reads of it (all of them when DataFusion could not plan the query), planned, pushed and
  completed as any single-table query's (``decompose`` of ``SELECT cols FROM dataset``);
- the super-plan is the query's own SQL, run by DuckDB over the fragments' outputs (Arrow in,
  Arrow out), each registered under the names the SQL may use for its dataset; DuckDB divides
  integers as DataFusion does (``integer_division``) and works in the query's host budget
  (``memory_limit``, spilling to the spool's directory);
- the answer has DataFusion's types where DataFusion planned the query, DuckDB's otherwise.

The answer does not depend on where the fragments ran: they are scans, which every mode
completes to the same rows.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds

from quarry.plan import engine
from quarry.plan.errors import PlanError
from quarry.plan.memory import MIB, MemoryBudget
from quarry.plan.spool import Spool
from quarry.tally import Tally

RESULT_BATCH_ROWS = 65_536
DUCKDB_MEMORY_BYTES_MIN = 16 * MIB  # DuckDB does not run below a few MiB
# "TableScan: slt.t1 projection=[a, b]" in DataFusion's indented plan (no projection: all)
_SCAN = re.compile(r"TableScan: (\S+?)(?: projection=\[([^\]]*)\])?(?: |$)", re.MULTILINE)


@dataclass(frozen=True)
class HostTable:
    """A name the query's SQL may use for a dataset, and the fragment whose output it is."""

    reference: tuple[str, ...]  # ("domain", "name") or ("name",)
    fragment: str


def datasets_read(sql: str, catalog: engine.Catalog) -> list[str]:
    """The stored datasets ``sql`` names, in order of first mention, by DuckDB's parser (a CTE
    of a dataset's name counts: at worst a scan too many)."""
    connection = duckdb.connect()
    try:
        tree = connection.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()[0]
    finally:
        connection.close()
    parsed = json.loads(tree)
    if parsed.get("error"):
        raise PlanError(
            f"{parsed.get('error_message', 'the SQL does not parse')}\nhint: check the SQL syntax"
        )
    found: list[str] = []
    for schema, name in _base_tables(parsed):
        dataset = catalog.dataset_of((schema, name) if schema else (name,))
        if dataset is not None and dataset not in found:
            found.append(dataset)
    return found


def _base_tables(node: Any) -> Iterator[tuple[str, str]]:
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if item.get("type") == "BASE_TABLE" and "table_name" in item:
                yield item.get("schema_name", ""), item["table_name"]
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def columns_read(plan: str, catalog: engine.Catalog) -> dict[str, set[str]] | None:
    """Per dataset, the columns DataFusion's indented plan scans of it; None when a scan names
    a table this cannot place. A scan inside a subquery DataFusion left correlated shows no
    projection: it adds nothing here (the SQL's own words name what it reads)."""
    needed: dict[str, set[str]] = {}
    for match in _SCAN.finditer(plan):
        dataset = catalog.dataset_of(tuple(match.group(1).split(".")))
        if dataset is None:
            return None
        listed = match.group(2) or ""
        columns = {c.strip() for c in listed.split(",") if c.strip()}
        needed.setdefault(dataset, set()).update(columns)
    return needed


def selects_every_column(sql: str) -> bool:
    """Whether ``sql`` has a ``*`` other than ``count(*)``'s: a star binds to whatever columns
    a table has, so such a query's scans keep them all."""
    return "*" in re.sub(r"(?i)count\s*\(\s*\*\s*\)", "", sql)


def words(sql: str) -> set[str]:
    """Every identifier-like word of ``sql``, lower-cased (quoted ones too)."""
    return {w.lower() for w in re.findall(r"[A-Za-z_][A-Za-z0-9_$]*", sql)}


def references(dataset: str, catalog: engine.Catalog) -> list[tuple[str, ...]]:
    """Every SQL name of ``dataset``: ``domain.name``, and ``name`` when no other has it."""
    domain, name = engine.split_dataset(dataset)
    names = [(domain, name)]
    if catalog.dataset_of((name,)) == dataset:
        names.append((name,))
    return names


def answer_schema(
    sql: str, tables: Mapping[str, pa.Schema], catalog: engine.Catalog, datasets: list[str]
) -> pa.Schema:
    """The answer's schema as DuckDB types it, from the query over empty tables; its refusal
    as a ``PlanError``."""
    connection = connect(1, None, None)
    try:
        for index, dataset in enumerate(datasets):
            name = f"{engine.RESERVED_PREFIX}_empty_{index}"
            connection.register(name, tables[dataset].empty_table())
            _views(connection, [HostTable(r, name) for r in references(dataset, catalog)])
        return connection.execute(sql).fetch_arrow_table().schema
    except duckdb.Error as error:
        raise PlanError(
            f"{_first_line(error)}\nhint: check the query against the tables' schemas"
        ) from None
    finally:
        connection.close()


def connect(
    threads: int, memory_bytes: int | None, temp_directory: Path | None
) -> duckdb.DuckDBPyConnection:
    config: dict[str, Any] = {"threads": max(1, threads)}
    if memory_bytes is not None:
        config["memory_limit"] = f"{max(memory_bytes, DUCKDB_MEMORY_BYTES_MIN) // MIB}MiB"
    if temp_directory is not None:
        config["temp_directory"] = str(temp_directory)
    connection = duckdb.connect(config=config)
    # SQL's integer division, as DataFusion (and SQLite) do it: 7 / 2 is 3
    connection.execute("SET integer_division = true")
    return connection


def _views(connection: duckdb.DuckDBPyConnection, tables: Iterable[HostTable]) -> None:
    for table in tables:
        quoted = [engine.quote_identifier(part) for part in table.reference]
        if len(quoted) == 2:
            connection.execute(f"CREATE SCHEMA IF NOT EXISTS {quoted[0]}")
        source = engine.quote_identifier(table.fragment)
        connection.execute(f"CREATE OR REPLACE VIEW {'.'.join(quoted)} AS SELECT * FROM {source}")


def _first_line(error: BaseException) -> str:
    lines = [line for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def run(
    sql: str,
    tables: tuple[HostTable, ...],
    spooled_inputs: Mapping[str, tuple[pa.Schema, Iterable[pa.RecordBatch]]],
    schema: pa.Schema,
    budget: MemoryBudget,
    temp_directory: str | Path | None,
    cores: int,
    clock: Tally,
    inputs_in: Callable[[], object] | None,
    conform: Callable[[pa.RecordBatch, pa.Schema], pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """The query's answer: every fragment's output read to its end into the spool (memory up to
    its share, Arrow IPC files beyond), then DuckDB runs the SQL over them."""
    with Spool(budget.spool_memory_bytes_max, temp_directory) as spool:
        spooled = spool.fill(spooled_inputs)
        if inputs_in is not None:
            inputs_in()
        with clock.timing(process=True):
            connection = connect(cores, budget.pool_bytes, spool.directory)
            for name, output in spooled.items():
                parts = []
                if output.batches or not output.files:
                    memory_name = f"{name}__memory"
                    connection.register(
                        memory_name, pa.Table.from_batches(output.batches, output.schema)
                    )
                    parts.append(memory_name)
                if output.files:
                    disk_name = f"{name}__disk"
                    connection.register(
                        disk_name, ds.dataset([str(f) for f in output.files], format="ipc")
                    )
                    parts.append(disk_name)
                union = " UNION ALL ".join(
                    f"SELECT * FROM {engine.quote_identifier(p)}" for p in parts
                )
                connection.execute(f"CREATE VIEW {engine.quote_identifier(name)} AS {union}")
            _views(connection, tables)
            result = connection.execute(sql).fetch_record_batch(RESULT_BATCH_ROWS)
        try:
            for batch in clock.timed(result, process=True):
                if batch.num_rows:
                    yield conform(batch, schema)
        finally:
            result.close()
            connection.close()
