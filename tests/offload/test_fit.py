"""Each line's cost fitted to one of five curves: the generating curve comes back, and the
simpler one wins when the samples cannot tell them apart."""

from __future__ import annotations

import math

import pytest

from quarry.offload.fit import fit

SIZES = [2_000, 4_000, 8_000, 16_000]  # four scales, each twice the last (2^-10 .. 2^-7)


@pytest.mark.parametrize(
    ("curve", "function"),
    [
        ("O(1)", lambda n: 0.004),
        ("O(n)", lambda n: 3e-7 * n + 0.001),
        ("O(n^2)", lambda n: 2e-10 * n * n),
        ("O(n^3)", lambda n: 1e-14 * n**3 + 0.002),
    ],
)
def test_the_generating_curve_comes_back_and_extrapolates(curve, function):
    found = fit(SIZES, [function(n) for n in SIZES])
    assert found.curve == curve
    full = 2_048_000
    assert found.at(full) == pytest.approx(function(full), rel=1e-6)


def test_n_log_n_is_told_from_n_when_the_data_says_so():
    sizes = [1_000, 10_000, 100_000, 1_000_000]
    found = fit(sizes, [5e-8 * n * math.log2(n) for n in sizes])
    assert found.curve == "O(n log n)"


def test_noise_prefers_the_simpler_curve():
    values = [0.0101, 0.0099, 0.0102, 0.0098]  # flat, with timer noise
    assert fit(SIZES, values).curve == "O(1)"


def test_a_fit_never_predicts_negative_cost():
    found = fit(SIZES, [0.004, 0.003, 0.002, 0.001])  # shrinking: noise, not a real trend
    assert found.at(10**7) >= 0


def test_growth_that_flattens_at_the_largest_samples_is_not_extrapolated_as_n_squared():
    sizes = [8_000, 16_000, 32_000, 64_000]
    values = [0.001, 0.003, 0.007, 0.014]  # caches: fast when small, then per row
    found = fit(sizes, values)
    assert found.curve == "O(n)"
    assert found.at(2_000_000) == pytest.approx(0.44, rel=0.15)
