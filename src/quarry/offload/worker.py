"""Offloaded lines in a process of their own, inside limits they cannot escape.

The device starts one per work request (``python -m quarry.offload.worker``) with an address
space limit (``RLIMIT_AS``) and a CPU-time limit (``RLIMIT_CPU``) set before the program's code
runs; the device kills it, too, when a chunk outlives its wall-time bound. A program that
raises, loops or eats memory ends this process, never the device.

On its standard input: one JSON line (``source``: the whole program, ``lines``: the numbers of
the statements to run, ``path``, ``frame``, ``output``), then frames of a tag
byte, an 8-byte length and an Arrow IPC stream (the chunk's rows, with their source row numbers
in ``ROW_COLUMN``). On its standard output, per chunk: ``D`` and the output as Arrow IPC (the
frame's index kept), or ``E`` and the error, naming the line.
"""

from __future__ import annotations

import json
import struct
import sys
import traceback
from typing import IO, Any

import pyarrow as pa

ROW_COLUMN = "__quarry_row"
_LENGTH = struct.Struct(">Q")


def write_frame(stream: IO[bytes], tag: bytes, body: bytes) -> None:
    stream.write(tag + _LENGTH.pack(len(body)) + body)
    stream.flush()


def read_frame(stream: IO[bytes]) -> tuple[bytes, bytes] | None:
    head = stream.read(1 + _LENGTH.size)
    if len(head) < 1 + _LENGTH.size:
        return None
    (length,) = _LENGTH.unpack(head[1:])
    body = stream.read(length)
    if len(body) != length:
        raise EOFError("the frame ended early")
    return head[:1], body


def ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def run_chunk(code: Any, frame: str, output: str, rows: pa.Table, path: str) -> pa.Table:
    import pandas as pd

    numbers = rows.column(ROW_COLUMN).to_numpy()
    df = rows.drop_columns([ROW_COLUMN]).to_pandas()
    df.index = pd.Index(numbers)
    namespace: dict[str, Any] = {"__name__": "__main__", "__file__": path, frame: df}
    exec(code, namespace)
    value = namespace.get(output)
    if not isinstance(value, pd.DataFrame):
        raise TypeError(f"{output} is a {type(value).__name__}, not a DataFrame")
    return pa.Table.from_pandas(value, preserve_index=True)


def select(source: str, path: str, lines: set[int]) -> Any:
    """The program's statements that start on ``lines``, compiled with their own line numbers
    (an error names the line of the user's file)."""
    import ast

    tree = ast.parse(source, filename=path)
    tree.body = [statement for statement in tree.body if statement.lineno in lines]
    return compile(tree, path, "exec")


def main() -> None:
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    header = json.loads(stdin.readline())
    sys.argv = list(header.get("argv") or [header["path"]])
    code = select(header["source"], header["path"], set(header["lines"]))
    while (frame := read_frame(stdin)) is not None:
        _, body = frame
        try:
            rows = pa.ipc.open_stream(pa.py_buffer(body)).read_all()
            out = run_chunk(code, header["frame"], header["output"], rows, header["path"])
            write_frame(stdout, b"D", ipc(out))
        except BaseException as error:  # the program's own error, named by its line
            where = traceback.extract_tb(error.__traceback__)
            lines = [f"{f.filename}:{f.lineno}" for f in where if f.filename == header["path"]]
            place = lines[-1] if lines else header["path"]
            write_frame(stdout, b"E", f"{place}: {type(error).__name__}: {error}".encode())


if __name__ == "__main__":
    main()
