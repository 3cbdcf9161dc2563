"""The program's file reads, served from quarry.

A program reads files as it would on a laptop (``pd.read_parquet("data/lineitem.parquet")``,
``pq.read_table(...)``, ``pd.read_csv(...)``). While it runs under quarry those functions are
wrapped: a path that names a stored dataset (the file it was ingested from, or a ``--mount``)
is answered from the devices, whole and in write order, or, in the sampling phase, as every
k-th row of every slice; any other path is read from the file system as usual. Each read's
time and bytes are counted against the line that made it (data access timed apart).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from quarry.errors import QuarryError


class MountError(QuarryError, ValueError):
    code = "mount_error"


@dataclass
class Access:
    """What one line read from storage."""

    seconds: float = 0.0
    bytes: int = 0
    rows: int = 0


@dataclass(frozen=True)
class ReadLog:
    """A read of a stored dataset: by which line, with which function and columns."""

    line: int
    dataset: str
    function: str
    columns: tuple[str, ...] | None


@dataclass
class Mounts:
    """Paths a program may read -> stored datasets."""

    paths: dict[str, str] = field(default_factory=dict)  # resolved path -> domain/name
    names: dict[str, str] = field(default_factory=dict)  # file name -> domain/name (if unique)

    @classmethod
    def of(cls, cluster: Any, explicit: dict[str, str] | None = None) -> Mounts:
        """Every dataset by the file it was ingested from, then ``explicit`` mounts on top."""
        mounts = cls()
        seen_names: dict[str, set[str]] = {}
        for entry in cluster.catalog.values():
            for record in entry.ingests:
                source = record.source or ""
                if not Path(source).is_absolute():  # rows given in memory, not a file
                    continue
                mounts.paths[_resolved(source)] = entry.qualified
                seen_names.setdefault(Path(source).name, set()).add(entry.qualified)
        mounts.names = {n: next(iter(d)) for n, d in seen_names.items() if len(d) == 1}
        for path, dataset in (explicit or {}).items():
            if dataset not in {e.qualified for e in cluster.catalog.values()}:
                raise MountError(f"--mount {path}={dataset}: no dataset {dataset} in the cluster")
            mounts.paths[_resolved(path)] = dataset
        return mounts

    def dataset_for(self, path: Any) -> str | None:
        if not isinstance(path, str | Path):
            return None
        return self.paths.get(_resolved(str(path))) or self.names.get(Path(str(path)).name)


def _resolved(path: str) -> str:
    return str(Path(path).expanduser().resolve())


class Reads:
    """While active, the read functions a program calls come here."""

    def __init__(
        self,
        cluster: Any,
        mounts: Mounts,
        every: int = 1,
        piece: tuple[int, int] | None = None,
        cache: dict | None = None,
    ):
        self.cluster = cluster
        self.mounts = mounts
        self.every = every  # 1: every row; k: every k-th row of every slice (a sample)
        # (k, K): only the k-th of K row ranges of a sample, rows in a fixed order (every
        # column sorted) so the whole and its pieces agree; pandas frames keep the whole's
        # row labels (the per-partition check, ``partitions.py``)
        self.piece = piece
        self._offset = 0
        self.line = 0  # the line running now (``profile.run`` says)
        self.log: list[ReadLog] = []
        self.access = Access()  # the current line's
        self.full_rows = 0  # rows the same reads return at full scale (each read counted)
        self.cache = cache  # samples drawn already, shared by runs on the same samples

    def fetch(self, dataset: str, columns: list[str] | None) -> pa.Table:
        started = time.perf_counter()
        if self.every == 1 and self.piece is None:
            table = self.cluster.scan(dataset, columns=columns, ordered=True).read_all()
        else:
            table = self._sample(dataset)
            if columns is not None:
                table = table.select(columns)
            if self.piece is not None:
                table = self._piece_of(table)
        self.access.seconds += time.perf_counter() - started
        self.access.bytes += table.nbytes
        self.access.rows += table.num_rows
        self.full_rows += self.cluster.entry(dataset).rows
        return table

    def _sample(self, dataset: str) -> pa.Table:
        """Every k-th row of every slice (k = 1: every row, as the source has them)."""
        key = (dataset, self.every)
        if self.cache is not None and key in self.cache:
            return self.cache[key]
        if self.every == 1:
            table = self.cluster.scan(dataset, ordered=True).read_all()
        else:
            table = self.cluster.sample(dataset, self.every).table
        if self.cache is not None:
            self.cache[key] = table
        return table

    def _piece_of(self, table: pa.Table) -> pa.Table:
        """The whole sample (K = 1) or one piece of it, in an order every run agrees on."""
        table = table.sort_by([(name, "ascending") for name in table.column_names])
        k, pieces = self.piece
        start, end = k * table.num_rows // pieces, (k + 1) * table.num_rows // pieces
        self._offset = start
        return table.slice(start, end - start)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        import pandas as pd
        import pyarrow.parquet as pq

        wrapped = [
            (pd, "read_parquet", _as_pandas),
            (pd, "read_csv", _as_pandas),
            (pq, "read_table", _as_arrow),
        ]
        originals = [(module, name, getattr(module, name)) for module, name, _ in wrapped]
        try:
            for (module, name, convert), (_, _, original) in zip(wrapped, originals):
                setattr(module, name, self._wrap(original, convert))
            yield
        finally:
            for module, name, original in originals:
                setattr(module, name, original)

    def _wrap(self, original: Callable, convert: Callable) -> Callable:
        def read(path: Any = None, *args: Any, **kwargs: Any) -> Any:
            target = path if path is not None else kwargs.get("source")
            dataset = self.mounts.dataset_for(target)
            if dataset is None:  # not stored in quarry: the file system, as in a plain run
                started = time.perf_counter()
                value = original(path, *args, **kwargs)
                self.access.seconds += time.perf_counter() - started
                return value
            columns = kwargs.get("columns")
            self.log.append(
                ReadLog(self.line, dataset, original.__name__, tuple(columns) if columns else None)
            )
            value = convert(self.fetch(dataset, columns))
            if self.piece is not None and hasattr(value, "index"):  # the whole's row labels
                import pandas as pd

                value.index = pd.RangeIndex(self._offset, self._offset + len(value))
            return value

        return read


def _as_pandas(table: pa.Table) -> Any:
    return table.to_pandas()


def _as_arrow(table: pa.Table) -> pa.Table:
    return table
