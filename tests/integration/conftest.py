"""Fixtures for cluster-level SQL tests: TPC-H SF 0.1 ingested into real device processes."""

from __future__ import annotations

import pytest

import quarry
from tests.plan.conftest import TPCH_TABLES, tpch  # noqa: F401 - the session fixture


def _ingest_tpch(cluster, tpch) -> None:  # noqa: F811
    for name in TPCH_TABLES:
        cluster.ingest(tpch.data[f"tpch/{name}"], f"tpch/{name}")


@pytest.fixture
def small_probes_pay(monkeypatch):
    """Join keys sent to probes of 10,000 rows and more (``PROBE_ROWS_MIN``): SF 0.1's fact
    tables are under the size that pays; the pairs worked out before and after are forgotten."""
    from quarry.plan import join_filters

    monkeypatch.setattr(join_filters, "PROBE_ROWS_MIN", 10_000)
    join_filters._join_filters.cache_clear()
    yield
    join_filters._join_filters.cache_clear()


@pytest.fixture(scope="module")
def tpch_cluster(tpch):  # noqa: F811
    """Four host-profile devices holding TPC-H at SF 0.1."""
    with quarry.local(devices=4) as cluster:
        _ingest_tpch(cluster, tpch)
        yield cluster


@pytest.fixture(scope="module")
def mixed_cluster(tpch):  # noqa: F811
    """Emulated drives of two kinds: kinetic (15x slower CPU, slow links) and scaleflux (scan
    engines: comparisons only). Datasets spanning both can only be filtered on the devices."""
    with quarry.local(devices=4, profile=["kinetic", "scaleflux", "kinetic", "kinetic"]) as c:
        _ingest_tpch(c, tpch)
        yield c
