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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from quarry.offload import profile
from quarry.offload.program import Program
from quarry.offload.reads import Mounts, ReadLog, Reads

PIECES = 3


@dataclass(frozen=True)
class Check:
    passing: set[int]  # line numbers whose values, per piece, concatenate to the whole's
    whole: dict[int, dict[str, Any]]  # per line, the values it bound on the whole sample
    reads: list[ReadLog]  # the stored reads the program made, by line


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
    passing = set()
    for line in program.lines:
        if line.pinned or line.number not in whole or any(line.number not in p for p in pieces):
            continue
        bound = whole[line.number]
        if all(
            _concatenates(bound[name], [p[line.number].get(name) for p in pieces]) for name in bound
        ):
            passing.add(line.number)
    return Check(passing, whole, whole_reads.log)


def _values(program: Program, reads: Reads, argv: Sequence[str]) -> dict[int, dict[str, Any]]:
    return profile.run(program, reads, argv, quiet=True, tolerate=True, keep=True).values or {}


def _concatenates(whole: Any, parts: list[Any]) -> bool:
    try:
        if all(_same(whole, part) for part in parts):
            return True  # replicated: every piece has it whole
        joined = _concat(parts)
        return joined is not None and _same(whole, joined)
    except Exception:  # values that do not compare or concatenate: not per-partition work
        return False


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


def _same(left: Any, right: Any) -> bool:
    if left is right:
        return True
    module = type(left).__module__.split(".")[0]
    if module == "pandas" and hasattr(left, "equals"):
        return type(left) is type(right) and bool(left.equals(right)) and _labels(left, right)
    if module == "numpy":
        import numpy as np

        return isinstance(right, np.ndarray) and np.array_equal(left, right)
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
