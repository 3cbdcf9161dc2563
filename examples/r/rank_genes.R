#!/usr/bin/env Rscript
# Rank genes by differential expression on a quarry cluster, from R, through reticulate.
#
#   RETICULATE_PYTHON=.venv/bin/python Rscript examples/r/rank_genes.R \
#       DATASET GROUPBY GROUP [REFERENCE] [OUTPUT.csv]
#
# DATASET is an expression matrix stored with quarry.genes.ingest (or `quarry ingest --format
# h5ad`), GROUPBY a cell metadata column, GROUP one of its labels, REFERENCE "rest" (default)
# or another label. The cluster is found like every quarry command finds it: $QUARRY_CLUSTER,
# else .quarry/cluster.json (written by `quarry up`). With OUTPUT.csv every gene is written
# there; the top 10 are printed either way, with what moved between devices and host.

suppressPackageStartupMessages(library(reticulate))

args <- commandArgs(trailingOnly = TRUE)
if (length(args) < 3) {
  stop("usage: rank_genes.R DATASET GROUPBY GROUP [REFERENCE] [OUTPUT.csv]", call. = FALSE)
}
dataset <- args[[1]]
groupby <- args[[2]]
group <- args[[3]]
reference <- if (length(args) >= 4) args[[4]] else "rest"
output <- if (length(args) >= 5) args[[5]] else NA

if (Sys.getenv("RETICULATE_PYTHON") == "") {
  stop("set RETICULATE_PYTHON to the python of quarry's environment (.venv/bin/python)",
       call. = FALSE)
}

quarry <- import("quarry")
# convert = FALSE keeps the pandas DataFrame as it is, attrs included; columns convert below.
genes <- import("quarry.genes", convert = FALSE)

cluster_file <- Sys.getenv("QUARRY_CLUSTER", ".quarry/cluster.json")
cluster <- quarry$connect(cluster_file)

ranked_py <- genes$rank_genes(cluster, dataset, groupby = groupby, group = group,
                              reference = reference, method = "welch")
# Column by column through plain Python lists: reticulate's own pandas conversion depends on
# the pandas and numpy versions it was built against; lists convert the same everywhere.
columns <- c("names", "scores", "pvals", "pvals_adj", "logfoldchanges")
ranked <- data.frame(
  lapply(setNames(columns, columns),
         function(column) unlist(py_to_r(py_get_item(ranked_py, column)$tolist()))),
  stringsAsFactors = FALSE
)
moved <- py_to_r(py_get_item(ranked_py$attrs, "quarry"))
metadata <- py_to_r(py_get_item(ranked_py$attrs, "metadata"))
cluster$close()

cat(sprintf("%s: %s %s vs %s, %d genes\n", dataset, groupby, group, reference, nrow(ranked)))
print(head(ranked, 10), row.names = FALSE)
cat(sprintf("shipped %d bytes to the host, read %d bytes on the devices, %.3f s\n",
            as.integer(moved$bytes_shipped), as.integer(moved$bytes_read), moved$wall_s))
if (length(metadata) > 0) {
  cat("metadata:", paste(names(metadata), unlist(metadata), sep = "=", collapse = ", "), "\n")
}
if (!is.na(output)) {
  write.csv(ranked, output, row.names = FALSE)
}
