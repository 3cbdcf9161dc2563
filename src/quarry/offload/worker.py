"""Offloaded lines in a process of their own, inside limits they cannot escape.

A device (or the host, completing pushed-back slices) starts one per work request
(``python -m quarry.offload.worker``) with an address space limit (``RLIMIT_AS``) and a CPU-time
limit (``RLIMIT_CPU``) set before the program's code runs; the device kills it, too, when a
chunk outlives its wall-time bound. A program that raises, loops or eats memory ends this
process, never the device.

On its standard input: one JSON line (``Header``), a ``V`` frame (a tag byte, an 8-byte length,
a body) with the values of earlier lines the host sent (pickled; empty when none: only an
admin may send code here at all), then ``D`` frames, each an Arrow IPC stream of one slice's
rows, with their source row numbers in ``ROW_COLUMN``.
The slice is cut into runs of consecutive source rows; each run is the program's frame on its
own, the lines run over it in a fresh namespace, and every value the host needs comes back as
one row of ``OUTPUT_SCHEMA``: its name, the run's first source row, the part's number (a
reduction gives several) and the value (``values.py``). On its standard output, per slice:
``D`` and those rows as Arrow IPC, or ``E`` and the error, naming the line of the user's file.
"""

from __future__ import annotations

import ast
import contextlib
import json
import pickle
import struct
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import IO, Any

import numpy as np
import pyarrow as pa

ROW_COLUMN = "__quarry_row"
PART_PREFIX = "__quarry_part_"
CPU_S = b"quarry.cpu_s"  # in a reply's schema: the worker's CPU seconds for it
OUTPUT_SCHEMA = pa.schema(
    [
        pa.field("name", pa.string(), nullable=False),
        pa.field("first", pa.int64(), nullable=False),  # the run's first source row
        pa.field("part", pa.int32(), nullable=False),
        pa.field("value", pa.large_binary(), nullable=False),
    ]
)
_LENGTH = struct.Struct(">Q")


@dataclass(frozen=True)
class Header:
    source: str  # the whole program
    path: str
    frame: str  # the name the read binds
    reader: str  # "pandas": the frame is a DataFrame indexed by source row; "arrow": a Table
    lines: list[int]  # statements run as written (imports, needed lines, per-row lines)
    partials: dict[str, str] = field(default_factory=dict)  # line -> reduction's partial
    targets: dict[str, str] = field(default_factory=dict)  # line -> the name it binds
    outputs: list[str] = field(default_factory=list)  # row values the host needs
    argv: list[str] = field(default_factory=list)

    def to_line(self) -> bytes:
        return json.dumps(asdict(self)).encode() + b"\n"


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


# CPython 3.11's parser keeps its recursion depth where two threads parsing at once trip over
# each other ("SystemError: AST constructor recursion depth mismatch", python/cpython#106905):
# the host completes several streams' handed-back slices at once, each unit compiling the
# program, so parsing and compiling take turns.
_COMPILING = threading.Lock()


def compile_steps(header: Header) -> Any:
    """The statements to run, in the program's order, compiled with their own line numbers (an
    error names the line of the user's file); a reduction's line binds its partial instead."""
    with _COMPILING:
        return _compiled(header)


def _compiled(header: Header) -> Any:
    tree = ast.parse(header.source, filename=header.path)
    wanted = set(header.lines) | {int(n) for n in header.partials}
    body: list[ast.stmt] = []
    for statement in tree.body:
        if statement.lineno not in wanted:
            continue
        partial = header.partials.get(str(statement.lineno))
        if partial is None:
            body.append(statement)
            continue
        target = PART_PREFIX + header.targets[str(statement.lineno)]
        value = ast.parse(partial, mode="eval").body
        ast.increment_lineno(value, statement.lineno - 1)
        assign = ast.Assign(targets=[ast.Name(target, ast.Store())], value=value)
        body.append(ast.fix_missing_locations(ast.copy_location(assign, statement)))
    return compile(ast.Module(body=body, type_ignores=[]), header.path, "exec")


def runs(rows: pa.Table) -> Iterator[tuple[int, pa.Table]]:
    """The slice's runs of consecutive source rows: (first source row, its rows)."""
    numbers = rows.column(ROW_COLUMN).to_numpy()
    if len(numbers) == 0:
        return
    breaks = np.flatnonzero(np.diff(numbers) != 1) + 1
    starts = [0, *breaks.tolist()]
    ends = [*breaks.tolist(), len(numbers)]
    for start, end in zip(starts, ends):
        yield int(numbers[start]), rows.slice(start, end - start)


def run_slice(
    code: Any, header: Header, rows: pa.Table, shipped: dict[str, Any] | None = None
) -> pa.Table:
    """Every run of the slice through the lines: the values the host needs, as rows."""
    from quarry.offload import reductions, values

    out: dict[str, list] = {name: [] for name in OUTPUT_SCHEMA.names}

    def add(name: str, first: int, part: int, value: Any) -> None:
        for column, item in zip(OUTPUT_SCHEMA.names, (name, first, part, values.encode(value))):
            out[column].append(item)

    for first, run in runs(rows):
        namespace: dict[str, Any] = {
            "__name__": "__main__",
            "__file__": header.path,
            reductions.HELPERS: reductions,
            **(shipped or {}),
            header.frame: _frame(run, header.reader),
        }
        exec(code, namespace)
        for name in header.outputs:
            add(name, first, 0, namespace[name])
        for target in header.targets.values():
            for part, value in enumerate(namespace[PART_PREFIX + target]):
                add(target, first, part, value)
    return pa.table(out, schema=OUTPUT_SCHEMA)


def _frame(run: pa.Table, reader: str) -> Any:
    table = run.drop_columns([ROW_COLUMN])
    if reader == "arrow":
        return table
    import pandas as pd

    frame = table.to_pandas()
    frame.index = pd.Index(run.column(ROW_COLUMN).to_numpy())
    return frame


class InProcess:
    """The same lines run in the calling process (the host completing pushed-back slices)."""

    def __init__(self, header: Header, shipped: bytes):
        self.header = header
        self.code = compile_steps(header)
        self.shipped = pickle.loads(shipped) if shipped else {}

    def run(self, rows: pa.Table) -> pa.Table:
        with _argv(self.header):
            try:
                return run_slice(self.code, self.header, rows, self.shipped)
            except Exception as error:
                raise LinesFailed(_where(error, self.header.path)) from None


class LinesFailed(Exception):
    """A line raised: where (the user's file and line), and what."""


def _where(error: BaseException, path: str) -> str:
    where = traceback.extract_tb(error.__traceback__)
    lines = [f"{f.filename}:{f.lineno}" for f in where if f.filename == path]
    return f"{lines[-1] if lines else path}: {type(error).__name__}: {error}"


@contextlib.contextmanager
def _argv(header: Header) -> Iterator[None]:
    saved = sys.argv
    sys.argv = list(header.argv or [header.path])
    try:
        yield
    finally:
        sys.argv = saved


def main() -> None:
    import pandas  # noqa: F401  (started ahead of its work: the imports are done when it comes)

    from quarry.offload import reductions, values  # noqa: F401

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    line = stdin.readline()
    if not line:  # its device went away before giving it work
        return
    header = Header(**json.loads(line))
    sys.argv = list(header.argv or [header.path])
    code = compile_steps(header)
    sent = read_frame(stdin)
    shipped = pickle.loads(sent[1]) if sent is not None and sent[1] else {}
    while (frame := read_frame(stdin)) is not None:
        _, body = frame
        try:
            started = time.process_time()
            rows = pa.ipc.open_stream(pa.py_buffer(body)).read_all()
            out = run_slice(code, header, rows, shipped)
            cpu = str(time.process_time() - started).encode()  # what the drive is charged
            write_frame(stdout, b"D", ipc(out.replace_schema_metadata({CPU_S: cpu})))
        except BaseException as error:  # the program's own error, named by its line
            write_frame(stdout, b"E", _where(error, header.path).encode())


if __name__ == "__main__":
    main()
