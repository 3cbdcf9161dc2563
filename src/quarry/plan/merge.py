"""Host-side merge functions for split aggregates, registered in the host's DataFusion context.

The super-plan names them like any function; `register_merge_functions` recreates them from
their names alone, so the super-plan bytes are self-describing. They only see partial rows
(one per group per slice range), so Python-level accumulators are cheap enough.

- Variance and standard deviation: every slice range sends (n, mean, population variance);
  the host combines them with Chan, Golub and LeVeque's pairwise update, which is numerically
  stable where the textbook sum-of-squares formula cancels catastrophically.
- Average of decimals: DataFusion truncates `sum * 10^(target scale - sum scale) / count`
  toward zero; the merge does the same integer arithmetic on the merged sum and count, so the
  split answer is identical to the unsplit one.
"""

from __future__ import annotations

import decimal
import math
import re
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
from datafusion import Accumulator, SessionContext, udaf, udf

PREFIX = "quarry_"
MOMENT_KINDS = ("var_samp", "var_pop", "stddev_samp", "stddev_pop")
_AVG_DECIMAL = re.compile(r"^quarry_avg_decimal_(\d+)_(\d+)_(\d+)$")
# Python's default decimal context keeps 28 digits; Decimal128 needs 38 and the shift more.
_DECIMAL_DIGITS_MAX = 120


def moment_merge_name(kind: str) -> str:
    assert kind in MOMENT_KINDS, kind
    return f"{PREFIX}merge_{kind}"


def avg_decimal_name(sum_scale: int, precision: int, scale: int) -> str:
    assert scale >= sum_scale, "an average never has fewer decimals than its sum"
    return f"{PREFIX}avg_decimal_{sum_scale}_{precision}_{scale}"


class _MomentsMerge(Accumulator):
    """Merges (n, mean, population variance) partials into one variance or deviation."""

    kind = "var_samp"

    def __init__(self) -> None:
        self._count = 0
        self._mean = 0.0
        self._m2 = 0.0

    def update(self, counts: pa.Array, means: pa.Array, variances: pa.Array) -> None:
        count = counts.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        mean = means.fill_null(0.0).to_numpy(zero_copy_only=False).astype(np.float64)
        variance = variances.fill_null(0.0).to_numpy(zero_copy_only=False).astype(np.float64)
        self._absorb(count, mean, variance * count)

    def merge(self, states: list[pa.Array]) -> None:
        counts, means, m2s = states
        self._absorb(
            counts.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64),
            means.fill_null(0.0).to_numpy(zero_copy_only=False).astype(np.float64),
            m2s.fill_null(0.0).to_numpy(zero_copy_only=False).astype(np.float64),
        )

    def _absorb(self, count: np.ndarray, mean: np.ndarray, m2: np.ndarray) -> None:
        keep = count > 0
        count, mean, m2 = count[keep], mean[keep], m2[keep]
        if count.size == 0:
            return
        total = int(count.sum())
        # Shifting by one partial's mean keeps the result exact when all means are equal
        # (a constant column must have variance exactly 0, as DataFusion computes it).
        pivot = mean[0]
        batch_mean = pivot + float(np.sum(count * (mean - pivot))) / total
        batch_m2 = float(np.sum(m2)) + float(np.sum(count * (mean - batch_mean) ** 2))
        if self._count == 0:
            self._count, self._mean, self._m2 = total, batch_mean, batch_m2
            return
        merged = self._count + total
        delta = batch_mean - self._mean
        self._mean += delta * total / merged
        self._m2 += batch_m2 + delta * delta * self._count * total / merged
        self._count = merged

    def state(self) -> list[pa.Scalar]:
        return [
            pa.scalar(self._count, pa.int64()),
            pa.scalar(self._mean, pa.float64()),
            pa.scalar(self._m2, pa.float64()),
        ]

    def evaluate(self) -> pa.Scalar:
        m2 = max(self._m2, 0.0) if not math.isnan(self._m2) else self._m2
        sample = self.kind.endswith("_samp")
        denominator = self._count - 1 if sample else self._count
        if denominator <= 0:
            return pa.scalar(None, pa.float64())
        variance = m2 / denominator
        if self.kind.startswith("stddev"):
            variance = math.sqrt(variance) if not math.isnan(variance) else variance
        return pa.scalar(variance, pa.float64())


def _moment_accumulator(kind: str) -> type[_MomentsMerge]:
    return type(f"MomentsMerge_{kind}", (_MomentsMerge,), {"kind": kind})


def _moment_udaf(kind: str):
    return udaf(
        _moment_accumulator(kind),
        [pa.int64(), pa.float64(), pa.float64()],
        pa.float64(),
        [pa.int64(), pa.float64(), pa.float64()],
        "immutable",
        name=moment_merge_name(kind),
    )


def _avg_decimal_udf(sum_scale: int, precision: int, scale: int):
    shift = 10 ** (scale - sum_scale)
    result_type = pa.decimal128(precision, scale)

    def average(sums: pa.Array, counts: pa.Array) -> pa.Array:
        values: list[decimal.Decimal | None] = []
        with decimal.localcontext(prec=_DECIMAL_DIGITS_MAX):
            for total, count in zip(sums.to_pylist(), counts.to_pylist()):
                if total is None or not count:
                    values.append(None)
                    continue
                shifted = int(total.scaleb(sum_scale)) * shift
                quotient = abs(shifted) // count  # truncation toward zero, like DataFusion
                values.append(
                    decimal.Decimal(quotient if shifted >= 0 else -quotient).scaleb(-scale)
                )
        return pa.array(values, result_type)

    return udf(
        average,
        [pa.decimal128(38, sum_scale), pa.int64()],
        result_type,
        "immutable",
        name=avg_decimal_name(sum_scale, precision, scale),
    )


def register_merge_functions(ctx: SessionContext, names: Iterable[str]) -> None:
    """Register every quarry merge function among `names` (others are ignored)."""
    for name in sorted(set(names)):
        if not name.startswith(PREFIX):
            continue
        for kind in MOMENT_KINDS:
            if name == moment_merge_name(kind):
                ctx.register_udaf(_moment_udaf(kind))
                break
        else:
            match = _AVG_DECIMAL.match(name)
            if match is None:
                raise ValueError(f"unknown quarry merge function {name!r}")
            sum_scale, precision, scale = (int(group) for group in match.groups())
            ctx.register_udf(_avg_decimal_udf(sum_scale, precision, scale))


def moment_udaf(kind: str):
    return _moment_udaf(kind)


def avg_decimal_udf(sum_scale: int, precision: int, scale: int):
    return _avg_decimal_udf(sum_scale, precision, scale)
