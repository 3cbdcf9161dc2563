"""A spool: fragment outputs taken as they arrive and held in bounded host memory.

DataFusion's Python API cannot scan a Python stream without collecting it first, and a
super-plan may read a fragment more than once, so the host keeps every fragment's output until
the super-plan runs. The spool bounds what that costs in memory: batches stay in memory while
all fragments together hold less than `memory_bytes_max`, and the rest goes to Arrow IPC files,
a folder per fragment in a temporary directory that `close` removes whatever happened.

Each fragment is read by its own thread: the coordinator feeds each fragment through a bounded
queue, so reading fragment A to its end before starting B would leave B's devices blocked on a
full queue for as long as A takes, and a reader that waited for B inside A would never finish.
"""

from __future__ import annotations

import os
import queue
import shutil
import tempfile
import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import wait
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from quarry import threads

MIB = 1024 * 1024
# Batches written to disk are cut to this size so that a scan of the spool, which reads a few
# batches ahead, holds a bounded amount whatever size the devices' batches had.
SPOOL_BATCH_BYTES_MAX = 1 * MIB
SPOOL_FILE_SUFFIX = ".arrow"
# After a producer failed, how long the others get to notice (at their next batch) and end
# before the error is raised and the spool removed.
SPOOL_STOP_WAIT_S = 5.0


@dataclass
class SpooledFragment:
    """One fragment's output, all of it: `batches` in memory, then `files` in `directory`."""

    name: str
    schema: pa.Schema
    batches: list[pa.RecordBatch] = field(default_factory=list)
    directory: Path | None = None  # None: nothing on disk
    files: list[Path] = field(default_factory=list)
    rows_in_memory: int = 0
    rows_on_disk: int = 0
    bytes_in_memory: int = 0
    bytes_on_disk: int = 0

    @property
    def rows(self) -> int:
        return self.rows_in_memory + self.rows_on_disk


class Spool:
    """Fragment outputs in at most `memory_bytes_max` of memory, the rest under `directory`.

    Use as a context manager (or call `close`): the directory is removed on exit, also when a
    producer raised or the reader stopped early.
    """

    def __init__(
        self, memory_bytes_max: int, parent: str | Path | None = None, files_per_fragment: int = 1
    ) -> None:
        assert memory_bytes_max >= 0 and files_per_fragment >= 1
        self.memory_bytes_max = memory_bytes_max
        # A file per partition of the scan: DataFusion reads each file whole, a batch at a time.
        self.files_per_fragment = files_per_fragment
        self.memory_bytes = 0
        self._parent = parent
        self._directory: Path | None = None
        self._remove: weakref.finalize | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()

    @property
    def directory(self) -> Path:
        """Made when first needed (most queries spool nothing to disk; making and removing it
        cost a small query a tenth of a millisecond)."""
        with self._lock:
            if self._directory is None:
                self._directory = Path(tempfile.mkdtemp(prefix="quarry-spool-", dir=self._parent))
                # A reader dropped without being exhausted closes its generator, which closes
                # the spool; one caught in a reference cycle is collected later, and at exit at
                # the latest.
                self._remove = weakref.finalize(self, _remove_directory, self._directory)
            return self._directory

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the readers at their next batch and remove everything spooled to disk."""
        self._stop.set()
        with self._lock:
            remove = self._remove
        if remove is not None:
            remove()

    def fill(
        self, outputs: Mapping[str, tuple[pa.Schema, Iterable[pa.RecordBatch]]]
    ) -> dict[str, SpooledFragment]:
        """Read every fragment's batches to its end, all fragments at once (one thread each).

        The first error a producer raises is raised here once the other readers stopped (at
        their next batch; they get `SPOOL_STOP_WAIT_S`).
        """
        if len(outputs) == 1:  # nothing to read beside it: this thread reads it
            ((name, (schema, batches)),) = outputs.items()
            return {name: self._read(name, schema, batches)}
        finished: queue.Queue = queue.Queue()  # one item per fragment: its result or its error

        def read(name: str, schema: pa.Schema, batches: Iterable[pa.RecordBatch]) -> None:
            try:
                finished.put(self._read(name, schema, batches))
            except BaseException as error:  # handed to the caller, which raises it
                finished.put(error)

        # On kept threads (``quarry.threads``), not daemons: a thread killed at exit inside
        # native code (DataFusion, Arrow) aborts the process; these end at their producer's
        # next batch once stopped.
        futures = [
            threads.submit(read, name, schema, batches, name=f"quarry-spool-{index}")
            for index, (name, (schema, batches)) in enumerate(outputs.items())
        ]
        spooled: dict[str, SpooledFragment] = {}
        try:
            for _ in futures:
                item = finished.get()
                if isinstance(item, BaseException):
                    raise item
                spooled[item.name] = item
        except BaseException:
            self._stop.set()
            wait(futures, timeout=SPOOL_STOP_WAIT_S)
            raise
        return spooled

    def _reserve(self, nbytes: int) -> bool:
        with self._lock:
            if self.memory_bytes + nbytes > self.memory_bytes_max:
                return False
            self.memory_bytes += nbytes
            return True

    def _read(
        self, name: str, schema: pa.Schema, batches: Iterable[pa.RecordBatch]
    ) -> SpooledFragment:
        spooled = SpooledFragment(name, schema)
        writers: list[ipc.RecordBatchFileWriter] = []
        pieces_written = 0
        iterator = iter(batches)
        try:
            for batch in iterator:
                if self._stop.is_set():
                    break
                assert batch.schema.equals(schema), (
                    f"{name}: a batch has schema {batch.schema}, the fragment {schema}"
                )
                if batch.num_rows == 0:
                    continue
                # Whole buffers, not the slice's share: a slice pins its parent's memory.
                nbytes = batch.get_total_buffer_size()
                if self._reserve(nbytes):
                    spooled.batches.append(batch)
                    spooled.rows_in_memory += batch.num_rows
                    spooled.bytes_in_memory += nbytes
                    continue
                if not writers:
                    spooled.directory = self.directory / name
                    spooled.directory.mkdir()
                    for index in range(self.files_per_fragment):
                        path = spooled.directory / f"{index}{SPOOL_FILE_SUFFIX}"
                        writers.append(ipc.new_file(path, schema))
                        spooled.files.append(path)
                for piece in _pieces(batch, SPOOL_BATCH_BYTES_MAX):
                    writers[pieces_written % len(writers)].write_batch(piece)
                    pieces_written += 1
                spooled.rows_on_disk += batch.num_rows
                spooled.bytes_on_disk += batch.nbytes
        finally:
            for writer in writers:
                writer.close()
            close = getattr(iterator, "close", None)
            if self._stop.is_set() and close is not None:
                close()  # a generator's own cleanup (a coordinator stream stops its devices)
        return spooled


def _remove_directory(directory: Path) -> None:
    """The spool's directory and all under it. Most queries spool nothing to disk: an empty
    directory goes with one call, without the walk ``rmtree`` makes (a tenth of a millisecond
    of a small query)."""
    try:
        os.rmdir(directory)
    except OSError:
        shutil.rmtree(directory, ignore_errors=True)


def _pieces(batch: pa.RecordBatch, bytes_max: int) -> Iterator[pa.RecordBatch]:
    """`batch` cut into slices of about `bytes_max` bytes (at least one row each)."""
    rows = batch.num_rows
    rows_per_piece = max(1, rows * bytes_max // max(batch.nbytes, 1))
    for offset in range(0, rows, rows_per_piece):
        yield batch.slice(offset, rows_per_piece)


def rows_in_files(files: Iterable[Path]) -> int:
    """Rows the spool files hold, from their footers (the check paired with `_read`'s count)."""
    total = 0
    for path in files:
        with ipc.open_file(path) as reader:
            total += reader.count_rows()  # record batch headers only, no bodies
    return total
