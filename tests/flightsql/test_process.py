"""The endpoint from the command line: ``quarry up --flight-sql-port`` starts it beside the
devices, a token from ``quarry token create`` queries it, ``quarry down`` stops it; ``quarry
serve`` refuses to listen off loopback in the clear."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import adbc_driver_flightsql.dbapi as flight_sql
import pytest

from tests.commands import run_quarry

pytestmark = pytest.mark.timeout(300)


def _quarry(*args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    return run_quarry(*args, cwd=cwd, check=check, timeout=120)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = (
        Path(f"/proc/{pid}/stat").read_text().split()[2] if Path(f"/proc/{pid}").exists() else ""
    )
    return state != "Z"


@pytest.mark.slow
def test_up_serves_flight_sql_and_down_stops_it(tmp_path):
    """And ``quarry serve`` off loopback without TLS refuses to start, with one line."""
    _quarry("up", "--devices", "2", "--detach", "--flight-sql-port", "0", cwd=tmp_path)
    ready = json.loads((tmp_path / ".quarry" / "flightsql" / "ready.json").read_text())
    try:
        token = _quarry("token", "create", "--role", "reader", cwd=tmp_path).stdout.strip()
        bearer = {"adbc.flight.sql.authorization_header": f"Bearer {token}"}
        with (
            flight_sql.connect(ready["address"], db_kwargs=bearer, autocommit=True) as connection,
            connection.cursor() as cursor,
        ):
            cursor.execute("SELECT 41 + 1 AS answer")
            assert cursor.fetchall() == [(42,)]
        refused = _quarry("serve", "--host", "0.0.0.0", "--port", "0", cwd=tmp_path, check=False)
        assert refused.returncode == 2
        assert "must use TLS" in refused.stderr and "Traceback" not in refused.stderr
    finally:
        stopped = _quarry("down", cwd=tmp_path)
    assert "Flight SQL endpoint: stopped" in stopped.stdout
    deadline = time.monotonic() + 10
    while _alive(ready["pid"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(ready["pid"])
