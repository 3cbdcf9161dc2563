"""Property: a program prints the same whatever cut is forced.

Generated pandas programs (filters, column arithmetic, a join with a small local table, group-by
aggregates and other reductions) over a stored table print, under ``quarry run``, exactly what
they print run plainly on the file: with every line on the host, every line that may on the
devices, a random cut, and a forced migration of half of every partition.

Floats are multiples of 1/8 below 128 in magnitude, so sums of them are exact whatever their
order and partials combine to the plain run's bits; a variance merges pairwise and is printed
to 6 decimals.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quarry.offload.run import plan
from quarry.settings import PROPERTY_EXAMPLES

from .programs import plain, under_quarry

ROWS = 24_000
HEADER = """import sys
import pandas as pd
labels = pd.read_csv(sys.argv[2])
weight = dict(zip(labels.g, labels.w))
df = pd.read_parquet(sys.argv[1])
"""


@pytest.fixture(scope="module")
def stored(cluster, tmp_path_factory):
    folder = tmp_path_factory.mktemp("offload-property")
    rng = np.random.default_rng(5)
    table = pa.table(
        {
            "id": np.arange(ROWS),
            "g": rng.integers(0, 5, ROWS),
            "a": rng.integers(-400, 400, ROWS) / 8,
            "b": rng.integers(-400, 400, ROWS) / 8,
            "n": rng.integers(0, 50, ROWS),
        }
    )
    data = folder / "table.parquet"
    pq.write_table(table, data)
    labels = folder / "labels.csv"  # a small local table, read from the file system
    pacsv.write_csv(pa.table({"g": [0, 1, 2, 3, 4], "w": [1, 2, 3, 5, 8]}), labels)
    cluster.ingest(str(data), "offload/property", partitions=4)
    yield folder, [str(data), str(labels)]
    cluster.drop("offload/property")


STEPS = st.sampled_from(
    [
        "df = df[df.a > {k}]",
        "df = df[(df.n % 3 != 0) | (df.b < {k})]",
        "df = df.assign(c=df.a * 2 + df.b)",
        "df = df.assign(w=df.g.map(weight))",  # the small local table, row by row
        "df['d'] = df.n * 4 - df.g",
        "df = df[['g', 'a', 'b', 'n']]",
    ]
)
REDUCTIONS = st.sampled_from(
    [
        "r = df.groupby('g').agg(s=('a', 'sum'), c=('b', 'count'), m=('n', 'mean'))",
        "r = df.groupby(['g', 'n'], sort=False).a.sum()",
        "r = df.a.sum()",
        "r = len(df)",
        "r = df[['a', 'b']].max()",
        "r = df.n.value_counts()",
        "r = df.b.var()",
        # a join (on the host); k is a name no step makes
        "r = df.merge(labels.assign(k=labels.w * 2)[['g', 'k']], on='g').groupby('g').k.sum()",
    ]
)


@st.composite
def programs(draw) -> str:
    steps = draw(st.lists(STEPS, min_size=1, max_size=4))
    lines = [s.format(k=draw(st.integers(-30, 30))) for s in steps]
    reduction = draw(REDUCTIONS)
    printed = "print(r.round(6).to_string() if hasattr(r, 'to_string') else round(float(r), 6))"
    if "df.merge" in reduction and "df = df[['g', 'a', 'b', 'n']]" not in lines:
        lines.append("df = df[['g', 'a', 'b', 'n']]")
    tail = "print(len(df), df.tail(3).to_string())"
    return HEADER + "\n".join([*lines, reduction, tail, printed])


@pytest.mark.slow
@settings(
    max_examples=PROPERTY_EXAMPLES.get() or 5,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(source=programs(), data=st.data())
def test_the_output_is_the_same_whatever_cut_is_forced(stored, cluster, tmp_path, source, data):
    folder, args = stored
    script = tmp_path / "generated.py"
    script.write_text(source)
    expected = plain(script, args)
    planned = plan(script, cluster, args)
    movable = sorted(line.number for line in planned.lines if line.movable)
    chosen = data.draw(st.sets(st.sampled_from(movable)) if movable else st.just(set()))
    cuts = [
        {"offload": "host"},
        {"offload": "device"},
        {"device_lines": chosen},
        {"offload": "device", "migrate": "force"},
    ]
    for options in cuts:
        assert under_quarry(script, cluster, args, planned=planned, **options) == expected, options
