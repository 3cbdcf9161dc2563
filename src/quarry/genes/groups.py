"""Cell groupings: which group each cell of a dataset belongs to, as Accumulate consumes it.

A grouping is the control-plane half of a differential-expression request: a small int array
(one id per cell) that travels to every device holding a slice of the dataset, plus the labels
that only the host needs. A grouping made from a cell-metadata column covers every label at
once, so one Accumulate pass (and one cached result) serves every "group vs rest" question on
that column.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from quarry.genes.errors import GenesInputError
from quarry.genes.matrix import CELL_COLUMN
from quarry.genes.stats import NO_GROUP


class CellAxis(Protocol):
    """What a grouping needs of a dataset: its cell metadata (an `ExpressionMatrix` in memory,
    or a `StoredMatrix` on a cluster) and its name for messages."""

    @property
    def cells(self) -> pa.Table: ...

    @property
    def dataset(self) -> str: ...

    @property
    def cell_count(self) -> int: ...

    @property
    def cell_ids(self) -> np.ndarray: ...


# Labels listed in an error message before "...": enough to spot a typo, short enough to read.
LABELS_SHOWN_MAX = 20


@dataclass(frozen=True)
class Grouping:
    """group_of_cell[i] is the group id of cell i (NO_GROUP: in no group); labels[id] names it.

    A None label is the bucket of cells without a label in the column: they belong to no named
    group but do count in "the rest".
    """

    group_of_cell: np.ndarray
    labels: tuple[str | None, ...]
    dataset: str
    source: str  # for messages: "column 'louvain'" or "the cell lists"

    def __post_init__(self) -> None:
        assert self.group_of_cell.dtype == np.int32, self.group_of_cell.dtype
        assert self.group_of_cell.ndim == 1
        if len(self.group_of_cell):
            assert self.group_of_cell.min() >= NO_GROUP
            assert self.group_of_cell.max() < len(self.labels)

    @property
    def group_count(self) -> int:
        return len(self.labels)

    def digest(self) -> str:
        """Names the grouping in cache keys: the same cells in the same groups, the same digest.

        Labels are left out on purpose: they only name the groups on the host; the devices'
        statistics depend on which cells share a group id, nothing else.
        """
        return grouping_digest(self.group_of_cell, self.group_count)

    def cell_counts(self) -> np.ndarray:
        """Cells per group id."""
        kept = self.group_of_cell[self.group_of_cell >= 0]
        return np.bincount(kept, minlength=self.group_count)

    def id_of(self, label: object) -> int:
        """The group id of `label`, or an error that lists the labels there are."""
        wanted = str(label)
        for group_id, known in enumerate(self.labels):
            if known == wanted:
                return group_id
        named = [known for known in self.labels if known is not None]
        shown = ", ".join(repr(known) for known in named[:LABELS_SHOWN_MAX])
        more = " ..." if len(named) > LABELS_SHOWN_MAX else ""
        raise GenesInputError(
            f"dataset {self.dataset!r}: {self.source} has no group {wanted!r} "
            f"(groups: {shown}{more})"
        )


def grouping_digest(group_of_cell: np.ndarray, group_count: int) -> str:
    """A digest of (group ids per cell, group count); devices recompute it to check payloads."""
    hasher = hashlib.blake2b(digest_size=16)
    hasher.update(str(int(group_count)).encode())
    hasher.update(np.ascontiguousarray(group_of_cell, dtype="<i4").tobytes())
    return hasher.hexdigest()


def restrict_to_cells(grouping: Grouping, matrix: CellAxis, cells: Sequence[str]) -> Grouping:
    """The grouping with every cell outside `cells` left out (Figure 1's selection of cells)."""
    wanted = pa.array([str(cell) for cell in cells], type=pa.string())
    positions = pc.index_in(wanted, value_set=matrix.cells.column(CELL_COLUMN))
    if positions.null_count:
        unknown = wanted.filter(positions.is_null())
        raise GenesInputError(
            f"dataset {matrix.dataset!r}: cells= lists {len(unknown)} ids the dataset does not "
            f"have, first {unknown[0].as_py()!r}"
        )
    kept = np.zeros(len(grouping.group_of_cell), dtype=bool)
    kept[positions.to_numpy()] = True
    group_of_cell = np.where(kept, grouping.group_of_cell, NO_GROUP).astype(np.int32)
    return Grouping(group_of_cell, grouping.labels, grouping.dataset, grouping.source)


def grouping_from_column(matrix: CellAxis, column: str) -> Grouping:
    """One group per label of a cell-metadata column; unlabelled cells get a bucket of their own.

    Labels are compared as text, so cluster 3 and "3" are the same group.
    """
    cells = matrix.cells
    if column == CELL_COLUMN or column not in cells.column_names:
        usable = [name for name in cells.column_names if name != CELL_COLUMN]
        raise GenesInputError(
            f"dataset {matrix.dataset!r}: no cell metadata column {column!r} to group by "
            f"(columns: {usable})"
        )
    values = cells.column(column)
    if pa.types.is_dictionary(values.type):
        # Keep the category order (and empty categories) the data owner defined.
        dictionaries = [chunk.dictionary.cast(pa.string()) for chunk in values.chunks]
        labels = pc.unique(pa.chunked_array(dictionaries, type=pa.string()))
    else:
        labels = pc.unique(values.cast(pa.string()))
    labels = labels.drop_null()
    positions = pc.index_in(values.cast(pa.string()), value_set=labels)
    unlabelled = positions.is_null().to_numpy(zero_copy_only=False)
    codes = pc.fill_null(positions, 0).to_numpy()
    label_list: list[str | None] = labels.to_pylist()
    group_of_cell = np.where(unlabelled, len(label_list), codes).astype(np.int32)
    if unlabelled.any():
        label_list.append(None)
    return Grouping(group_of_cell, tuple(label_list), matrix.dataset, f"column {column!r}")


def grouping_from_cells(
    matrix: CellAxis,
    cell_lists: Mapping[str, Sequence[str]],
    *,
    others_label: str | None = None,
) -> Grouping:
    """One group per list of cell ids; cells in no list go to `others_label` (or no group)."""
    group_of_cell = np.full(matrix.cell_count, NO_GROUP, dtype=np.int32)
    all_ids = matrix.cells.column(CELL_COLUMN)
    labels: list[str | None] = []
    for group_id, (label, cell_ids) in enumerate(cell_lists.items()):
        wanted = pa.array([str(cell) for cell in cell_ids], type=pa.string())
        positions = pc.index_in(wanted, value_set=all_ids)
        if positions.null_count:
            unknown = wanted.filter(positions.is_null())
            raise GenesInputError(
                f"dataset {matrix.dataset!r}: the cells of group {label!r} include "
                f"{len(unknown)} ids the dataset does not have, first {unknown[0].as_py()!r}"
            )
        indexes = positions.to_numpy()
        taken = group_of_cell[indexes] != NO_GROUP
        if taken.any():
            other = labels[group_of_cell[indexes][taken][0]]
            raise GenesInputError(
                f"dataset {matrix.dataset!r}: {int(taken.sum())} cells are in both group "
                f"{other!r} and group {label!r}, first {wanted[int(np.flatnonzero(taken)[0])]}; "
                "groups compared by a t-test must not share cells"
            )
        group_of_cell[indexes] = group_id
        labels.append(str(label))
    if others_label is not None:
        group_of_cell[group_of_cell == NO_GROUP] = len(labels)
        labels.append(others_label)
    return Grouping(group_of_cell, tuple(labels), matrix.dataset, "the cell lists")
