"""A program's values on the wire: what offloaded lines send back, as Arrow IPC.

Offloaded lines return values the host puts in the program's namespace: a run of rows (a
DataFrame, a Series, a numpy array, an Arrow table) or the partial result of a reduction (a
number, a small array, a Series). Each travels as one Arrow IPC stream whose schema metadata
says how to rebuild it. Nothing is pickled: a device's answer is data, never code the host
would run.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa

KIND = b"quarry.value"
SHAPE = b"quarry.shape"
COLUMN = "value"


class CannotTravel(TypeError):
    """A value that cannot travel (an object the program made, not data)."""


def encode(value: Any) -> bytes:
    """One value as an Arrow IPC stream."""
    table, kind, extra = _table(value)
    metadata = {**(table.schema.metadata or {}), KIND: kind.encode(), **extra}
    table = table.replace_schema_metadata(metadata)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def decode(blob: bytes) -> Any:
    table = pa.ipc.open_stream(pa.py_buffer(blob)).read_all()
    metadata = table.schema.metadata or {}
    kind = metadata.get(KIND, b"").decode()
    if kind == "table":
        return table.replace_schema_metadata(
            {k: v for k, v in metadata.items() if k not in (KIND, SHAPE)} or None
        )
    if kind in ("frame", "series"):
        frame = table.to_pandas()
        if kind == "series":
            series = frame.iloc[:, 0]
            name = json.loads(metadata[b"quarry.name"])
            series.name = name
            return series
        return frame
    column = table.column(COLUMN)
    if kind == "array":
        shape = tuple(json.loads(metadata[SHAPE]))
        return column.to_numpy(zero_copy_only=False).reshape(shape)
    if kind == "scalar":
        return _scalar(column, metadata)
    if kind == "none":
        return None
    raise CannotTravel(f"a value of unknown kind {kind!r}")


def _table(value: Any) -> tuple[pa.Table, str, dict[bytes, bytes]]:
    import pandas as pd

    if isinstance(value, pa.Table):
        return value, "table", {}
    if isinstance(value, pd.DataFrame):
        return pa.Table.from_pandas(value, preserve_index=True), "frame", {}
    if isinstance(value, pd.Series):
        frame = value.to_frame(name="__value__" if value.name is None else value.name)
        name = json.dumps(value.name if _jsonable(value.name) else str(value.name)).encode()
        return pa.Table.from_pandas(frame, preserve_index=True), "series", {b"quarry.name": name}
    if isinstance(value, np.ndarray):
        flat = pa.array(np.ascontiguousarray(value).reshape(-1))
        return pa.table({COLUMN: flat}), "array", {SHAPE: json.dumps(value.shape).encode()}
    if value is None:
        return pa.table({COLUMN: pa.nulls(0)}), "none", {}
    if isinstance(value, bool | int | float | str | np.generic):
        python = type(value.item() if isinstance(value, np.generic) else value).__name__
        array = pa.array([value.item() if isinstance(value, np.generic) else value])
        extra = {b"quarry.python": python.encode()}
        if isinstance(value, np.generic):
            extra[b"quarry.numpy"] = value.dtype.str.encode()
        return pa.table({COLUMN: array}), "scalar", extra
    raise CannotTravel(f"a {type(value).__name__} cannot come back from a device")


def _scalar(column: pa.ChunkedArray, metadata: dict[bytes, bytes]) -> Any:
    value = column[0].as_py()
    numpy_type = metadata.get(b"quarry.numpy")
    if numpy_type is not None:
        return np.dtype(numpy_type.decode()).type(value)
    return value


def _jsonable(name: Any) -> bool:
    return name is None or isinstance(name, str | int | float | bool)
