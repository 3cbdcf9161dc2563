"""Inputs of the §4 kernels: bringing Arrow or numpy data into contiguous numpy arrays (the
"data transfer" half of a kernel run), and generating sample working sets for calibration.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

DATA_BYTES_MAX = 8 * 2**30

# The named inputs each kernel reads, in positional order; "rank" (Page Rank's starting vector)
# is optional.
KERNEL_INPUTS: dict[str, tuple[str, ...]] = {
    "count": ("values",),
    "vector_addition": ("a", "b"),
    "array_merge": ("left", "right"),
    "pagerank": ("matrix", "rank"),
}
OPTIONAL_INPUTS = frozenset({("pagerank", "rank")})

ArrayLike = np.ndarray | pa.Array | pa.ChunkedArray
KernelData = (
    pa.Table
    | pa.RecordBatch
    | pa.RecordBatchReader
    | Mapping[str, ArrayLike]
    | Sequence[ArrayLike]
    | np.ndarray
)


class KernelInputError(ValueError):
    """A kernel was given data it cannot run on; the message names the input."""


def _to_numpy(kernel: str, name: str, array: Any) -> np.ndarray:
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if isinstance(array, pa.Array):
        if array.null_count:
            raise KernelInputError(
                f"{kernel}: input {name!r} has {array.null_count} nulls; drop or fill them first"
            )
        if pa.types.is_fixed_size_list(array.type):
            # A matrix stored one row per list, as Page Rank's adjacency matrix is.
            width = array.type.list_size
            values = array.flatten().to_numpy(zero_copy_only=False)
            return np.ascontiguousarray(values.reshape(len(array), width))
        return np.ascontiguousarray(array.to_numpy(zero_copy_only=False))
    if isinstance(array, np.ndarray):
        return np.ascontiguousarray(array)
    raise KernelInputError(f"{kernel}: input {name!r} is a {type(array).__name__}, not an array")


def materialize(kernel: str, data: KernelData) -> dict[str, np.ndarray]:
    """The kernel's named inputs as contiguous numpy arrays.

    Tables and mappings are matched by name, falling back to column order; a bare ndarray is the
    first input. Reading a ``RecordBatchReader`` to the end is part of the transfer.
    """
    names = KERNEL_INPUTS[kernel]
    if isinstance(data, pa.RecordBatchReader):
        data = data.read_all()
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    if isinstance(data, pa.Table):
        columns = (
            {name: data.column(name) for name in names if name in data.column_names}
            if names[0] in data.column_names
            else dict(zip(names, data.columns, strict=False))
        )
    elif isinstance(data, np.ndarray):
        columns = {names[0]: data}
    elif isinstance(data, Mapping):
        columns = {name: data[name] for name in names if name in data}
    elif isinstance(data, Sequence) and not isinstance(data, (str, bytes)):
        columns = dict(zip(names, data, strict=False))
    else:
        raise KernelInputError(
            f"{kernel}: data is a {type(data).__name__}; give a pyarrow Table, RecordBatchReader, "
            "a mapping of name to array, or a sequence of arrays"
        )
    missing = [
        name for name in names if name not in columns and (kernel, name) not in OPTIONAL_INPUTS
    ]
    if missing:
        raise KernelInputError(f"{kernel}: missing input {', '.join(missing)}; it reads {names}")
    return {name: _to_numpy(kernel, name, array) for name, array in columns.items()}


class Gatherer:
    """A kernel's contiguous numpy inputs, filled batch by batch as the batches arrive.

    ``materialize`` concatenates at the end (a second pass over all the data); a reader that
    copies each batch into place as it comes does that work while it waits for the next one, as
    a drive's DMA fills memory while the flash reads on. Stored datasets name their columns, so
    inputs are matched by name only.
    """

    def __init__(self, kernel: str, schema: pa.Schema, rows: int):
        if kernel not in KERNEL_INPUTS:
            raise KernelInputError(
                f"no kernel {kernel!r}; choose one of {', '.join(KERNEL_INPUTS)}"
            )
        assert rows >= 0, rows
        self.kernel = kernel
        self.rows = rows
        self.filled = 0
        missing = [
            name
            for name in KERNEL_INPUTS[kernel]
            if name not in schema.names and (kernel, name) not in OPTIONAL_INPUTS
        ]
        if missing:
            raise KernelInputError(
                f"{kernel}: missing input column {', '.join(missing)}; the data has "
                f"{', '.join(schema.names)}"
            )
        self.arrays: dict[str, np.ndarray] = {}
        for name in KERNEL_INPUTS[kernel]:
            if name not in schema.names:
                continue
            kind = schema.field(name).type
            try:
                if pa.types.is_fixed_size_list(kind):
                    shape: tuple[int, ...] = (rows, kind.list_size)
                    dtype = np.dtype(kind.value_type.to_pandas_dtype())
                else:
                    shape, dtype = (rows,), np.dtype(kind.to_pandas_dtype())
            except NotImplementedError:
                dtype = np.dtype(object)
            if dtype.kind not in "iuf":
                raise KernelInputError(f"{kernel}: input {name!r} is {kind}, not numbers")
            self.arrays[name] = np.empty(shape, dtype=dtype)

    def add(self, batch: pa.RecordBatch) -> None:
        end = self.filled + batch.num_rows
        if end > self.rows:
            raise KernelInputError(f"{self.kernel}: more than the {self.rows} rows announced")
        for name, out in self.arrays.items():
            column = batch.column(name)
            if column.null_count:
                raise KernelInputError(
                    f"{self.kernel}: input {name!r} has {column.null_count} nulls; drop or fill "
                    "them first"
                )
            if out.ndim == 2:
                values = column.flatten().to_numpy(zero_copy_only=False)
                out[self.filled : end] = values.reshape(batch.num_rows, out.shape[1])
            else:
                out[self.filled : end] = column.to_numpy(zero_copy_only=False)
        self.filled = end

    def finish(self) -> dict[str, np.ndarray]:
        if self.filled != self.rows:
            raise KernelInputError(f"{self.kernel}: got {self.filled} rows, expected {self.rows}")
        return self.arrays


def _check_size(kernel: str, data_bytes: int) -> None:
    if kernel not in KERNEL_INPUTS:
        raise KernelInputError(f"no kernel {kernel!r}; choose one of {', '.join(KERNEL_INPUTS)}")
    if isinstance(data_bytes, bool) or not isinstance(data_bytes, int):
        raise KernelInputError(f"data_bytes must be an integer, got {data_bytes!r}")
    if not 64 <= data_bytes <= DATA_BYTES_MAX:
        raise KernelInputError(f"data_bytes must be 64 to {DATA_BYTES_MAX}, got {data_bytes}")


def make_inputs(kernel: str, data_bytes: int, *, seed: int = 0) -> dict[str, np.ndarray]:
    """A sample working set of about ``data_bytes`` bytes for ``kernel`` (int32 / float32 data)."""
    _check_size(kernel, data_bytes)
    generator = np.random.default_rng(seed)
    item_bytes = 4
    if kernel == "count":
        return {"values": generator.integers(0, 1000, data_bytes // item_bytes, dtype=np.int32)}
    if kernel == "vector_addition":
        rows = data_bytes // (2 * item_bytes)
        return {
            name: generator.integers(-(2**20), 2**20, rows, dtype=np.int32) for name in ("a", "b")
        }
    if kernel == "array_merge":
        rows = data_bytes // (2 * item_bytes)
        # Values drawn from twice the row count, so the two arrays share about a quarter of them.
        return {
            name: np.sort(generator.integers(0, 2 * rows, rows, dtype=np.int32))
            for name in ("left", "right")
        }
    pages = max(2, int((data_bytes // item_bytes) ** 0.5))
    links = (generator.random((pages, pages), dtype=np.float32) < 0.05).astype(np.float32)
    np.fill_diagonal(links, 0.0)
    # Pages without out-links link to every page, so every column sums to 1 (column-stochastic).
    links[:, links.sum(axis=0) == 0] = 1.0
    matrix = links / links.sum(axis=0)
    return {"matrix": matrix.astype(np.float32), "rank": np.full(pages, 1.0 / pages, np.float32)}


def working_set_bytes(kernel: str, data_bytes: int) -> int:
    """The bytes ``make_inputs(kernel, data_bytes)`` generates, without generating them."""
    _check_size(kernel, data_bytes)
    item_bytes = 4
    if kernel == "count":
        return data_bytes // item_bytes * item_bytes
    if kernel in ("vector_addition", "array_merge"):
        return 2 * (data_bytes // (2 * item_bytes)) * item_bytes
    pages = max(2, int((data_bytes // item_bytes) ** 0.5))
    return (pages * pages + pages) * item_bytes


def as_table(inputs: Mapping[str, np.ndarray]) -> pa.Table:
    """The inputs as one Arrow table (equal-length 1-D inputs, or a matrix as fixed-size lists)."""
    columns = {}
    for name, array in inputs.items():
        if array.ndim == 2:
            flat = pa.array(array.reshape(-1))
            columns[name] = pa.FixedSizeListArray.from_arrays(flat, array.shape[1])
        else:
            columns[name] = pa.array(array)
    lengths = {len(column) for column in columns.values()}
    if len(lengths) != 1:
        raise KernelInputError(f"inputs have different lengths {sorted(lengths)}; pass a mapping")
    return pa.table(columns)
