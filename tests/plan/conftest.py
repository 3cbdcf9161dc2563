"""Shared fixtures: TPC-H at scale factor 0.1, generated once per session with DuckDB."""

from __future__ import annotations

import glob
import importlib.util
import os
from dataclasses import dataclass, field

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

TPCH_SCALE_FACTOR = 0.1
TPCH_TABLES = ("customer", "lineitem", "nation", "orders", "part", "partsupp", "region", "supplier")


def duckdb_with(extension: str) -> duckdb.DuckDBPyConnection:
    """DuckDB with an extension from its pinned `duckdb-ext-<name>` package (no download); the
    packages share the `duckdb_ext` namespace, perhaps from several folders."""
    locations = importlib.util.find_spec("duckdb_ext").submodule_search_locations
    for location in locations:
        directory = os.path.join(location, "extensions")
        if glob.glob(os.path.join(directory, "*", "*", f"{extension}.duckdb_extension")):
            connection = duckdb.connect(
                config={"extension_directory": directory, "autoinstall_known_extensions": False}
            )
            connection.execute(f"LOAD {extension}")
            return connection
    raise FileNotFoundError(f"no {extension} extension: install duckdb-ext-{extension}")


def duckdb_with_tpch() -> duckdb.DuckDBPyConnection:
    """DuckDB with the tpch extension from the pinned `duckdb-ext-tpch` package (no download)."""
    return duckdb_with("tpch")


@dataclass
class Tpch:
    connection: duckdb.DuckDBPyConnection
    data: dict[str, pa.Table]  # "tpch/<table>" -> rows
    queries: dict[int, str]
    _expected: dict[int, pa.Table] = field(default_factory=dict)

    @property
    def schemas(self) -> dict[str, pa.Schema]:
        return {name: table.schema for name, table in self.data.items()}

    def expected(self, number: int) -> pa.Table:
        if number not in self._expected:
            self._expected[number] = self.connection.execute(
                self.queries[number]
            ).fetch_arrow_table()
        return self._expected[number]


@pytest.fixture(scope="session")
def tpch(tmp_path_factory: pytest.TempPathFactory) -> Tpch:
    folder = tmp_path_factory.mktemp(f"tpch_sf{TPCH_SCALE_FACTOR}")
    connection = duckdb_with_tpch()
    connection.execute(f"CALL dbgen(sf={TPCH_SCALE_FACTOR})")
    data: dict[str, pa.Table] = {}
    for name in TPCH_TABLES:
        path = folder / f"{name}.parquet"
        pq.write_table(connection.execute(f"SELECT * FROM {name}").fetch_arrow_table(), path)
        data[f"tpch/{name}"] = pq.read_table(path)
    queries = dict(connection.execute("SELECT query_nr, query FROM tpch_queries()").fetchall())
    return Tpch(connection, data, queries)


TPCDS_SCALE_FACTOR = 0.1


@dataclass
class Tpcds:
    """TPC-DS at SF 0.1 from DuckDB's tpcds extension: its 24 tables and 99 queries."""

    connection: duckdb.DuckDBPyConnection
    data: dict[str, pa.Table]  # "tpcds/<table>" -> rows
    queries: dict[int, str]
    _expected: dict[int, pa.Table] = field(default_factory=dict)

    def expected(self, number: int) -> pa.Table:
        if number not in self._expected:
            self._expected[number] = self.connection.execute(
                self.queries[number]
            ).fetch_arrow_table()
        return self._expected[number]


@pytest.fixture(scope="session")
def tpcds() -> Tpcds:
    connection = duckdb_with("tpcds")
    connection.execute(f"CALL dsdgen(sf={TPCDS_SCALE_FACTOR})")
    names = [row[0] for row in connection.execute("SHOW TABLES").fetchall()]
    data = {
        f"tpcds/{name}": connection.execute(f"SELECT * FROM {name}").fetch_arrow_table()
        for name in names
    }
    queries = dict(connection.execute("SELECT query_nr, query FROM tpcds_queries()").fetchall())
    return Tpcds(connection, data, queries)


SMALL_ROWS = 3000


@dataclass
class Small:
    """A mixed-type table with nulls, as dataset "test/t" (SQL: `t` or `test.t`)."""

    table: pa.Table

    @property
    def data(self) -> dict[str, pa.Table]:
        return {"test/t": self.table}

    @property
    def schemas(self) -> dict[str, pa.Schema]:
        return {"test/t": self.table.schema}

    def expected(self, sql: str) -> pa.Table:
        connection = duckdb.connect()
        connection.register("t", self.table)
        return connection.execute(sql).fetch_arrow_table()


@pytest.fixture(scope="session")
def small() -> Small:
    import datetime
    import decimal
    import random

    rng = random.Random(7)

    def maybe(value, null_fraction: float = 0.1):
        return None if rng.random() < null_fraction else value

    rows = range(SMALL_ROWS)
    table = pa.table(
        {
            "id": pa.array(list(rows), pa.int64()),
            "k": pa.array([maybe(rng.randrange(8), 0.05) for _ in rows], pa.int64()),
            "i": pa.array([maybe(rng.randrange(-100, 100)) for _ in rows], pa.int32()),
            "x": pa.array([maybe(rng.randrange(-8000, 8000) / 8) for _ in rows], pa.float64()),
            "s": pa.array(
                [maybe(rng.choice(["apple", "banana", "cherry", "blueberry"])) for _ in rows],
                pa.string(),
            ),
            "d": pa.array(
                [maybe(datetime.date(2020, 1, 1) + datetime.timedelta(days=r % 366)) for r in rows],
                pa.date32(),
            ),
            "p": pa.array(
                [maybe(decimal.Decimal(rng.randrange(0, 100000)).scaleb(-2)) for _ in rows],
                pa.decimal128(15, 2),
            ),
        }
    )
    return Small(table)
