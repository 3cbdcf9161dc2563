"""What users hand to ingest, read as a stream of Arrow record batches."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from quarry.errors import SourceError

FORMATS = ("parquet", "csv", "arrow")
_SUFFIXES = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".tsv": "csv",
    ".arrow": "arrow",
    ".ipc": "arrow",
    ".feather": "arrow",
    ".arrows": "arrow",
}


@dataclass
class Source:
    reader: pa.RecordBatchReader
    bytes_total: int | None  # for progress; None when unknown
    rows_total: int | None
    name: str


def open_source(source: Any, format: str | None = None) -> Source:
    """A file path (Parquet, CSV/TSV, Arrow IPC), a pyarrow Table / RecordBatchReader, or pandas.

    Dictionary-encoded columns (pandas categoricals, Parquet dictionaries) are stored decoded:
    every slice is its own IPC stream, and a dataset keeps one schema across them.
    """
    opened = _open(source, format)
    plain = plain_schema(opened.reader.schema)
    if plain.equals(opened.reader.schema):
        return opened
    reader = opened.reader
    batches = (batch.cast(plain) for batch in reader)
    opened.reader = pa.RecordBatchReader.from_batches(plain, batches)
    return opened


def plain_schema(schema: pa.Schema) -> pa.Schema:
    """The schema with dictionary columns replaced by their value type."""
    fields = [
        f.with_type(f.type.value_type) if pa.types.is_dictionary(f.type) else f for f in schema
    ]
    return pa.schema(fields, metadata=schema.metadata)


def _open(source: Any, format: str | None = None) -> Source:
    if isinstance(source, pa.Table):
        return Source(source.to_reader(), source.nbytes, source.num_rows, "table")
    if isinstance(source, pa.RecordBatch):
        table = pa.Table.from_batches([source])
        return Source(table.to_reader(), table.nbytes, table.num_rows, "batch")
    if isinstance(source, pa.RecordBatchReader):
        return Source(source, None, None, "stream")
    if type(source).__module__.startswith("pandas"):
        table = pa.Table.from_pandas(source, preserve_index=False)
        return Source(table.to_reader(), table.nbytes, table.num_rows, "dataframe")
    if isinstance(source, (str, os.PathLike)):
        return _open_path(Path(source), format)
    raise SourceError(
        f"cannot ingest a {type(source).__name__}: give a file path (Parquet, CSV, Arrow IPC), "
        "a pyarrow Table or RecordBatchReader, or a pandas DataFrame"
    )


def _open_path(path: Path, format: str | None) -> Source:
    if not path.exists():
        raise SourceError(f"no file {path}: check the path")
    if path.is_dir():
        raise SourceError(f"{path} is a folder: give one file (Parquet, CSV or Arrow IPC)")
    if not os.access(path, os.R_OK):
        raise SourceError(f"cannot read {path}: permission denied")
    kind = format or _SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise SourceError(
            f"cannot tell the format of {path} from its suffix: name it .parquet, .csv, .tsv or "
            ".arrow, or pass --format parquet|csv|arrow"
        )
    size = path.stat().st_size
    try:
        if kind == "parquet":
            file = pq.ParquetFile(path)
            reader = pa.RecordBatchReader.from_batches(
                file.schema_arrow, file.iter_batches(batch_size=65_536)
            )
            return Source(reader, size, file.metadata.num_rows, str(path))
        if kind == "csv":
            delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
            reader = pacsv.open_csv(
                path,
                parse_options=pacsv.ParseOptions(delimiter=delimiter),
                read_options=pacsv.ReadOptions(block_size=8 << 20),
            )
            return Source(reader, size, None, str(path))
        if kind == "arrow":
            return _open_ipc(path, size)
    except READ_ERRORS as error:
        raise SourceError(f"cannot read {path} as {kind}: {error}") from None
    raise SourceError(f"unknown format {kind!r}: choose one of {', '.join(FORMATS)}")


def _open_ipc(path: Path, size: int) -> Source:
    try:
        file = pa.ipc.open_file(path)
        batches = (file.get_batch(i) for i in range(file.num_record_batches))
        reader = pa.RecordBatchReader.from_batches(file.schema, batches)
        return Source(reader, size, None, str(path))
    except pa.ArrowInvalid:
        return Source(pa.ipc.open_stream(path), size, None, str(path))


# What a malformed file makes a reader raise (found by fuzzing every format: an unsupported
# type in a damaged header, a bad UTF-8 name, an allocation a corrupt length asks for).
READ_ERRORS = (pa.ArrowException, OSError, ValueError, MemoryError)


class GuardedReader:
    """Turns read errors in the middle of a file (malformed rows) into a SourceError, and
    validates every batch in full: an IPC file's offsets are not checked when it is read, and
    a bad one must not reach the code that cuts slices."""

    def __init__(self, source: Source):
        self.source = source

    def __iter__(self):
        try:
            for batch in self.source.reader:
                batch.validate(full=True)
                yield batch
        except READ_ERRORS as error:
            raise SourceError(f"cannot read {self.source.name}: {error}") from None
