"""Errors a user of `quarry.genes` can act on.

Every message names the dataset (or file), and the column, group or count that was wrong, so
a biologist can fix the input without reading quarry's source.
"""

from __future__ import annotations

from typing import Any

from quarry.errors import QuarryError


class GenesInputError(QuarryError, ValueError):
    """An expression matrix, its metadata or a differential-expression request is invalid."""

    code = "genes_input"


class StaleDataset(QuarryError):
    """A request named a version of a dataset that the device no longer holds (re-ingested)."""

    code = "genes_stale_dataset"


def check_same_ingest(meta: Any, request: Any, ingest_ids: tuple[str, ...]) -> None:
    """Every gene unit's first step on a device: the partition it holds (``meta``) is of an
    ingest the host asked about (``ingest_ids``), else ``StaleDataset``: it was re-ingested
    since the host read the catalog, and the host asks again."""
    if meta.ingest["id"] not in ingest_ids:
        raise StaleDataset(
            f"{request.domain}/{request.dataset} partition {meta.partition} on this device "
            "belongs to another ingest than the one the host asked about (it was re-ingested); "
            "ask again"
        )
