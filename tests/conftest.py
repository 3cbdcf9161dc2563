"""Shared fixtures: real device processes on loopback, sample data."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

import quarry
from quarry.samples import particles

# Tests choose their tables' layouts: most were written for tables spread over every device by
# 1 MiB row groups, and keep that layout; the tests of the default (a partition holds at least
# 16 MiB) unset this (tests/coordinator/ingest/test_layout.py, test_ingest_scan.py).
os.environ.setdefault("QUARRY_PARTITION_MIB_MIN", "0")


@pytest.fixture(scope="session")
def cluster():
    """Three real device processes talking Flight over loopback, shared by the session."""
    with quarry.local(devices=3) as c:
        yield c


@pytest.fixture(scope="session")
def particle_table() -> pa.Table:
    return particles.table(200_000, seed=3)
