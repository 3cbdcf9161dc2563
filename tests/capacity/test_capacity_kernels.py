"""The four §4 kernels: right answers with any thread count, times reported separately."""

import numpy as np
import pyarrow as pa
import pytest

from quarry.capacity.kernel_data import KernelInputError, as_table, make_inputs
from quarry.capacity.kernels import KERNELS, MERGE_PIECE_BYTES_MAX, run_kernel

THREADS = (1, 2, 3, 8)


def test_registry_names_the_four_kernels() -> None:
    assert set(KERNELS) == {"count", "vector_addition", "array_merge", "pagerank"}


@pytest.mark.parametrize("threads", THREADS)
def test_count(threads: int) -> None:
    values = np.array([0, 3, 0, 7, 3, 3, 0], dtype=np.int32)
    assert run_kernel("count", {"values": values}, threads, {"value": 3})["result"] == 3
    assert run_kernel("count", [values], threads)["result"] == 3


@pytest.mark.parametrize("threads", THREADS)
def test_vector_addition(threads: int) -> None:
    inputs = make_inputs("vector_addition", 80_000, seed=1)
    result = run_kernel("vector_addition", inputs, threads)["result"]
    np.testing.assert_array_equal(result, inputs["a"] + inputs["b"])


@pytest.mark.parametrize("threads", THREADS)
def test_array_merge_removes_duplicates_and_keeps_order(threads: int) -> None:
    inputs = make_inputs("array_merge", 80_000, seed=2)
    result = run_kernel("array_merge", inputs, threads)["result"]
    np.testing.assert_array_equal(result, np.union1d(inputs["left"], inputs["right"]))
    tiny = {"left": np.array([1, 1, 2]), "right": np.array([], dtype=np.int64)}
    np.testing.assert_array_equal(run_kernel("array_merge", tiny, threads)["result"], [1, 2])


@pytest.mark.parametrize("threads", THREADS)
def test_array_merge_in_bounded_value_ranges_is_still_one_merge(threads: int) -> None:
    """Over MERGE_PIECE_BYTES_MAX the merge runs per value range: each piece in its own `run`."""
    inputs = make_inputs("array_merge", 5 * MERGE_PIECE_BYTES_MAX, seed=4)
    pieces = []

    def run(work):
        pieces.append(1)
        return work()

    result = run_kernel("array_merge", inputs, threads, run=run)["result"]
    np.testing.assert_array_equal(result, np.union1d(inputs["left"], inputs["right"]))
    assert len(pieces) >= 5 + 2  # five or more ranges, the cuts and the concatenation


@pytest.mark.parametrize("threads", THREADS)
def test_pagerank_matches_a_dense_power_iteration(threads: int) -> None:
    inputs = make_inputs("pagerank", 40_000, seed=3)
    report = run_kernel("pagerank", inputs, threads, {"iterations": 30})
    matrix, rank = inputs["matrix"].astype(np.float64), inputs["rank"].astype(np.float64)
    for _ in range(30):
        rank = 0.85 * matrix @ rank + 0.15 / len(rank)
    np.testing.assert_allclose(report["result"], rank, rtol=1e-4)
    assert report["result"].sum() == pytest.approx(1.0, rel=1e-4)


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_arrow_tables_and_readers_give_the_same_answer_as_numpy(kernel: str) -> None:
    inputs = make_inputs(kernel, 4_000, seed=4)
    expected = run_kernel(kernel, inputs, 2)["result"]
    table = as_table(inputs)
    for data in (table, pa.RecordBatchReader.from_batches(table.schema, table.to_batches())):
        report = run_kernel(kernel, data, 2)
        np.testing.assert_array_equal(np.asarray(report["result"]), np.asarray(expected))
        assert set(report) >= {"compute_s", "transfer_s", "bytes", "result"}
        assert report["bytes"] == sum(array.nbytes for array in inputs.values())
        assert report["compute_s"] >= 0 and report["transfer_s"] >= 0


def test_errors_name_the_problem() -> None:
    with pytest.raises(KernelInputError, match="no kernel 'sort'"):
        run_kernel("sort", {}, 1)
    with pytest.raises(KernelInputError, match="threads"):
        run_kernel("count", {"values": np.zeros(4)}, 0)
    with pytest.raises(KernelInputError, match="missing input b"):
        run_kernel("vector_addition", {"a": np.zeros(4)}, 1)
    with pytest.raises(KernelInputError, match="'right' must be a sorted"):
        run_kernel("array_merge", {"left": np.arange(3), "right": np.array([3, 1])}, 1)
    with pytest.raises(KernelInputError, match="nulls"):
        run_kernel("count", pa.table({"values": pa.array([1, None])}), 1)
    with pytest.raises(KernelInputError, match="square"):
        run_kernel("pagerank", {"matrix": np.zeros((2, 3), dtype=np.float32)}, 1)
