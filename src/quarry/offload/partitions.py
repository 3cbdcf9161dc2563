"""Which lines may run per partition: the check of §III.B on the samples.

A line runs on the devices only if, run on each partition's rows, its values concatenated are
what it gives on the whole input. That is checked on the largest sample: the program runs once
on the whole sample and once on each of ``PIECES`` row ranges of it (the pieces keep the
whole's row labels), and a line passes when every value it binds is, on the whole, the pieces'
values concatenated (frames, series, arrays, Arrow tables), or the same in every piece and in
the whole (an import, a constant, a function). A filter, a new column, a row-wise function
pass; a sum, a groupby, a sort, ``head`` do not (they are reductions, or look across rows).
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from quarry.offload import profile, reductions
from quarry.offload.program import Line, Program
from quarry.offload.reads import Mounts, ReadLog, Reads
from quarry.offload.reductions import Reduction

PIECES = 3


@dataclass(frozen=True)
class Check:
    passing: set[int]  # line numbers whose values, per piece, concatenate to the whole's
    whole: dict[int, dict[str, Any]]  # per line, the values it bound on the whole sample
    reads: list[ReadLog]  # the stored reads the program made, by line
    reductions: dict[int, Reduction]  # lines that pass as partials combined on the host
    # per line, the names it binds that are the same in every piece (a constant, a function):
    # any one device's value is the value
    same: dict[int, frozenset[str]]


def partitionable(
    program: Program, cluster: Any, mounts: Mounts, argv: Sequence[str], every: int
) -> Check:
    """Which lines give, per piece and concatenated, what they give on the whole sample."""
    whole_reads = Reads(cluster, mounts, every=every, piece=(0, 1))
    whole = _values(program, whole_reads, argv)
    pieces = [
        _values(program, Reads(cluster, mounts, every=every, piece=(k, PIECES)), argv)
        for k in range(PIECES)
    ]
    passing, reduced, same = set(), {}, {}
    for line in program.lines:
        if line.pinned or line.number not in whole or any(line.number not in p for p in pieces):
            continue
        bound = whole[line.number]
        how = {
            name: _splits(bound[name], [p[line.number].get(name) for p in pieces]) for name in bound
        }
        if all(how.values()):
            passing.add(line.number)
            same[line.number] = frozenset(n for n, h in how.items() if h == "same")
            continue
        reduction = _reduces(program, line, whole, pieces)
        if reduction is not None:
            passing.add(line.number)
            reduced[line.number] = reduction
    return Check(passing, whole, whole_reads.log, reduced, same)


def _reduces(
    program: Program,
    line: Line,
    whole: dict[int, dict[str, Any]],
    pieces: list[dict[int, dict[str, Any]]],
) -> Reduction | None:
    """The line's reduction, when its pieces' partials combine to the whole's value."""
    statement = ast.parse(line.text).body[0] if line.text else None
    reduction = reductions.recognise(statement) if statement is not None else None
    if reduction is None:
        return None
    try:
        parts = [eval(reduction.partial, _before(program, line, piece)) for piece in pieces]
        combined = reduction.combine(parts)
        return reduction if _close(whole[line.number][reduction.target], combined) else None
    except Exception:  # a partial that does not run on a piece: not this reduction
        return None


def _before(program: Program, line: Line, values: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """A piece's namespace just before ``line``: what the lines before it bound, in order."""
    namespace: dict[str, Any] = {reductions.HELPERS: reductions}
    for earlier in program.lines:
        if earlier.number == line.number:
            break
        namespace.update(values.get(earlier.number, {}))
    return namespace


def _close(whole: Any, combined: Any) -> bool:
    """The same value, floating-point sums allowed their rounding."""
    import numpy as np
    import pandas as pd

    try:
        if isinstance(whole, pd.DataFrame | pd.Series):
            assert type(whole) is type(combined)
            check = (
                pd.testing.assert_frame_equal
                if isinstance(whole, pd.DataFrame)
                else pd.testing.assert_series_equal
            )
            check(combined, whole, check_exact=False, rtol=1e-9, atol=1e-12)
            return True
        if isinstance(whole, np.ndarray):
            return (
                isinstance(combined, np.ndarray)
                and combined.shape == whole.shape
                and combined.dtype.kind == whole.dtype.kind
                and bool(np.allclose(combined, whole, rtol=1e-9, atol=1e-12, equal_nan=True))
            )
        if isinstance(whole, bool | int | np.integer):
            return bool(whole == combined)
        return bool(np.isclose(combined, whole, rtol=1e-9, atol=1e-12, equal_nan=True))
    except (AssertionError, TypeError, ValueError):
        return False


def _values(program: Program, reads: Reads, argv: Sequence[str]) -> dict[int, dict[str, Any]]:
    return profile.run(program, reads, argv, quiet=True, tolerate=True, keep=True).values or {}


def _splits(whole: Any, parts: list[Any]) -> str | None:
    """``same``: every piece has the whole's value; ``rows``: the pieces' values concatenated
    are the whole's (floats to their last bits' rounding: a matrix product may sum in another
    order on fewer rows); None: neither."""
    try:
        if all(_same(whole, part) for part in parts):
            return "same"
        joined = _concat(parts)
        return "rows" if joined is not None and _same(whole, joined, rounding=True) else None
    except Exception:  # values that do not compare or concatenate: not per-partition work
        return None


def _concat(parts: list[Any]) -> Any:
    first = parts[0]
    module = type(first).__module__.split(".")[0]
    if module == "pandas" and hasattr(first, "index"):
        import pandas as pd

        return pd.concat(parts)
    if module == "numpy" and getattr(first, "ndim", 0) >= 1:
        import numpy as np

        return np.concatenate(parts)
    if module == "pyarrow" and hasattr(first, "num_rows"):
        import pyarrow as pa

        return pa.concat_tables(parts)
    return None


def _same(left: Any, right: Any, rounding: bool = False) -> bool:
    if left is right:
        return True
    module = type(left).__module__.split(".")[0]
    if module == "pandas" and hasattr(left, "equals"):
        return type(left) is type(right) and bool(left.equals(right)) and _labels(left, right)
    if module == "numpy":
        import numpy as np

        if not isinstance(right, np.ndarray) or left.shape != right.shape:
            return False
        if rounding and left.dtype.kind == "f" and right.dtype == left.dtype:
            return bool(np.allclose(left, right, rtol=1e-12, atol=0.0, equal_nan=True))
        return bool(np.array_equal(left, right))
    if module == "pyarrow" and hasattr(left, "equals"):
        return bool(left.equals(right))
    if callable(left) or type(left).__name__ == "module":
        return type(left) is type(right) and getattr(left, "__name__", None) == getattr(
            right, "__name__", None
        )
    result = left == right
    return result if isinstance(result, bool) else False


def _labels(left: Any, right: Any) -> bool:
    return bool(left.index.equals(right.index))
