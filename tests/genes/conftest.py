"""pbmc68k_reduced, the dataset that ships inside scanpy, and scanpy's own ranking of it."""

from __future__ import annotations

import socket
import warnings

import pytest

from quarry.genes import ExpressionMatrix, read_h5ad


@pytest.fixture(scope="session")
def pbmc_adata():
    """scanpy.datasets.pbmc68k_reduced(), loaded with the network switched off."""
    import scanpy as sc

    def refuse(*args, **kwargs):
        raise AssertionError("pbmc68k_reduced must load from the scanpy package, not the network")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "connect", refuse)
        patch.setattr(socket, "create_connection", refuse)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            adata = sc.datasets.pbmc68k_reduced()
    return adata


@pytest.fixture(scope="session")
def pbmc_matrix(pbmc_adata) -> ExpressionMatrix:
    return read_h5ad(pbmc_adata, dataset="pbmc68k_reduced")


@pytest.fixture(scope="session")
def scanpy_ranking(pbmc_adata) -> dict:
    """scanpy's t-test (Welch) of every louvain cluster vs rest, on X (scaled float32)."""
    import scanpy as sc

    adata = pbmc_adata.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sc.tl.rank_genes_groups(adata, "louvain", method="t-test", use_raw=False)
    return adata.uns["rank_genes_groups"]


# Devices with 64 KiB key-values: pbmc68k_reduced's 765 genes then fill dozens of slices, so
# slice ranges (push-back, caching) are exercised within partitions, not just across them.
SMALL_SLICES_PROFILE = """
[profiles.small_slices]
from = "host"
kv_bytes_max = 65536
"""


@pytest.fixture(scope="module")
def genes_cluster(tmp_path_factory):
    """Three real device processes (Flight over loopback) for one test module."""
    import quarry

    profiles = tmp_path_factory.mktemp("profiles") / "profiles.toml"
    profiles.write_text(SMALL_SLICES_PROFILE)
    with quarry.local(devices=3, profile="small_slices", profiles_file=str(profiles)) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def stored_pbmc(genes_cluster, pbmc_adata):
    """pbmc68k_reduced stored on the module's cluster as bio/pbmc, with custom metadata."""
    from quarry import genes

    return genes.ingest(genes_cluster, pbmc_adata, "bio/pbmc", metadata={"lab": "10x Genomics"})
