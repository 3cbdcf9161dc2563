"""The decomposition invariant through real devices: same answer whatever the devices decide.

Random tables and random filter + group-by + aggregate queries (the strategies of the
in-process property test), stored on three device processes with a tiny key-value limit so
each partition holds many slices; the answer with pushdown never, always, and always with
random slice ranges forced back raw or filtered equals DuckDB's (aggregates slice statistics
answer among them); and the same on a hierarchy
(two storage servers of three drives each), where a forced range is completed by the server or
passed on to the host.
"""

from __future__ import annotations

import itertools
import random

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import quarry
from tests.plan.harness import assert_same_rows
from tests.plan.test_property import (
    AGGREGATES,
    DUPLICATE_INSENSITIVE,
    FLOAT_ABSOLUTE,
    queries,
    tables,
)
from tests.plan.test_statistics import statistics_queries

EXAMPLES = 20
REPEAT = 25  # a drawn table is tiled so that each partition spans several slices
# Tiny key-values so each partition spans many slices; the same drives as the profiles
# otherwise (a 15x slower Kinetic CPU and links, a ScaleFlux scan engine).
PROFILES = """
[profiles.tiny]
from = "host"
kv_bytes_max = 4096

[profiles.tiny_kinetic]
from = "kinetic"
kv_bytes_max = 4096

[profiles.tiny_scaleflux]
from = "scaleflux"
kv_bytes_max = 4096
"""
CLUSTERS = {
    "host": ["tiny", "tiny", "tiny"],
    # issue 4: every profile and every decision, with background load on the Kinetic drives
    "kinetic+scaleflux+load": ["tiny_kinetic", "tiny_scaleflux", "tiny_kinetic"],
    # issue 13: host -> 2 storage servers -> 3 drives each, of every kind
    "hierarchy": [
        "tiny",
        "tiny_scaleflux",
        "tiny_kinetic",
        "tiny_kinetic",
        "tiny",
        "tiny_scaleflux",
    ],
}
SERVERS = {"hierarchy": 2}
_names = itertools.count()


@pytest.fixture(scope="module", params=sorted(CLUSTERS))
def tiny_cluster(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    (folder / "profiles.toml").write_text(PROFILES)
    profiles = CLUSTERS[request.param]
    servers = SERVERS.get(request.param, 0)
    shape = (
        {"servers": servers, "drives_per_server": len(profiles) // servers}
        if servers
        else {"devices": len(profiles)}
    )
    with quarry.local(
        **shape, profile=profiles, profiles_file=str(folder / "profiles.toml")
    ) as cluster:
        if request.param.endswith("load"):
            for name in ("dev0", "dev2"):
                cluster.load(name, 0.5, seconds=600)
        yield cluster


@pytest.mark.slow
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    table=tables(),
    sql=st.one_of(queries(), queries(DUPLICATE_INSENSITIVE), statistics_queries()),
    seed=st.integers(0, 2**16),
)
def test_answer_independent_of_device_decisions(
    tiny_cluster, table: pa.Table, sql: str, seed: int
) -> None:
    data = pa.concat_tables([table] * REPEAT)
    dataset = f"prop/t{next(_names)}"
    tiny_cluster.ingest(data, dataset, partitions=3)
    try:
        sql = sql.replace(" FROM t", f" FROM {dataset.replace('/', '.')}")
        rng = random.Random(seed)
        decisions = {}
        for p in tiny_cluster.entry(dataset).partitions:
            if p.slices:
                first = rng.randrange(p.slices)
                decisions[(dataset, p.partition)] = [
                    {
                        "first": first,
                        "end": rng.randrange(first, p.slices) + 1,
                        "stage": rng.choice(["raw", "filter"]),
                        # behind a storage server: completed by the host, not the server
                        "to_host": rng.random() < 0.5,
                    }
                ]
        answers = {
            mode: tiny_cluster.sql(sql, pushdown=mode).read_all()
            for mode in ("never", "server", "always", "auto")
        }
        answers["forced"] = tiny_cluster.sql(sql, pushdown="always", decisions=decisions).read_all()
        connection = duckdb.connect()
        connection.register("data", data)
        expected = connection.execute(
            sql.replace(f"FROM {dataset.replace('/', '.')}", "FROM data")
        ).fetch_arrow_table()
        for mode, answer in answers.items():
            assert_same_rows(
                answer,
                expected,
                ordered=False,
                float_absolute=FLOAT_ABSOLUTE,
                context=f"{mode}: {sql}",
            )
    finally:
        tiny_cluster.drop(dataset)


def test_strategies_cover_aggregates():
    assert "var_samp({num})" in AGGREGATES and "count(DISTINCT {any})" in AGGREGATES
