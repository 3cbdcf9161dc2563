"""Matrix Market files (10x's ``matrix.mtx``), read with every index checked.

scipy's reader takes down the whole process on some malformed files (a segmentation fault on
an entry outside the matrix, an abort when it reads from a stream; both found by fuzzing), and
ingest runs in the user's process. So quarry reads the format itself: the banner and the size
line in Python, the entries with Arrow's multithreaded CSV reader, and each index is checked
against the size line before a matrix is built. Supported: ``coordinate`` (real, integer,
pattern; general or symmetric) and ``array`` (real, integer; general), gzipped or not.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import IO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
from scipy import sparse

from quarry.genes.errors import GenesInputError

HEADER_LINE_BYTES_MAX = 4096
COMMENT_LINES_MAX = 100_000
BLOCK_BYTES = 8 << 20
INDEX_MAX = 2**31 - 1  # scipy's sparse matrices index with int32 up to here, int64 beyond

FIELDS = ("real", "double", "integer", "pattern")
SYMMETRIES = ("general", "symmetric")


def read(path: Path) -> sparse.coo_matrix | np.ndarray:
    """The matrix in ``path``: a COO matrix (coordinate) or a dense array (array)."""
    with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as stream:
        try:
            layout, field, symmetry = _banner(stream)
            shape = _size_line(stream, 3 if layout == "coordinate" else 2)
            if layout == "coordinate":
                return _coordinate(stream, shape, field, symmetry)
            return _array(stream, shape, field, symmetry)
        except (pa.ArrowException, OSError, EOFError, ValueError) as error:
            raise GenesInputError(f"{path.name}: not a valid Matrix Market file: {error}") from None


def _line(stream: IO[bytes]) -> str:
    line = stream.readline(HEADER_LINE_BYTES_MAX)
    if not line:
        raise ValueError("the file ends before its size line")
    if not line.endswith(b"\n") and len(line) == HEADER_LINE_BYTES_MAX:
        raise ValueError(f"a header line is longer than {HEADER_LINE_BYTES_MAX} bytes")
    return line.decode("ascii", errors="replace").strip()


def _banner(stream: IO[bytes]) -> tuple[str, str, str]:
    words = _line(stream).lower().split()
    if len(words) != 5 or words[0] != "%%matrixmarket" or words[1] != "matrix":
        raise ValueError("missing the '%%MatrixMarket matrix <layout> <field> <symmetry>' banner")
    layout, field, symmetry = words[2:]
    if layout not in ("coordinate", "array"):
        raise ValueError(f"layout {layout!r} is not coordinate or array")
    if field not in FIELDS:
        raise ValueError(f"field {field!r} is not one of {', '.join(FIELDS)}")
    if symmetry not in SYMMETRIES:
        raise ValueError(f"symmetry {symmetry!r} is not one of {', '.join(SYMMETRIES)}")
    if layout == "array" and (field == "pattern" or symmetry != "general"):
        raise ValueError("an array matrix must be general and hold values")
    return layout, field, symmetry


def _size_line(stream: IO[bytes], count: int) -> tuple[int, ...]:
    for _ in range(COMMENT_LINES_MAX):
        line = _line(stream)
        if line and not line.startswith("%"):
            break
    else:
        raise ValueError(f"more than {COMMENT_LINES_MAX} comment lines")
    words = line.split()
    if len(words) != count or not all(w.isdigit() for w in words):
        raise ValueError(f"size line {line[:80]!r} is not {count} non-negative integers")
    numbers = tuple(int(w) for w in words)
    if any(n > INDEX_MAX for n in numbers[:2]):
        raise ValueError(f"a dimension of {numbers[:2]} is beyond {INDEX_MAX}")
    return numbers


def _entries(stream: IO[bytes], names: list[str], types: dict[str, pa.DataType]) -> pa.Table:
    try:
        return pacsv.read_csv(
            stream,
            read_options=pacsv.ReadOptions(column_names=names, block_size=BLOCK_BYTES),
            parse_options=pacsv.ParseOptions(delimiter=" ", ignore_empty_lines=True),
            convert_options=pacsv.ConvertOptions(column_types=types),
        )
    except pa.ArrowInvalid as error:
        if "Empty CSV file" not in str(error):
            raise
        return pa.table({name: pa.array([], types[name]) for name in names})


def _coordinate(
    stream: IO[bytes], shape: tuple[int, ...], field: str, symmetry: str
) -> sparse.coo_matrix:
    rows, cols, count = shape
    names = ["i", "j"] if field == "pattern" else ["i", "j", "v"]
    table = _entries(stream, names, {"i": pa.int64(), "j": pa.int64(), "v": pa.float64()})
    if table.num_rows != count:
        raise ValueError(f"the size line promises {count} entries, the file holds {table.num_rows}")
    i, j = (_index(table.column(name), bound, name) for name, bound in (("i", rows), ("j", cols)))
    values = (
        np.ones(count) if field == "pattern" else table.column("v").to_numpy(zero_copy_only=False)
    )
    if symmetry == "symmetric":
        if rows != cols:
            raise ValueError(f"a symmetric matrix must be square, this one is {rows} x {cols}")
        off = i != j
        i, j, values = (
            np.concatenate([i, j[off]]),
            np.concatenate([j, i[off]]),
            np.concatenate([values, values[off]]),
        )
    return sparse.coo_matrix((values, (i, j)), shape=(rows, cols))


def _index(column: pa.ChunkedArray, bound: int, name: str) -> np.ndarray:
    """One-based indices in [1, bound], checked, as zero-based numpy."""
    if column.null_count:
        raise ValueError(f"an entry lacks its {name} index")
    if len(column):
        low, high = pc.min_max(column).values()
        if low.as_py() < 1 or high.as_py() > bound:
            raise ValueError(f"{name} index out of range: entries span {low}..{high}, 1..{bound}")
    return column.to_numpy(zero_copy_only=False) - 1


def _array(stream: IO[bytes], shape: tuple[int, ...], field: str, symmetry: str) -> np.ndarray:
    rows, cols = shape
    table = _entries(stream, ["v"], {"v": pa.float64()})
    if table.num_rows != rows * cols:
        raise ValueError(
            f"{rows} x {cols} needs {rows * cols} values, the file holds {table.num_rows}"
        )
    if table.column("v").null_count:
        raise ValueError("a value is missing")
    # Matrix Market stores arrays column by column.
    return table.column("v").to_numpy(zero_copy_only=False).reshape(cols, rows).T
