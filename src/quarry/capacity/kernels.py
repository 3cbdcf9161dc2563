"""The four analysis kernels of CSDPLAN §4 (Count, Vector Addition, Array Merge, Page Rank).

``run_kernel`` times the two halves the model needs separately: bringing the working set into
memory as numpy arrays (``transfer_s``) and computing on it with 1..n threads (``compute_s``).
It knows nothing of networking: a device runs it by name from ``KERNELS`` and adds its own
store-read time to ``transfer_s`` if it reads before calling.

Threads split the data into contiguous ranges; numpy releases the GIL inside these loops, so
the ranges run in parallel. (Page Rank's matrix-vector product may also use BLAS threads.)

Every piece of work goes through ``run`` (default: call it). A device passes its
``UnitContext.compute``, so each piece holds one of the drive's emulated cores and is stretched
by its compute factor (``quarry.capacity.device``); the kernels themselves do not know.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np

from quarry.capacity.kernel_data import KernelData, KernelInputError, materialize

THREADS_MAX = 256
PAGERANK_ITERATIONS_MAX = 1000
# Element-wise kernels work in pieces of at most this many input bytes. On a device each piece
# holds one of its emulated cores for compute_factor times its CPU time: bounded pieces keep that
# hold short (a 256 MiB Count as one piece would take a 15x-slower drive's core for seconds, and
# other requests would queue behind it), and spread a partition's work over the drive's cores.
PIECE_BYTES_MAX = 4 << 20
# Array Merge works in value ranges of at most this many input bytes, for the same reason and
# one more: a merge's cost per byte depends on how much of it fits the caches, so one merge of a
# whole partition would cost less per byte on a drive holding 1/16 of a working set than on one
# holding all of it. Bounded pieces make the cost linear in the bytes, as Eq. 7's 1/m assumes.
MERGE_PIECE_BYTES_MAX = 1 << 20

T = TypeVar("T")
Run = Callable[[Callable[[], Any]], Any]
Kernel = Callable[..., Any]  # (inputs, threads, params, run=direct) -> result


def direct(work: Callable[[], T]) -> T:
    """Run a piece of work as it is (the host's way)."""
    return work()


def _ranges(length: int, parts: int) -> list[slice]:
    bounds = np.linspace(0, length, min(parts, max(length, 1)) + 1).astype(np.int64)
    return [slice(int(lo), int(hi)) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]


def _pieces(array: np.ndarray, threads: int) -> list[slice]:
    """At least one range per thread, and none larger than PIECE_BYTES_MAX."""
    return _ranges(len(array), max(threads, math.ceil(array.nbytes / PIECE_BYTES_MAX)))


def _map(
    function: Callable[[Any], T], parts: Sequence[Any], threads: int, run: Run = direct
) -> list[T]:
    def call(part: Any) -> T:
        return run(lambda: function(part))

    if threads == 1 or len(parts) == 1:
        return [call(part) for part in parts]
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return list(pool.map(call, parts))


def count(
    inputs: Mapping[str, np.ndarray], threads: int, params: Mapping[str, Any], run: Run = direct
) -> int:
    """How many elements of ``values`` equal ``params["value"]`` (default 0)."""
    values = inputs["values"]
    target = params.get("value", 0)
    parts = _map(
        lambda part: int(np.count_nonzero(values[part] == target)),
        _pieces(values, threads),
        threads,
        run,
    )
    return sum(parts)


def vector_addition(
    inputs: Mapping[str, np.ndarray], threads: int, params: Mapping[str, Any], run: Run = direct
) -> np.ndarray:
    """Element-wise ``a + b`` into a new array (integer overflow wraps, as in C)."""
    a, b = inputs["a"], inputs["b"]
    if a.shape != b.shape:
        raise KernelInputError(f"vector_addition: a has shape {a.shape}, b has {b.shape}")
    out = np.empty(a.shape, dtype=np.result_type(a, b))

    def add(part: slice) -> None:
        np.add(a[part], b[part], out=out[part])

    _map(add, _pieces(a, threads), threads, run)
    return out


def _merge_unique(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    merged = np.concatenate([left, right])
    # A stable sort of two sorted runs is a linear merge (timsort finds the runs).
    merged.sort(kind="stable")
    if len(merged) < 2:
        return merged
    keep = np.empty(len(merged), dtype=bool)
    keep[0] = True
    np.not_equal(merged[1:], merged[:-1], out=keep[1:])
    return merged[keep]


def _value_cuts(left: np.ndarray, right: np.ndarray, parts: int) -> tuple[np.ndarray, np.ndarray]:
    splitters = np.unique(left[np.linspace(0, len(left) - 1, parts + 1).astype(np.int64)[1:-1]])
    left_cuts = np.concatenate([[0], np.searchsorted(left, splitters), [len(left)]])
    right_cuts = np.concatenate([[0], np.searchsorted(right, splitters), [len(right)]])
    return left_cuts, right_cuts


def array_merge(
    inputs: Mapping[str, np.ndarray], threads: int, params: Mapping[str, Any], run: Run = direct
) -> np.ndarray:
    """Merge two sorted arrays into one sorted array without duplicates, in value ranges of at
    most MERGE_PIECE_BYTES_MAX input bytes (at least one per thread)."""
    left, right = inputs["left"], inputs["right"]
    parts = max(threads, math.ceil((left.nbytes + right.nbytes) / MERGE_PIECE_BYTES_MAX))
    if parts == 1 or len(left) < parts:
        return run(lambda: _merge_unique(left, right))
    # Split by value, not by position, so the pieces are disjoint and concatenate in order.
    left_cuts, right_cuts = run(lambda: _value_cuts(left, right, parts))

    def merge(index: int) -> np.ndarray:
        return _merge_unique(
            left[left_cuts[index] : left_cuts[index + 1]],
            right[right_cuts[index] : right_cuts[index + 1]],
        )

    pieces = _map(merge, range(len(left_cuts) - 1), threads, run)
    return run(lambda: np.concatenate(pieces))


def pagerank(
    inputs: Mapping[str, np.ndarray], threads: int, params: Mapping[str, Any], run: Run = direct
) -> np.ndarray:
    """Power iteration r <- d * M r + (1 - d) / n over a column-stochastic matrix M."""
    matrix = inputs["matrix"]
    pages = matrix.shape[0]
    if matrix.ndim != 2 or matrix.shape[1] != pages:
        raise KernelInputError(f"pagerank: matrix must be square, got shape {matrix.shape}")
    rank = inputs.get("rank")
    rank = np.full(pages, 1.0 / pages, matrix.dtype) if rank is None else rank.astype(matrix.dtype)
    damping = float(params.get("damping", 0.85))
    iterations = int(params.get("iterations", 20))
    tolerance = float(params.get("tolerance", 0.0))
    if not 0 < damping < 1 or not 1 <= iterations <= PAGERANK_ITERATIONS_MAX:
        raise KernelInputError(
            f"pagerank: damping must be in (0, 1) and iterations in 1..{PAGERANK_ITERATIONS_MAX}, "
            f"got {damping}, {iterations}"
        )
    teleport = (1.0 - damping) / pages
    if threads == 1:
        # One hold of the core for all iterations, as a drive's core runs a loop it owns: the
        # matrix stays warm from one iteration to the next, as on the host. Holding it per
        # iteration would leave the core idle between them (the emulated drive's stretch) and
        # every iteration would start cold: the drive would pay 1.5 to 2 times the host's cost
        # per byte, more for large matrices than small, which no drive does.
        return run(
            lambda: _power_iterations(matrix, rank, damping, teleport, iterations, tolerance)
        )
    ranges = _ranges(pages, threads)
    for _ in range(iterations):
        following = np.empty_like(rank)

        def step(part: slice, current: np.ndarray = rank, out: np.ndarray = following) -> None:
            out[part] = damping * (matrix[part] @ current) + teleport

        _map(step, ranges, threads, run)
        previous, rank = rank, following
        # Only a tolerance needs the change; without one, every iteration is one piece of work
        # per thread (on a drive, one hold of a core per iteration instead of two).
        if tolerance > 0 and run(lambda a=rank, b=previous: float(np.abs(a - b).sum())) < tolerance:
            break
    return rank


def _power_iterations(
    matrix: np.ndarray,
    rank: np.ndarray,
    damping: float,
    teleport: float,
    iterations: int,
    tolerance: float,
) -> np.ndarray:
    """Page Rank's power iterations on one thread, stopping early once within ``tolerance``."""
    for _ in range(iterations):
        previous, rank = rank, damping * (matrix @ rank) + teleport
        if tolerance > 0 and float(np.abs(rank - previous).sum()) < tolerance:
            break
    return rank.astype(matrix.dtype, copy=False)


KERNELS: dict[str, Kernel] = {
    "count": count,
    "vector_addition": vector_addition,
    "array_merge": array_merge,
    "pagerank": pagerank,
}


def check_preconditions(name: str, inputs: Mapping[str, np.ndarray]) -> None:
    """Inputs a kernel cannot run on correctly (unsorted merge inputs); checked untimed."""
    if name == "array_merge":
        for side in ("left", "right"):
            values = inputs[side]
            if values.ndim != 1 or (len(values) > 1 and bool(np.any(values[1:] < values[:-1]))):
                raise KernelInputError(f"array_merge: {side!r} must be a sorted 1-D array")


def check_kernel(name: str, threads: int) -> None:
    if name not in KERNELS:
        raise KernelInputError(f"no kernel {name!r}; choose one of {', '.join(KERNELS)}")
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= THREADS_MAX:
        raise KernelInputError(
            f"threads must be an integer from 1 to {THREADS_MAX}, got {threads!r}"
        )


def run_kernel(
    name: str,
    data: KernelData,
    threads: int = 1,
    params: Mapping[str, Any] | None = None,
    *,
    run: Run = direct,
) -> dict[str, Any]:
    """Run kernel ``name`` on ``data`` with ``threads`` threads.

    Returns ``kernel``, ``threads``, ``bytes`` (input bytes in memory), ``transfer_s`` (time to
    bring the inputs into contiguous numpy arrays), ``compute_s`` and ``result``. ``run`` wraps
    every piece of the computation (a device passes its ``UnitContext.compute``).
    """
    check_kernel(name, threads)
    started = time.perf_counter()
    inputs = materialize(name, data)
    transfer_s = time.perf_counter() - started
    # Checked outside both timers: it is validation, neither transfer nor the kernel's work.
    check_preconditions(name, inputs)
    started = time.perf_counter()
    result = KERNELS[name](inputs, threads, params or {}, run)
    compute_s = time.perf_counter() - started
    return {
        "kernel": name,
        "threads": threads,
        "bytes": int(sum(array.nbytes for array in inputs.values())),
        "transfer_s": transfer_s,
        "compute_s": compute_s,
        "result": result,
    }
