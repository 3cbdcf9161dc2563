"""Collections: stored matrices that share a gene space, queried and ranked as one matrix.

CELLxGENE Census keeps hundreds of datasets in one experiment: one gene space, one schema of
cell metadata, each dataset's cells stored on their own. A collection here is the same: a name
(`domain/name`) for a list of matrices stored with `genes.ingest`, each on its own devices, that
have the same genes in the same order, and the cell metadata columns they share (harmonized:
the columns every member has, or the ones named). Nothing is copied: the collection is a record
in the catalog (a one-row dataset whose metadata lists the members), and work over it is each
member's work on its own devices, combined on the host:

- axis queries (`genes.query`): each member's cells matching the filter, stacked in member
  order, with a `dataset` column in obs;
- moments, highly variable genes, t-tests and pseudobulk: each member's Accumulate under a
  grouping whose labels are the union of the members' labels, Combined across members (Combine
  is Chan's parallel update: partials of the same gene and group from different datasets merge
  as partials from different slices do);
- Wilcoxon's ranks need every cell of a gene in one ranking, which no member holds alone: it is
  refused over a collection, saying so.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from quarry.errors import DatasetExists, DatasetNotFound
from quarry.genes.errors import GenesInputError
from quarry.genes.matrix import CELL_COLUMN
from quarry.store import naming

if TYPE_CHECKING:
    from quarry.coordinator.cluster import Cluster
    from quarry.genes.datasets import StoredMatrix

COLLECTION_KEY = "quarry.genes.collection"
COLLECTION_FORMAT = 1
MEMBERS_MAX = 4096


def collect(
    cluster: Cluster,
    name: str,
    members: Sequence[str],
    *,
    obs_columns: Sequence[str] | None = None,
) -> list[StoredMatrix]:
    """Group stored matrices as the collection ``name``: they must have the same genes in the
    same order. ``obs_columns``: the cell metadata columns the collection shows (default: those
    every member has, in the first member's order). Returns the members."""
    from quarry.genes.datasets import open_matrix

    domain, short = naming.split_dataset(name)
    qualified = f"{domain}/{short}"
    if not 1 <= len(members) <= MEMBERS_MAX:
        raise GenesInputError(f"a collection holds 1 to {MEMBERS_MAX} matrices, not {len(members)}")
    cluster.refresh()
    if qualified in cluster.catalog:
        raise DatasetExists(
            f"{qualified} already exists: drop it first (quarry.genes.drop) or choose another name"
        )
    matrices = [open_matrix(cluster, member) for member in members]
    if len({m.dataset for m in matrices}) != len(matrices):
        raise GenesInputError(f"collection {qualified}: a matrix is listed twice")
    _check_gene_space(qualified, matrices)
    columns = _shared_columns(qualified, matrices, obs_columns)
    record = {
        "format": COLLECTION_FORMAT,
        "members": [m.dataset for m in matrices],
        "obs_columns": columns,
    }
    table = pa.table({"member": [m.dataset for m in matrices]})
    cluster.ingest(table, qualified, metadata={COLLECTION_KEY: json.dumps(record)})
    return matrices


def members_of(cluster: Cluster, source: str) -> tuple[list[StoredMatrix], list[str]]:
    """The matrices ``source`` names (itself, or a collection's members) and the cell metadata
    columns they show."""
    from quarry.genes.datasets import open_matrix

    domain, short = naming.split_dataset(source)
    qualified = f"{domain}/{short}"
    entry = cluster.catalog.get(qualified)
    if entry is None or COLLECTION_KEY not in entry.metadata:
        matrix = open_matrix(cluster, qualified)
        return [matrix], [c for c in matrix.cells.column_names if c != CELL_COLUMN]
    record = json.loads(entry.metadata[COLLECTION_KEY])
    if record.get("format") != COLLECTION_FORMAT:
        raise GenesInputError(f"collection {qualified} was made by another version; collect again")
    try:
        matrices = [open_matrix(cluster, member) for member in record["members"]]
    except DatasetNotFound as error:
        raise GenesInputError(
            f"collection {qualified} lists a matrix that is gone ({error}); drop the collection "
            "and collect its matrices again"
        ) from None
    _check_gene_space(qualified, matrices)
    return matrices, list(record["obs_columns"])


def is_collection(cluster: Cluster, source: str) -> bool:
    domain, short = naming.split_dataset(source)
    entry = cluster.catalog.get(f"{domain}/{short}")
    return entry is not None and COLLECTION_KEY in entry.metadata


def _check_gene_space(name: str, matrices: list[StoredMatrix]) -> None:
    first = matrices[0]
    for other in matrices[1:]:
        if other.gene_count != first.gene_count or not np.array_equal(
            other.gene_names, first.gene_names
        ):
            raise GenesInputError(
                f"collection {name}: {other.dataset} does not have the genes of "
                f"{first.dataset} in the same order ({other.gene_count} genes against "
                f"{first.gene_count}); a collection's matrices share one gene space"
            )


def _shared_columns(
    name: str, matrices: list[StoredMatrix], asked: Sequence[str] | None
) -> list[str]:
    present = [set(m.cells.column_names) - {CELL_COLUMN} for m in matrices]
    if asked is None:
        order = [c for c in matrices[0].cells.column_names if c != CELL_COLUMN]
        return [c for c in order if all(c in p for p in present)]
    for column in asked:
        lacking = [m.dataset for m, p in zip(matrices, present, strict=True) if column not in p]
        if lacking:
            raise GenesInputError(
                f"collection {name}: cell metadata column {column!r} is missing from {lacking}"
            )
    return list(asked)
