"""planning.kept_rows: the share of a dataset's rows a fragment's filter keeps, as the join
filters size their builds by it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from quarry.coordinator.query import planning

DATES = 73_049  # TPC-DS's date_dim: 1900 to 2100, stored in date order


@pytest.fixture(scope="module")
def dates(cluster) -> str:
    rows = np.arange(DATES)
    table = pa.table(
        {
            "d_date_sk": rows,
            "d_year": 1900 + rows // 365,
            "d_note": pa.array(["x" * 300] * DATES),  # wide enough for several slices
        }
    )
    cluster.ingest(table, "test/kept_dates")
    yield "test.kept_dates"
    cluster.drop("test/kept_dates")


def _kept(cluster, sql: str) -> float:
    (share,) = planning.kept_rows(
        cluster, cluster.query(sql, pushdown="auto").decomposition
    ).values()
    return share


def test_a_filter_is_sampled_where_the_zone_maps_say_its_rows_are(cluster, dates) -> None:
    """A year of two hundred, in date order: the first slice holds none of it, and sampled
    alone said a filter on it keeps nearly nothing (TPC-DS Q7's sales then looked small
    enough to cut the customer profiles that should have cut them). Sampled where its rows
    may be, times the share of rows there, it keeps a year's share."""
    partitions = cluster.entry("test/kept_dates").partitions
    assert sum(p.slices for p in partitions) > 3, "the layout the test is about"
    year = _kept(cluster, f"SELECT d_date_sk FROM {dates} WHERE d_year = 2000")
    assert year == pytest.approx(365 / DATES, rel=0.05)
    never = _kept(cluster, f"SELECT d_date_sk FROM {dates} WHERE d_year = 1800")
    assert never <= 1 / DATES
    every = _kept(cluster, f"SELECT d_date_sk FROM {dates} WHERE d_year >= 1900")
    assert every == pytest.approx(1.0)
