"""Axis queries: the cells matching a filter over cell metadata and the genes matching a filter
over gene metadata (or a list of names), as an AnnData, from a stored matrix or a collection.

```python
q = genes.query(cluster, "bio/pbmc", obs="louvain = '3' AND n_genes > 800", var=["CD3D", "NKG7"])
adata = q.to_anndata()              # sparse X (cells x genes), obs and var of the selection
for chunk in q.batches():           # larger than memory: AnnData chunks as the devices answer
    ...
q.report.to_json()                  # bytes read and shipped against the matrix's size
```

Filters are SQL WHERE expressions (what `quarry sql` and DataFusion evaluate), over the columns of
the cell metadata (`obs=`) or the gene metadata (`var=`); `var=` also takes a list of gene names.
The control plane runs first: each filter is a SQL query on the metadata dataset
(`domain/name__cells`, `__genes`), itself pushed to the devices that hold it, and gives the
selected positions with the requested columns. Then the data plane: unit `genes.axis_query` on
every device holding the matrix prunes the slices whose zone maps hold no selected row, and ships
only the selected values of the rest (``axis_unit``).

A matrix stored by cells (``orientation="cells"``) prunes by the cell filter and ships the
selected genes; one stored by genes (the default) prunes by the gene selection and ships the
selected cells. Chunks of ``batches()`` follow the stored rows: chunks of cells (concatenate
along obs) from a matrix stored by cells, chunks of genes (along var) from one stored by genes.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from scipy import sparse

from quarry.errors import QuarryError
from quarry.genes.axis_unit import ALL, AxisQuery, AxisQueryArgs, Selection
from quarry.genes.errors import GenesInputError
from quarry.genes.matrix import CELL_COLUMN, GENE_COLUMN
from quarry.pushdown import Pushdown

if TYPE_CHECKING:
    from quarry.coordinator.cluster import Cluster
    from quarry.genes.datasets import StoredMatrix
    from quarry.genes.dispatch import PushBack, Report

RESULT_BATCHES_MAX = 64  # selected rows waiting for the reader
CHUNK_VALUES_DEFAULT = 16 << 20  # values per streamed AnnData chunk (about 128 MB with indices)
NAMES_SHOWN_MAX = 5
DATASET_COLUMN = "dataset"  # the member a cell of a collection comes from


@dataclass(frozen=True)
class Part:
    """One stored matrix's share of a query: its selected cells and genes (positions, sorted)
    and their metadata."""

    matrix: StoredMatrix
    cells: np.ndarray
    genes: np.ndarray
    obs: pd.DataFrame
    first_cell: int  # the part's first cell in the result (members of a collection stack)
    # a matrix stored in an order of its own (``ingest(order_by=...)``): each selected cell's
    # place in the source, so the result follows the source's order (None: stored in it)
    source: np.ndarray | None = None

    @property
    def by_cells(self) -> bool:
        return self.matrix.orientation == "cells"

    def in_source_order(self, where: np.ndarray) -> np.ndarray:
        """``where`` (indexes into the part's cells) reordered as the source has the cells."""
        if self.source is None:
            return where
        return where[np.argsort(self.source[where], kind="stable")]

    @property
    def result_obs(self) -> pd.DataFrame:
        if self.source is None:
            return self.obs
        return self.obs.iloc[self.in_source_order(np.arange(len(self.cells)))]


@dataclass
class QueryReport:
    """What an axis query selected, read and shipped, against what the matrices hold."""

    datasets: list[str]
    pushdown: str
    cells: int = 0  # in the matrices
    genes: int = 0
    cells_selected: int = 0
    genes_selected: int = 0
    bytes_matrix: int = 0  # stored bytes of the matrices
    bytes_read: int = 0  # read off the devices' stores (raw scans: the slices' bytes)
    bytes_shipped: int = 0  # device -> host: the selected values, plus any raw slices
    slices_total: int = 0
    slices_pruned: int = 0  # no selected row (zone maps): not read
    slices_executed: int = 0
    slices_pushed_back: int = 0
    values_selected: int = 0  # non-zero values in the result
    wall_s: float = 0.0
    matrices: list[dict[str, Any]] = field(default_factory=list)  # each matrix's own report

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def query(
    cluster: Cluster,
    source: str,
    obs: str | None = None,
    var: str | Sequence[str] | None = None,
    *,
    columns: Sequence[str] | None = None,
    var_columns: Sequence[str] | None = None,
    pushdown: Pushdown | str = Pushdown.AUTO,
    push_back: Mapping[str, PushBack] | None = None,
    policy: Mapping[str, Any] | None = None,
) -> CellQuery:
    """The cells of ``source`` (a matrix or a collection, "domain/name") matching ``obs`` and the
    genes matching ``var``: a ``CellQuery`` whose ``to_anndata()`` reads the selection and whose
    ``batches()`` streams it in AnnData chunks.

    obs:         a SQL WHERE expression over the cell metadata columns (None: every cell).
    var:         a SQL WHERE expression over the gene metadata columns, or gene names (None:
                 every gene).
    columns:     the cell metadata columns kept in ``obs`` (None: all); ``var_columns`` those of
                 ``var``.
    pushdown:    "auto", "always" or "never" (the host reads every slice raw); the answer is
                 the same.
    push_back:   force devices to push back slice ranges, {dataset: {partition: [(first, end)]}}.
    """
    from quarry.genes.collections import members_of
    from quarry.genes.dispatch import GENES_MODES

    mode = Pushdown.parse(pushdown, GENES_MODES)
    cluster.refresh()  # another process may have re-ingested: versions must be current
    members, shared_columns = members_of(cluster, source)
    kept = _kept_columns(shared_columns, columns, "columns", source)
    var_table, gene_positions = _genes(members[0], var, var_columns, mode)
    parts, first_cell = [], 0
    for matrix in members:
        cells, obs_frame, placed = _cells(matrix, obs, kept, mode)
        if len(members) > 1:
            obs_frame.insert(0, DATASET_COLUMN, matrix.dataset)
        parts.append(Part(matrix, cells, gene_positions, obs_frame, first_cell, placed))
        first_cell += len(cells)
    return CellQuery(source, parts, var_table, mode, dict(push_back or {}), policy)


class CellQuery:
    """A planned axis query: ``obs`` and ``var`` of the selection are known; the values are read
    when asked for (``to_anndata``, ``batches``). ``report`` says what the last read moved."""

    def __init__(
        self,
        source: str,
        parts: list[Part],
        var: pd.DataFrame,
        pushdown: Pushdown,
        push_back: dict[str, PushBack],
        policy: Mapping[str, Any] | None,
    ) -> None:
        self.source = source
        self.parts = parts
        self.var = var
        self.pushdown = pushdown
        self.push_back = push_back
        self.policy = policy
        self.report = QueryReport([p.matrix.dataset for p in parts], str(pushdown))

    @property
    def obs(self) -> pd.DataFrame:
        frames = [part.result_obs for part in self.parts]
        return _stacked(frames) if len(frames) > 1 else frames[0]

    @property
    def shape(self) -> tuple[int, int]:
        return sum(len(p.cells) for p in self.parts), len(self.var)

    def to_anndata(self) -> Any:
        """The whole selection as one AnnData: cells in the matrices' order (a collection's
        members one after the other; a matrix stored in an order of its own gives them in
        its source's order), genes in the matrix's order."""
        import anndata

        blocks = [_assemble(part, list(self._rows(part)), len(self.var)) for part in self.parts]
        x = blocks[0] if len(blocks) == 1 else sparse.vstack(blocks, format="csr")
        return anndata.AnnData(X=x, obs=self.obs, var=self.var)

    def batches(self, values_max: int = CHUNK_VALUES_DEFAULT) -> Iterator[Any]:
        """The selection in AnnData chunks of about ``values_max`` non-zero values each, as the
        devices answer: chunks of cells from a matrix stored by cells, chunks of genes from one
        stored by genes (``chunk.uns["quarry_axis"]`` says which). Each chunk's rows are in
        stored order (its cells in the source's order); chunks come in the order they
        arrive."""
        import anndata

        for part in self.parts:
            axis = "obs" if part.by_cells else "var"
            pending: list[pa.RecordBatch] = []
            values = 0
            for batch in self._rows(part):
                pending.append(batch)
                values += len(batch.column(2).values)
                if values >= values_max:
                    yield _chunk(anndata, part, pending, self.var, axis)
                    pending, values = [], 0
            if pending:
                yield _chunk(anndata, part, pending, self.var, axis)

    def _rows(self, part: Part) -> Iterator[pa.RecordBatch]:
        """The part's selected rows as the devices ship them; the report counts them."""
        from quarry.genes.dispatch import Dispatch, matrix_tasks, report_of

        started = time.perf_counter()
        matrix = part.matrix
        rows, columns = _stored_axes(part)
        self._count_matrix(part)
        if (rows is not None and not len(rows)) or (columns is not None and not len(columns)):
            return  # nothing selected: nothing to read
        args = AxisQueryArgs(
            version=matrix.version,
            ingest_ids=tuple(sorted(i.id for i in matrix.entry.ingests)),
            column_count=matrix.cell_count if not part.by_cells else matrix.gene_count,
            value_type=str(matrix.description["value_type"]),
            rows_selected=ALL if rows is None else len(rows),
            columns_selected=ALL if columns is None else len(columns),
        )
        selection = Selection.of(rows, columns, args.column_count)
        dispatch = Dispatch()
        tasks = matrix_tasks(
            matrix,
            AxisQuery,
            args.to_json(),
            selection.encode(),
            self.pushdown,
            dict(self.push_back.get(matrix.dataset, {})),
            self.policy,
        )
        shipped_rows = 0
        for batch in dispatch.run(tasks, len(tasks), RESULT_BATCHES_MAX, "quarry-genes-query"):
            shipped_rows += batch.num_rows
            self.report.values_selected += len(batch.column(2).values)
            yield batch
        expected = len(rows) if rows is not None else _stored_rows(part)
        # Paired with the unit: every selected row comes back once, whatever ran where.
        assert shipped_rows == expected, (matrix.dataset, shipped_rows, expected)
        self._count_work(report_of(matrix.dataset, self.pushdown, dispatch))
        self.report.wall_s += time.perf_counter() - started

    def _count_matrix(self, part: Part) -> None:
        report, matrix = self.report, part.matrix
        report.cells += matrix.cell_count
        report.genes = matrix.gene_count
        report.cells_selected += len(part.cells)
        report.genes_selected = len(part.genes)
        report.bytes_matrix += matrix.entry.bytes_stored
        report.slices_total += sum(p.slices for p in matrix.entry.partitions)

    def _count_work(self, work: Report) -> None:
        report = self.report
        report.bytes_read += work.bytes_read
        report.bytes_shipped += work.bytes_shipped
        report.slices_pruned += work.slices_pruned
        report.slices_executed += work.slices_executed
        report.slices_pushed_back += work.slices_pushed_back
        report.matrices.append(work.to_json())


def _stacked(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Members' obs one after the other; a categorical column stays categorical, its categories
    the union of the members' in order of first appearance (pandas would make it object)."""
    frames = [frame.copy() for frame in frames]
    for name in frames[0].columns:
        kinds = [frame[name].dtype for frame in frames]
        if all(isinstance(kind, pd.CategoricalDtype) for kind in kinds):
            union = pd.api.types.union_categoricals([frame[name] for frame in frames])
            for frame in frames:
                frame[name] = frame[name].cat.set_categories(union.categories)
    return pd.concat(frames)


def _stored_axes(part: Part) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(selected stored rows, selected stored columns), None where every one is selected."""
    cells = None if len(part.cells) == part.matrix.cell_count else part.cells
    genes = None if len(part.genes) == part.matrix.gene_count else part.genes
    return (cells, genes) if part.by_cells else (genes, cells)


def _stored_rows(part: Part) -> int:
    return part.matrix.cell_count if part.by_cells else part.matrix.gene_count


def _assemble(part: Part, batches: list[pa.RecordBatch], gene_count: int) -> sparse.csr_matrix:
    """The part's rows as its cells x genes block, every selected row once, in stored order
    (a matrix stored in an order of its own: in its source's)."""
    if part.by_cells:
        block = _rows_csr(batches, part.cells, gene_count)
    else:
        block = _rows_csr(batches, part.genes, len(part.cells)).T.tocsr()
    if part.source is None:
        return block
    return block[part.in_source_order(np.arange(len(part.cells)))]


def _rows_csr(batches: list[pa.RecordBatch], selected: np.ndarray, width: int) -> sparse.csr_matrix:
    """Shipped rows (any order) as a CSR block whose row i is ``selected[i]``."""
    value_type = np.float32
    if batches:
        value_type = batches[0].schema.field(2).type.value_type.to_pandas_dtype()
    if not batches:
        return sparse.csr_matrix((len(selected), width), dtype=value_type)
    row_ids = np.concatenate([b.column(0).to_numpy() for b in batches])
    lengths = np.concatenate([np.diff(b.column(2).offsets.to_numpy()) for b in batches])
    indices = np.concatenate([_flat(b.column(1)) for b in batches])
    data = np.concatenate([_flat(b.column(2)) for b in batches])
    position = np.searchsorted(selected, row_ids)
    assert (position < len(selected)).all() and (selected[position] == row_ids).all()
    assert len(np.unique(position)) == len(position), "a row shipped twice"
    counts = np.zeros(len(selected), dtype=np.int64)
    counts[position] = lengths
    indptr = np.concatenate(([0], np.cumsum(counts)))
    # each value goes to its row's place in the result, keeping its rank within the row
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    row_of_value = np.repeat(np.arange(len(lengths)), lengths)
    destination = indptr[position][row_of_value] + (np.arange(len(data)) - starts[row_of_value])
    ordered_indices = np.empty_like(indices)
    ordered_data = np.empty_like(data)
    ordered_indices[destination] = indices
    ordered_data[destination] = data
    return sparse.csr_matrix((ordered_data, ordered_indices, indptr), shape=(len(selected), width))


def _flat(lists: pa.Array) -> np.ndarray:
    return lists.flatten().to_numpy(zero_copy_only=False)


def _chunk(anndata: Any, part: Part, batches: list[pa.RecordBatch], var: pd.DataFrame, axis: str):
    rows = np.sort(np.concatenate([b.column(0).to_numpy() for b in batches]))
    if axis == "obs":
        x = _rows_csr(batches, rows, len(var))
        where = np.searchsorted(part.cells, rows)
        if part.source is not None:  # the chunk's cells as the source has them
            order = part.in_source_order(where)
            x, where = x[np.searchsorted(where, order)], order
        chunk = anndata.AnnData(X=x, obs=part.obs.iloc[where], var=var)
    else:
        x = _rows_csr(batches, rows, len(part.cells)).T.tocsr()
        where = np.searchsorted(part.genes, rows)
        order = part.in_source_order(np.arange(len(part.cells)))
        chunk = anndata.AnnData(X=x[order], obs=part.obs.iloc[order], var=var.iloc[where])
    chunk.uns["quarry_axis"] = axis
    return chunk


# ---- the control plane: filters over metadata -------------------------------------------------


def _cells(
    matrix: StoredMatrix, where: str | None, columns: list[str], pushdown: Pushdown
) -> tuple[np.ndarray, pd.DataFrame, np.ndarray | None]:
    """Stored positions of the cells matching ``where`` (sorted), their metadata, and their
    places in the source (None: the matrix stores them in the source's order)."""
    from quarry.genes.datasets import SOURCE_POSITION_COLUMN

    asked = [CELL_COLUMN, *columns]
    filtered = matrix.ordered and where is not None
    if filtered:
        asked.append(SOURCE_POSITION_COLUMN)
    positions, table = _where(matrix, "__cells", where, asked, pushdown, "obs")
    source = None
    if filtered:
        source = table.column(SOURCE_POSITION_COLUMN).to_numpy().astype(np.int64)
        table = table.drop_columns([SOURCE_POSITION_COLUMN])
    elif matrix.ordered:
        source = matrix.source_positions[positions]
    return positions, _frame(matrix, "__cells", table, CELL_COLUMN), source


def _genes(
    matrix: StoredMatrix,
    var: str | Sequence[str] | None,
    columns: Sequence[str] | None,
    pushdown: Pushdown,
) -> tuple[pd.DataFrame, np.ndarray]:
    gene_columns = [c for c in matrix.genes.column_names if c != GENE_COLUMN]
    kept = _kept_columns(gene_columns, columns, "var_columns", matrix.dataset)
    if var is None or isinstance(var, str):
        positions, table = _where(matrix, "__genes", var, [GENE_COLUMN, *kept], pushdown, "var")
    else:
        positions = _named_genes(matrix, var)
        table = matrix.genes.select([GENE_COLUMN, *kept]).take(pa.array(positions))
    return _frame(matrix, "__genes", table, GENE_COLUMN), positions


def _where(
    matrix: StoredMatrix,
    suffix: str,
    where: str | None,
    columns: list[str],
    pushdown: Pushdown,
    what: str,
) -> tuple[np.ndarray, pa.Table]:
    """(positions, rows with ``columns``) of the metadata rows matching ``where``: the cached
    metadata when there is no filter, else a SQL query on the metadata dataset."""
    whole = matrix.cells if suffix == "__cells" else matrix.genes
    if where is None:
        return np.arange(whole.num_rows, dtype=np.int64), whole.select(columns)
    if not where.strip():
        raise GenesInputError(f"{what}= is empty: give a filter, or None for every row")
    domain, name = matrix.dataset.split("/", 1)
    selected = ", ".join(_quoted(c) for c in ["position", *columns])
    condition = quote_columns(where, whole.column_names)
    sql = f"SELECT {selected} FROM {_quoted(domain)}.{_quoted(name + suffix)} WHERE {condition}"
    try:
        table = matrix.cluster.sql(sql, pushdown=pushdown).read_all()
    except QuarryError as error:
        usable = [c for c in whole.column_names]
        raise GenesInputError(
            f"dataset {matrix.dataset!r}: the {what} filter {where!r} failed: "
            f"{str(error).splitlines()[0]} (columns: {usable}; filters are SQL WHERE "
            "expressions, strings in single quotes)"
        ) from None
    table = table.sort_by("position")
    positions = table.column("position").to_numpy().astype(np.int64)
    return positions, table.drop_columns(["position"])


def _named_genes(matrix: StoredMatrix, names: Sequence[str]) -> np.ndarray:
    wanted = pa.array([str(n) for n in names], type=pa.string())
    found = pc.index_in(wanted, value_set=matrix.genes.column(GENE_COLUMN))
    if found.null_count:
        unknown = wanted.filter(found.is_null()).to_pylist()
        shown = ", ".join(repr(n) for n in unknown[:NAMES_SHOWN_MAX])
        more = len(unknown) - NAMES_SHOWN_MAX
        raise GenesInputError(
            f"dataset {matrix.dataset!r} has no gene {shown}"
            + (f" and {more} more" if more > 0 else "")
            + " (names are matched exactly; var= also takes a SQL filter over the gene columns)"
        )
    return np.unique(found.to_numpy().astype(np.int64))


def _frame(matrix: StoredMatrix, suffix: str, table: pa.Table, id_column: str) -> pd.DataFrame:
    """Metadata rows as a DataFrame indexed by id, with the dataset's categories restored."""
    from quarry.genes.datasets import restore_categories

    categories = matrix.description.get("categories", {}).get(suffix, {})
    table = restore_categories(table, categories)
    frame = table.to_pandas()
    frame.index = pd.Index(frame.pop(id_column).astype(str).to_numpy(), dtype=object)
    for name in categories:  # in the owner's order; unused ones go, as anndata's subsets do
        if name in frame.columns and isinstance(frame[name].dtype, pd.CategoricalDtype):
            frame[name] = frame[name].cat.remove_unused_categories()
    return frame


def _kept_columns(
    available: Sequence[str], asked: Sequence[str] | None, what: str, dataset: str
) -> list[str]:
    usable = [c for c in available if c not in (CELL_COLUMN, GENE_COLUMN)]
    if asked is None:
        return usable
    unknown = [c for c in asked if c not in usable]
    if unknown:
        raise GenesInputError(
            f"{dataset!r}: {what} names {unknown} that are not metadata columns ({usable})"
        )
    return list(asked)


# a single-quoted string, a double-quoted identifier, or a bare word
_TOKEN = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|[A-Za-z_][A-Za-z0-9_]*")


def quote_columns(where: str, columns: Sequence[str]) -> str:
    """``where`` with each bare word that names a metadata column quoted, so mixed-case
    names (``S_score``) mean the column as written: SQL folds unquoted names to lower case,
    and a biologist's filter names the columns as the AnnData has them."""
    named = {c for c in columns if c != c.lower()}

    def quoted(match: re.Match[str]) -> str:
        token = match.group(0)
        return _quoted(token) if token in named else token

    return _TOKEN.sub(quoted, where)


def _quoted(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'
