"""`quarry de` (differential expression) and the expression-matrix side of `quarry ingest`.

The main CLI mounts `de` as `quarry de`. All three commands run on their own as
`python -m quarry.genes.cli de ...` / `ingest ...` / `drop ...`. The cluster is found like every
quarry command finds it (`quarry.cli_common.cluster_file`): `--cluster FILE`, else
$QUARRY_CLUSTER, else `.quarry/cluster.json` (written by `quarry up`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from quarry.cli_common import (
    ClusterOption,
    JsonOption,
    ReflowedHelp,
    console,
    human_bytes,
    open_cluster,
    print_json,
    run,
)
from quarry.errors import QuarryError
from quarry.pushdown import Pushdown

app = typer.Typer(
    cls=ReflowedHelp,
    help="Single-cell expression matrices: store them, rank genes by differential expression.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

TOP_DEFAULT = 20


@app.callback()
def _group() -> None:
    """Keeps `de` a sub-command even while it is this app's only command that matters."""


@app.command()
def de(
    dataset: Annotated[str, typer.Argument(help="expression matrix, DOMAIN/NAME")],
    group: Annotated[str | None, typer.Option(help="group label (of --groupby)")] = None,
    groupby: Annotated[str | None, typer.Option(help="cell metadata column of the labels")] = None,
    reference: Annotated[str, typer.Option(help="'rest', or a label")] = "rest",
    method: Annotated[str, typer.Option(help="welch or student")] = "welch",
    pushdown: Annotated[str, typer.Option(help="auto, always or never (host only)")] = (
        Pushdown.AUTO
    ),
    group_cells: Annotated[
        Path | None, typer.Option(help="file of cell ids (one per line) instead of --group")
    ] = None,
    reference_cells: Annotated[
        Path | None, typer.Option(help="file of cell ids (one per line) as the reference")
    ] = None,
    reference_dataset: Annotated[
        str | None, typer.Option(help="compare with a group of this matrix")
    ] = None,
    reference_groupby: Annotated[
        str | None, typer.Option(help="label column of the reference (default --groupby)")
    ] = None,
    top: Annotated[int, typer.Option(help="genes shown (0: all)")] = TOP_DEFAULT,
    output: Annotated[Path | None, typer.Option(help="write every gene to this CSV")] = None,
    as_json: JsonOption = False,
    cluster: ClusterOption = None,
) -> None:
    """Rank genes by a t-test of one group of cells against the rest, another group, or a
    group of another matrix; devices accumulate, the host runs the t-test."""
    from quarry.genes.rank import rank_genes

    if top < 0:
        raise typer.BadParameter("--top must be 0 (all) or more")
    group_spec: Any = _cell_list(group_cells) if group_cells is not None else group
    reference_spec: Any = _cell_list(reference_cells) if reference_cells is not None else reference
    c = open_cluster(cluster)
    try:
        frame = rank_genes(
            c,
            dataset,
            groupby,
            group_spec,
            reference_spec,
            method,  # type: ignore[arg-type]
            pushdown=pushdown,  # type: ignore[arg-type]
            reference_dataset=reference_dataset,
            reference_groupby=reference_groupby,
        )
    finally:
        c.close()
    if output is not None:
        frame.to_csv(output, index=False)
    shown = frame if top == 0 else frame.head(top)
    stats = frame.attrs["quarry"]
    if as_json:
        body = {
            "dataset": dataset,
            "group": group if group_cells is None else f"{len(group_spec)} cells",
            "reference": reference if reference_cells is None else f"{len(reference_spec)} cells",
            "method": method,
            "genes": len(frame),
            "results": [_json_row(row) for row in shown.to_dict(orient="records")],
            "metadata": frame.attrs["metadata"],
            "quarry": {k: v for k, v in stats.items() if k != "datasets"},
        }
        print_json(body)
        return
    table = Table(title=f"{dataset}: {group or 'cells'} vs {reference} ({method})")
    for column in ("names", "scores", "pvals", "pvals_adj", "logfoldchanges"):
        table.add_column(column, justify="left" if column == "names" else "right")
    for row in shown.itertuples(index=False):
        table.add_row(
            str(row.names),
            f"{row.scores:.4g}",
            f"{row.pvals:.3g}",
            f"{row.pvals_adj:.3g}",
            f"{row.logfoldchanges:.3g}",
        )
    console.print(table)
    console.print(
        f"{len(frame):,} genes; shipped {human_bytes(stats['bytes_shipped'])} to the host, "
        f"read {human_bytes(stats['bytes_read'])} on devices; slices executed "
        f"{stats['slices_executed']}, pushed back {stats['slices_pushed_back']}, cached "
        f"{stats['slices_cached']}; {stats['wall_s']:.2f} s",
        highlight=False,
    )


@app.command()
def ingest(
    path: Annotated[Path, typer.Argument(help=".h5ad file, 10x directory, or TSV/CSV")],
    dataset: Annotated[str, typer.Option(help="DOMAIN/NAME")],
    format: Annotated[str | None, typer.Option(help="h5ad, mtx or tsv (default: guessed)")] = None,
    cell_metadata: Annotated[
        Path | None, typer.Option(help="table of cell metadata, joined by cell id")
    ] = None,
    orientation: Annotated[str, typer.Option(help="genes (rows) or cells (pivoted)")] = "genes",
    metadata: Annotated[
        list[str] | None, typer.Option(help="KEY=VALUE custom metadata (repeatable)")
    ] = None,
    replicas: Annotated[int, typer.Option(help="copies of each partition")] = 1,
    compression: Annotated[str, typer.Option(help="zstd, lz4 or none")] = "none",
    blocks: Annotated[
        bool,
        typer.Option(help="read an .h5ad a block of genes at a time (a matrix larger than memory)"),
    ] = False,
    order_by: Annotated[
        str | None,
        typer.Option(
            help="store the cells in the order of these cell metadata columns, comma-separated "
            "(cells a filter selects together are read together; answers keep the file's order)"
        ),
    ] = None,
    cluster: ClusterOption = None,
) -> None:
    """Store an expression matrix with its cell and gene metadata."""
    from quarry.genes.datasets import ingest as ingest_matrix
    from quarry.genes.errors import GenesInputError
    from quarry.genes.h5ad_blocks import read_h5ad_blocks

    pairs = dict(_key_value(item) for item in metadata or [])
    if blocks and (cell_metadata is not None or orientation != "genes"):
        raise GenesInputError("--blocks stores by genes, with the .h5ad's own cell metadata")
    source = read_h5ad_blocks(path, dataset=str(path)) if blocks else path
    c = open_cluster(cluster)
    try:
        stored = ingest_matrix(
            c,
            source,
            dataset,
            format=format,
            cell_metadata=cell_metadata,  # type: ignore[arg-type]
            orientation=orientation,
            metadata=pairs,
            replicas=replicas,  # type: ignore[arg-type]
            compression=compression,
            order_by=[c.strip() for c in order_by.split(",") if c.strip()] if order_by else None,
        )
    finally:
        c.close()
    console.print(
        f"stored {stored.dataset}: {stored.gene_count:,} genes x {stored.cell_count:,} cells, "
        f"{human_bytes(stored.entry.bytes_stored)} in {len(stored.entry.partitions)} partitions "
        f"(version {stored.version})",
        highlight=False,
    )


@app.command()
def get(
    source: Annotated[str, typer.Argument(help="expression matrix or collection, DOMAIN/NAME")],
    output: Annotated[Path, typer.Option(help="write the selection to this .h5ad file")],
    obs: Annotated[
        str | None, typer.Option(help="SQL WHERE filter over the cell metadata columns")
    ] = None,
    var: Annotated[
        str | None, typer.Option(help="SQL WHERE filter over the gene metadata columns")
    ] = None,
    genes: Annotated[
        str | None, typer.Option(help="gene names, comma-separated (instead of --var)")
    ] = None,
    columns: Annotated[
        str | None, typer.Option(help="cell metadata columns to keep, comma-separated")
    ] = None,
    pushdown: Annotated[str, typer.Option(help="auto, always or never (host only)")] = (
        Pushdown.AUTO
    ),
    as_json: JsonOption = False,
    cluster: ClusterOption = None,
) -> None:
    """Cells matching --obs and genes matching --var (or --genes), as an .h5ad file: the
    devices read only the slices holding the selection and ship only its values."""
    from quarry.genes.query import query

    if var is not None and genes is not None:
        raise typer.BadParameter("give --var (a filter) or --genes (names), not both")
    selection: Any = _split(genes) if genes is not None else var
    c = open_cluster(cluster)
    try:
        planned = query(
            c,
            source,
            obs,
            selection,
            columns=_split(columns) if columns is not None else None,
            pushdown=pushdown,  # type: ignore[arg-type]
        )
        adata = planned.to_anndata()
    finally:
        c.close()
    adata.write_h5ad(output)
    report = planned.report
    if as_json:
        print_json({"source": source, "output": str(output), "quarry": report.to_json()})
        return
    console.print(
        f"wrote {output}: {adata.n_obs:,} cells x {adata.n_vars:,} genes "
        f"({report.values_selected:,} values); read {human_bytes(report.bytes_read)} of "
        f"{human_bytes(report.bytes_matrix)} on the devices, shipped "
        f"{human_bytes(report.bytes_shipped)}; slices pruned {report.slices_pruned} of "
        f"{report.slices_total}; {report.wall_s:.2f} s",
        highlight=False,
    )


def _split(names: str) -> list[str]:
    return [n.strip() for n in names.split(",") if n.strip()]


@app.command()
def collect(
    name: Annotated[str, typer.Argument(help="the collection, DOMAIN/NAME")],
    members: Annotated[list[str], typer.Argument(help="stored matrices sharing one gene space")],
    columns: Annotated[
        str | None, typer.Option(help="cell metadata columns it shows (default: the shared ones)")
    ] = None,
    cluster: ClusterOption = None,
) -> None:
    """Group stored matrices with the same genes as one collection: `get`, `de` statistics and
    pseudobulk then run over all of them."""
    from quarry.genes.collections import collect as collect_matrices

    c = open_cluster(cluster)
    try:
        matrices = collect_matrices(
            c, name, members, obs_columns=_split(columns) if columns is not None else None
        )
    finally:
        c.close()
    cells = sum(m.cell_count for m in matrices)
    console.print(
        f"collected {name}: {len(matrices)} matrices, {cells:,} cells x "
        f"{matrices[0].gene_count:,} genes",
        highlight=False,
    )


@app.command()
def drop(
    dataset: Annotated[str, typer.Argument(help="expression matrix, DOMAIN/NAME")],
    cluster: ClusterOption = None,
) -> None:
    """Remove a matrix, its cell and gene metadata, and the devices' cached statistics."""
    from quarry.genes.datasets import drop as drop_matrix

    c = open_cluster(cluster)
    try:
        deleted = drop_matrix(c, dataset)
    finally:
        c.close()
    console.print(f"dropped {dataset} ({deleted:,} key-values)")


def _cell_list(path: Path) -> list[str]:
    if not path.is_file():
        raise QuarryError(f"no cell id file {path}: give a file with one cell id per line")
    cells = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    if not cells:
        raise QuarryError(f"{path} lists no cell ids")
    return cells


def _key_value(item: str) -> tuple[str, str]:
    if "=" not in item:
        raise typer.BadParameter(f"--metadata takes KEY=VALUE, got {item!r}")
    key, value = item.split("=", 1)
    return key.strip(), value


def _json_row(row: dict[str, Any]) -> dict[str, Any]:
    # JSON has no NaN: a fold change of negative (scaled) means is null, as in pandas' to_json.
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}


def main() -> None:
    run(app)


if __name__ == "__main__":
    main()
