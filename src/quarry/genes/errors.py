"""Errors a user of `quarry.genes` can act on.

Every message names the dataset (or file), and the column, group or count that was wrong, so
a biologist can fix the input without reading quarry's source.
"""

from __future__ import annotations

from quarry.errors import QuarryError


class GenesInputError(QuarryError, ValueError):
    """An expression matrix, its metadata or a differential-expression request is invalid."""

    code = "genes_input"


class StaleDataset(QuarryError):
    """A request named a version of a dataset that the device no longer holds (re-ingested)."""

    code = "genes_stale_dataset"
