"""One cluster and one Flight SQL endpoint per test module, on loopback, and DuckDB over the
same data as the reference every answer is checked against."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyarrow import flight

import quarry
from quarry.auth.credentials import Credentials
from quarry.auth.tokens import Role
from quarry.coordinator.processes.local import LocalCluster
from quarry.flightsql.serve import start
from quarry.flightsql.server import FlightSqlServer
from quarry.samples import particles

PARTICLE_ROWS = 60_000
RUN_ROWS = 200


def runs_table() -> pa.Table:
    """Small, with what parameters must bind: text with quotes, dates, nulls, booleans."""
    return pa.table(
        {
            "run_id": pa.array(range(RUN_ROWS), pa.int64()),
            "name": [("O'Brien" if i % 7 == 0 else f"run-{i}") for i in range(RUN_ROWS)],
            "started": [
                datetime.date(2024, 1, 1) + datetime.timedelta(days=i) for i in range(RUN_ROWS)
            ],
            "weight": [None if i % 5 == 0 else i * 0.5 for i in range(RUN_ROWS)],
            "ok": [i % 3 == 0 for i in range(RUN_ROWS)],
        }
    )


@dataclass
class Endpoint:
    cluster: LocalCluster
    server: FlightSqlServer
    credentials: Credentials
    token: str  # a reader's
    tables: dict[str, pa.Table]  # by SQL name, domain.name

    @property
    def uri(self) -> str:
        return f"{self.server.scheme}://127.0.0.1:{self.server.port}"

    def connect(self, token: str | None = None, **db_kwargs: Any) -> Any:
        """An ADBC DB-API connection, with a bearer token unless other credentials are given."""
        import adbc_driver_flightsql.dbapi as flight_sql

        if not db_kwargs:
            header = f"Bearer {token or self.token}"
            db_kwargs = {"adbc.flight.sql.authorization_header": header}
        return flight_sql.connect(self.uri, db_kwargs=db_kwargs, autocommit=True)

    def client(
        self, token: str | None = None
    ) -> tuple[flight.FlightClient, flight.FlightCallOptions]:
        """A plain Flight client and the call options carrying the token."""
        headers = [(b"authorization", f"Bearer {token or self.token}".encode())]
        return flight.connect(self.uri), flight.FlightCallOptions(headers=headers)

    def duckdb(self, sql: str) -> pa.Table:
        """DuckDB's answer over the same tables, under the same names."""
        import duckdb

        connection = duckdb.connect()
        for index, (qualified, table) in enumerate(self.tables.items()):
            domain, name = qualified.split(".")
            connection.register(f"source_{index}", table)
            connection.execute(f"CREATE SCHEMA IF NOT EXISTS {domain}")
            connection.execute(f"CREATE VIEW {domain}.{name} AS SELECT * FROM source_{index}")
        return connection.execute(sql).fetch_arrow_table()


@pytest.fixture(scope="module")
def endpoint() -> Iterator[Endpoint]:
    tables = {
        "physics.particles": particles.table(PARTICLE_ROWS, seed=11),
        "lab.runs": runs_table(),
    }
    with quarry.local(devices=2) as cluster:
        for qualified, table in tables.items():
            cluster.ingest(table, qualified.replace(".", "/"))
        credentials = Credentials(Path(cluster.specs[0].credentials))
        server = start(cluster.cluster_file)
        try:
            yield Endpoint(cluster, server, credentials, credentials.token(Role.READER), tables)
        finally:
            server.shutdown()
