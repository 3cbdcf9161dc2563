"""Host merge functions: Chan's variance merge and DataFusion-exact decimal averages."""

from __future__ import annotations

import decimal
import math
import statistics

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quarry.plan import engine, merge


def _moments(values: list[float]) -> tuple[int, float | None, float | None]:
    if not values:
        return 0, None, None
    return len(values), statistics.fmean(values), statistics.pvariance(values)


@settings(max_examples=200, deadline=None)
@given(
    parts=st.lists(st.lists(st.floats(-1e6, 1e6), max_size=8), min_size=1, max_size=6),
    kind=st.sampled_from(merge.MOMENT_KINDS),
)
def test_chan_merge_matches_the_direct_computation(parts, kind: str) -> None:
    accumulator = merge._moment_accumulator(kind)()
    rows = [_moments(part) for part in parts]
    half = len(rows) // 2
    accumulator.update(
        *(
            pa.array(column, t)
            for column, t in zip(
                zip(*rows[:half]) if half else ([], [], []),
                (pa.int64(), pa.float64(), pa.float64()),
            )
        )
    )
    other = merge._moment_accumulator(kind)()
    other.update(
        *(
            pa.array(column, t)
            for column, t in zip(zip(*rows[half:]), (pa.int64(), pa.float64(), pa.float64()))
        )
    )
    accumulator.merge([pa.array([s.as_py()]) for s in other.state()])
    result = accumulator.evaluate().as_py()
    values = [v for part in parts for v in part]
    sample = kind.endswith("_samp")
    if len(values) < (2 if sample else 1):
        assert result is None
        return
    expected = statistics.variance(values) if sample else statistics.pvariance(values)
    if kind.startswith("stddev"):
        expected = math.sqrt(expected)
    scale = max([abs(v) for v in values] + [1.0])
    assert math.isclose(
        result,
        expected,
        rel_tol=1e-9,
        abs_tol=1e-12 * scale * (scale if kind.startswith("var") else 1),
    )


def test_constant_columns_have_zero_variance() -> None:
    accumulator = merge._moment_accumulator("var_samp")()
    accumulator.update(pa.array([3, 4]), pa.array([0.1, 0.1]), pa.array([0.0, 0.0]))
    assert accumulator.evaluate().as_py() == 0.0


def test_decimal_average_truncates_toward_zero_like_datafusion() -> None:
    average = merge.avg_decimal_udf(2, 19, 6)
    ctx = engine.session()
    ctx.register_udf(average)
    sums = pa.array(
        [decimal.Decimal("0.02"), decimal.Decimal("-0.02"), None, decimal.Decimal("5.00")],
        pa.decimal128(38, 2),
    )
    counts = pa.array([3, 3, 0, 0], pa.int64())
    ctx.register_record_batches("t", [[pa.record_batch([sums, counts], names=["s", "c"])]])
    result = ctx.sql("SELECT quarry_avg_decimal_2_19_6(s, c) AS a FROM t").to_arrow_table()
    assert result.column("a").to_pylist() == [
        decimal.Decimal("0.006666"),
        decimal.Decimal("-0.006666"),
        None,
        None,
    ]
    native = ctx.sql(
        "SELECT avg(v) AS a FROM (VALUES (CAST(0.01 AS DECIMAL(15,2))), "
        "(CAST(0.01 AS DECIMAL(15,2))), (CAST(0.00 AS DECIMAL(15,2)))) AS x(v)"
    )
    assert native.to_arrow_table().column("a").to_pylist() == [decimal.Decimal("0.006666")]


def test_functions_are_recreated_from_their_names() -> None:
    ctx = engine.session()
    names = [merge.moment_merge_name("stddev_pop"), merge.avg_decimal_name(2, 19, 6), "sum"]
    merge.register_merge_functions(ctx, names)
    with pytest.raises(ValueError, match="unknown quarry merge function"):
        merge.register_merge_functions(ctx, ["quarry_nope"])
