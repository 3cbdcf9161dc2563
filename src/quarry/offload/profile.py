"""One line-level run of a program: every line timed, its data access apart, its bytes counted.

A line's inputs are the values of earlier lines it reads (their bytes would cross the link if it
ran elsewhere than they were made) plus what it reads from storage; its outputs are the values
it binds. Sizes are the bytes of the values' buffers (pandas, Arrow, numpy) or Python's own
size for anything else.
"""

from __future__ import annotations

import contextlib
import io
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from quarry.errors import QuarryError
from quarry.offload.program import Line, Program
from quarry.offload.reads import Access, Reads


class ProgramFailed(QuarryError):
    """The program raised: the line, and what it raised."""

    code = "program_failed"


@dataclass(frozen=True)
class LineRun:
    line: Line
    compute_s: float  # the line's time less its data access
    access: Access  # what it read from storage
    in_bytes: int  # earlier lines' values it read
    out_bytes: int  # the values it bound


@dataclass(frozen=True)
class Run:
    lines: tuple[LineRun, ...]  # the lines that ran, in order
    rows_read: int  # rows of stored datasets the program read
    namespace: dict[str, Any]
    failed: str | None = None  # a sample run that raised: where, and what
    # with ``keep``: per line, copies of the values it bound, as they were right after it
    values: dict[int, dict[str, Any]] | None = None


def run(
    program: Program,
    reads: Reads,
    argv: Sequence[str] = (),
    quiet: bool = False,
    tolerate: bool = False,
    keep: bool = False,
    namespace: dict[str, Any] | None = None,
) -> Run:
    """Every line in order, in one namespace, as ``python SCRIPT argv`` would run them.
    ``tolerate``: a line that raises ends the run (a sample may be too small for the program:
    ``df.iloc[12345]``) and the run says where, instead of raising ``ProgramFailed``."""
    if namespace is None:  # else: going on where an earlier part of the program left off
        namespace = {"__name__": "__main__", "__file__": program.path}
    made: set[str] = set()
    runs = []
    values: dict[int, dict[str, Any]] | None = {} if keep else None
    with _argv([program.path, *argv]), reads.active(), _quiet(quiet):
        for line in program.lines:
            in_bytes = sum(size_of(namespace[n]) for n in line.reads & made if n in namespace)
            reads.access = Access()
            reads.line = line.number
            started = time.perf_counter()
            try:
                exec(line.code, namespace)
            except SystemExit:
                raise
            except BaseException as error:
                if isinstance(error, KeyboardInterrupt):
                    raise
                where = f"{program.path}:{line.number}: {type(error).__name__}: {error}"
                if tolerate:
                    rows = sum(r.access.rows for r in runs)
                    return Run(tuple(runs), rows, namespace, where, values)
                raise ProgramFailed(where) from error
            elapsed = time.perf_counter() - started
            made |= line.binds
            out_bytes = sum(size_of(namespace[n]) for n in line.binds if n in namespace)
            if values is not None:
                values[line.number] = {n: _copy(namespace[n]) for n in line.binds if n in namespace}
            access = reads.access
            runs.append(
                LineRun(line, max(0.0, elapsed - access.seconds), access, in_bytes, out_bytes)
            )
    rows = sum(r.access.rows for r in runs)
    return Run(tuple(runs), rows, namespace, None, values)


def least(runs: Sequence[Run]) -> Run:
    """Runs of the same program on the same rows as one: each line's least time (a pause of
    the collector or the scheduler is not the line's cost)."""
    first = runs[0]
    reached = min(len(run.lines) for run in runs)
    lines = tuple(
        replace(first.lines[i], compute_s=min(run.lines[i].compute_s for run in runs))
        for i in range(reached)
    )
    failed = next((run.failed for run in runs if len(run.lines) == reached), first.failed)
    return replace(first, lines=lines, failed=failed)


def _copy(value: Any) -> Any:
    """A copy a later line cannot change in place (data values; anything else as it is)."""
    copy = getattr(value, "copy", None)
    if callable(copy) and type(value).__module__.split(".")[0] in ("pandas", "numpy"):
        return copy()
    return value


def size_of(value: Any) -> int:
    """Bytes of a value's data."""
    memory_usage = getattr(value, "memory_usage", None)
    if callable(memory_usage) and type(value).__module__.startswith("pandas"):
        used = memory_usage(index=True, deep=False)
        return int(used.sum()) if hasattr(used, "sum") else int(used)
    nbytes = getattr(value, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    return sys.getsizeof(value)


@contextlib.contextmanager
def _argv(argv: list[str]) -> Iterator[None]:
    saved = sys.argv
    sys.argv = argv
    try:
        yield
    finally:
        sys.argv = saved


@contextlib.contextmanager
def _quiet(quiet: bool) -> Iterator[None]:
    if not quiet:
        yield
        return
    with contextlib.redirect_stdout(io.StringIO()):
        yield
