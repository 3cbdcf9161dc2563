"""Each line's time and output size, fitted to one of five curves and extrapolated (§III.A).

From the runs at four scales (2^-10 .. 2^-7 of the rows) a quantity is fitted as ``a·g(n) + b``
(a, b ≥ 0) for g in O(1), O(n), O(n log n), O(n²), O(n³); the closest fit wins, the simpler
curve when two fit about as well (four noisy points cannot tell n from n log n, and guessing
the steeper one would extrapolate a small error into a large one).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

CURVES: dict[str, Callable[[float], float]] = {
    "O(1)": lambda n: 1.0,
    "O(n)": lambda n: n,
    "O(n log n)": lambda n: n * math.log2(max(n, 2.0)),
    "O(n^2)": lambda n: n * n,
    "O(n^3)": lambda n: n**3,
}
SIMPLER_WITHIN = 1.25  # a simpler curve wins unless a steeper one's error is this much smaller
LINEAR = ("O(1)", "O(n)")
# the growth between the two largest samples a curve needs (as an exponent of n): caches make
# small samples grow faster than rows, then flatten; only growth that persists is extrapolated
EXPONENT_MIN = {
    "O(1)": -math.inf,
    "O(n)": -math.inf,
    "O(n log n)": 1.02,
    "O(n^2)": 1.5,
    "O(n^3)": 2.4,
}


@dataclass(frozen=True)
class Fit:
    curve: str
    a: float
    b: float
    error: float  # relative root-mean-square error over the samples

    def at(self, n: float) -> float:
        return self.a * CURVES[self.curve](n) + self.b


def fit(
    sizes: Sequence[float],
    values: Sequence[float],
    floor: float = 0.0,
    curves: Sequence[str] = tuple(CURVES),
) -> Fit:
    """The curve through ``values`` measured at ``sizes``. Values all below ``floor`` are too
    small to show a curve's bend (a timer's noise at microseconds): only O(1) and O(n) are
    tried for them, so a fluke is not extrapolated as n² or n³."""
    assert len(sizes) == len(values) and sizes, "one value per size"
    n = np.asarray(sizes, dtype=float)
    y = np.asarray(values, dtype=float)
    scale = float(np.sqrt(np.mean(y * y))) or 1.0
    grown = _exponent(n, y)
    names = LINEAR if float(y.max()) < floor else tuple(CURVES)
    names = tuple(n for n in names if grown >= EXPONENT_MIN[n] and n in curves) or ("O(n)",)
    fits = [_one(name, n, y, scale) for name in names]
    best = min(f.error for f in fits)
    for candidate in fits:  # in order of steepness: the simplest that fits about as well
        if candidate.error <= best * SIMPLER_WITHIN + 1e-12:
            return candidate
    raise AssertionError("unreachable")


def _exponent(n: np.ndarray, y: np.ndarray) -> float:
    """How fast the value grew between the two largest samples, as a power of the rows."""
    order = np.argsort(n)
    (n1, n2), (y1, y2) = n[order][-2:], y[order][-2:]
    if n2 <= n1 or y1 <= 0 or y2 <= 0:
        return math.inf if y2 > 0 >= y1 else 0.0
    return float(math.log(y2 / y1) / math.log(n2 / n1))


def _one(name: str, n: np.ndarray, y: np.ndarray, scale: float) -> Fit:
    g = np.array([CURVES[name](v) for v in n])
    if name == "O(1)":
        a, b = 0.0, float(max(0.0, y.mean()))
    else:
        design = np.column_stack([g, np.ones_like(g)])
        (a, b), *_ = np.linalg.lstsq(design, y, rcond=None)
        if b < 0:  # through the origin
            a, b = float(max(0.0, (g @ y) / (g @ g))), 0.0
        if a < 0:
            a, b = 0.0, float(max(0.0, y.mean()))
    predicted = a * g + b
    error = float(np.sqrt(np.mean((predicted - y) ** 2))) / scale
    return Fit(name, float(a), float(b), error)
