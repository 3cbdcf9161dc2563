"""Shared fixtures: real device processes on loopback, sample data."""

from __future__ import annotations

import pyarrow as pa
import pytest

import quarry
from quarry.samples import particles


@pytest.fixture(scope="session")
def cluster():
    """Three real device processes talking Flight over loopback, shared by the session."""
    with quarry.local(devices=3) as c:
        yield c


@pytest.fixture(scope="session")
def particle_table() -> pa.Table:
    return particles.table(200_000, seed=3)
