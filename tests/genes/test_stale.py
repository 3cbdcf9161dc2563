"""A gene unit refuses a partition re-ingested since the host read the catalog, naming it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from quarry.genes.errors import StaleDataset, check_same_ingest


def test_a_partition_of_another_ingest_is_refused_naming_it():
    request = SimpleNamespace(domain="bio", dataset="pbmc")
    meta = SimpleNamespace(ingest={"id": "new"}, partition=3)
    check_same_ingest(SimpleNamespace(ingest={"id": "old"}, partition=3), request, ("old",))
    with pytest.raises(StaleDataset, match=r"bio/pbmc partition 3 .*re-ingested\); ask again"):
        check_same_ingest(meta, request, ("old",))
