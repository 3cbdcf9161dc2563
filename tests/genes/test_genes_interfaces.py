"""The ways biologists reach differential expression: the `de` command and R (reticulate)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from quarry import genes
from quarry.genes.cli import app

ROOT = Path(__file__).resolve().parents[2]
R_EXAMPLE = ROOT / "examples" / "r" / "rank_genes.R"
R_QUERY_EXAMPLE = ROOT / "examples" / "r" / "query_cells.R"
R_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def cluster_env(genes_cluster, stored_pbmc) -> dict[str, str]:
    return {"QUARRY_CLUSTER": str(genes_cluster.cluster_file)}


def test_de_prints_the_top_genes_and_what_moved(genes_cluster, stored_pbmc, cluster_env):
    result = CliRunner().invoke(
        app,
        ["de", "bio/pbmc", "--groupby", "louvain", "--group", "3", "--top", "5"],
        env=cluster_env,
    )
    assert result.exit_code == 0, result.output
    expected = genes.rank_genes(genes_cluster, "bio/pbmc", "louvain", "3")
    for name in expected["names"][:5]:
        assert name in result.output
    assert "765 genes; shipped" in result.output


def test_de_json_and_csv(genes_cluster, stored_pbmc, tmp_path):
    output = tmp_path / "ranked.csv"
    result = CliRunner().invoke(
        app,
        [
            "de",
            "bio/pbmc",
            "--groupby",
            "louvain",
            "--group",
            "2",
            "--reference",
            "5",
            "--method",
            "student",
            "--pushdown",
            "never",
            "--json",
            "--output",
            str(output),
            "--cluster",
            str(genes_cluster.cluster_file),
        ],
    )
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    expected = genes.rank_genes(
        genes_cluster, "bio/pbmc", "louvain", "2", reference="5", method="student"
    )
    assert [row["names"] for row in body["results"]] == list(expected["names"][:20])
    assert body["quarry"]["pushdown"] == "never" and body["quarry"]["slices_executed"] == 0
    assert body["metadata"]["lab"] == "10x Genomics"
    written = pd.read_csv(output)
    assert list(written["names"]) == list(expected["names"])
    np.testing.assert_allclose(written["scores"], expected["scores"], rtol=1e-12)


def test_de_with_cell_files(genes_cluster, stored_pbmc, tmp_path, cluster_env):
    group, reference = tmp_path / "group.txt", tmp_path / "reference.txt"
    group.write_text("\n".join(stored_pbmc.cell_ids[:30]) + "\n")
    reference.write_text("\n".join(stored_pbmc.cell_ids[30:90]) + "\n")
    result = CliRunner().invoke(
        app,
        [
            "de",
            "bio/pbmc",
            "--group-cells",
            str(group),
            "--reference-cells",
            str(reference),
            "--json",
        ],
        env=cluster_env,
    )
    assert result.exit_code == 0, result.output
    expected = genes.rank_genes(
        genes_cluster,
        "bio/pbmc",
        group=list(stored_pbmc.cell_ids[:30]),
        reference=list(stored_pbmc.cell_ids[30:90]),
    )
    assert json.loads(result.output)["results"][0]["names"] == expected["names"][0]


def test_de_runs_as_a_module_and_errors_name_the_group(genes_cluster, stored_pbmc, cluster_env):
    command = [
        sys.executable,
        "-m",
        "quarry.genes.cli",
        "de",
        "bio/pbmc",
        "--groupby",
        "louvain",
        "--group",
        "42",
    ]
    done = subprocess.run(
        command, env={**os.environ, **cluster_env}, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    assert "column 'louvain' has no group '42'" in " ".join(done.stderr.split())


def test_ingest_file_reads_the_format_it_is_told(genes_cluster, pbmc_adata, tmp_path):
    path = tmp_path / "pbmc.h5ad"
    pbmc_adata.write_h5ad(path)
    stored = genes.ingest_file(genes_cluster, path, "files/pbmc", "h5ad")
    assert (stored.gene_count, stored.cell_count) == (765, 700)
    result = CliRunner().invoke(
        app, ["drop", "files/pbmc", "--cluster", str(genes_cluster.cluster_file)]
    )
    assert result.exit_code == 0, result.output
    genes_cluster.refresh()  # the command dropped it through its own connection
    assert not [e for e in genes_cluster.datasets() if e.dataset.startswith("files/")]
    with pytest.raises(genes.GenesInputError, match="'parquet' is not an expression matrix"):
        genes.ingest_file(genes_cluster, path, "files/pbmc", "parquet")


def test_ingest_blocks_stores_an_h5ad_a_block_of_genes_at_a_time(
    genes_cluster, stored_pbmc, pbmc_adata, tmp_path
):
    """`quarry genes ingest --blocks`: the same matrix as a whole read, never held whole."""
    path = tmp_path / "pbmc.h5ad"
    pbmc_adata.write_h5ad(path)
    where = ["--cluster", str(genes_cluster.cluster_file)]
    command = ["ingest", str(path), "--dataset", "files/blocks", "--blocks", *where]
    result = CliRunner().invoke(app, command)
    assert result.exit_code == 0, result.output
    assert "765 genes x 700 cells" in result.output
    genes_cluster.refresh()
    try:
        by_blocks = genes.rank_genes(genes_cluster, "files/blocks", "louvain", "3")
        whole = genes.rank_genes(genes_cluster, "bio/pbmc", "louvain", "3")
        assert list(by_blocks["names"]) == list(whole["names"])
        np.testing.assert_allclose(by_blocks["scores"], whole["scores"], rtol=1e-12)
    finally:
        CliRunner().invoke(app, ["drop", "files/blocks", *where])
        genes_cluster.refresh()
    refused = CliRunner().invoke(app, [*command, "--orientation", "cells"])
    assert refused.exit_code != 0
    assert isinstance(refused.exception, genes.GenesInputError)
    assert "--blocks stores by genes" in str(refused.exception)


# Decided at collection, before any cluster starts: a machine without R skips in one line.
R_MISSING = (
    "Rscript is not on the PATH: `make r` (or scripts/install-r.sh, as root) installs Debian's "
    "r-base-core and r-cran-reticulate to run it"
)


@pytest.mark.skipif(shutil.which("Rscript") is None, reason=R_MISSING)
def test_the_r_example_ranks_genes_through_reticulate(genes_cluster, stored_pbmc, tmp_path):
    rscript = shutil.which("Rscript")
    assert rscript is not None
    output = tmp_path / "ranked.csv"
    env = {
        **os.environ,
        "QUARRY_CLUSTER": str(genes_cluster.cluster_file),
        "RETICULATE_PYTHON": sys.executable,
    }
    done = subprocess.run(
        [rscript, str(R_EXAMPLE), "bio/pbmc", "louvain", "3", "rest", str(output)],
        env=env,
        capture_output=True,
        text=True,
        timeout=R_TIMEOUT_S,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert "bio/pbmc: louvain 3 vs rest, 765 genes" in done.stdout
    assert "shipped" in done.stdout and "lab=10x Genomics" in done.stdout
    from_r = pd.read_csv(output)
    expected = genes.rank_genes(genes_cluster, "bio/pbmc", "louvain", "3")
    assert list(from_r["names"]) == list(expected["names"])
    # write.csv keeps 13 to 15 significant digits.
    np.testing.assert_allclose(from_r["scores"], expected["scores"], rtol=1e-11)
    np.testing.assert_allclose(from_r["pvals_adj"], expected["pvals_adj"], rtol=1e-11)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("Rscript") is None, reason=R_MISSING)
def test_the_r_example_queries_cells_through_reticulate(genes_cluster, stored_pbmc, tmp_path):
    rscript = shutil.which("Rscript")
    assert rscript is not None
    output = tmp_path / "cells.csv"
    env = {
        **os.environ,
        "QUARRY_CLUSTER": str(genes_cluster.cluster_file),
        "RETICULATE_PYTHON": sys.executable,
    }
    obs = "louvain = '3' AND n_genes > 800"
    done = subprocess.run(
        [rscript, str(R_QUERY_EXAMPLE), "bio/pbmc", obs, "CD3D,NKG7", str(output)],
        env=env,
        capture_output=True,
        text=True,
        timeout=R_TIMEOUT_S,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert "bio/pbmc: " in done.stdout and "slices pruned" in done.stdout
    from_r = pd.read_csv(output)
    expected = genes.query(genes_cluster, "bio/pbmc", obs, ["CD3D", "NKG7"]).to_anndata()
    assert list(from_r["cell"]) == list(expected.obs_names)
    np.testing.assert_allclose(from_r[["CD3D", "NKG7"]].to_numpy(), expected.X.toarray(), rtol=1e-6)
