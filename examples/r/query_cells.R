#!/usr/bin/env Rscript
# The cells matching a filter and the genes named, from a quarry cluster, in R, through
# reticulate: the devices read only the slices holding the selection and ship only its values.
#
#   RETICULATE_PYTHON=.venv/bin/python Rscript examples/r/query_cells.R \
#       DATASET OBS_FILTER GENE[,GENE...] [OUTPUT.csv]
#
# DATASET is an expression matrix (or a collection) stored with quarry.genes, OBS_FILTER a SQL
# WHERE expression over its cell metadata ("louvain = '3' AND n_genes > 800"), then the gene
# names. The cluster is found like every quarry command finds it: $QUARRY_CLUSTER, else
# .quarry/cluster.json. With OUTPUT.csv one row per cell is written there (its id, then one
# column per gene); a summary is printed either way, with what was read and shipped.

suppressPackageStartupMessages(library(reticulate))

args <- commandArgs(trailingOnly = TRUE)
if (length(args) < 3) {
  stop("usage: query_cells.R DATASET OBS_FILTER GENE[,GENE...] [OUTPUT.csv]", call. = FALSE)
}
dataset <- args[[1]]
obs_filter <- args[[2]]
gene_names <- strsplit(args[[3]], ",", fixed = TRUE)[[1]]
output <- if (length(args) >= 4) args[[4]] else NA

if (Sys.getenv("RETICULATE_PYTHON") == "") {
  stop("set RETICULATE_PYTHON to the python of quarry's environment (.venv/bin/python)",
       call. = FALSE)
}

quarry <- import("quarry")
genes <- import("quarry.genes", convert = FALSE)
cluster <- quarry$connect(Sys.getenv("QUARRY_CLUSTER", ".quarry/cluster.json"))

selection <- genes$query(cluster, dataset, obs = obs_filter, var = as.list(gene_names))
adata <- selection$to_anndata()
# Through plain Python lists: they convert the same whatever numpy and pandas reticulate meets.
cells <- unlist(py_to_r(adata$obs_names$tolist()))
found <- unlist(py_to_r(adata$var_names$tolist()))
values <- py_to_r(adata$X$toarray()$tolist())
expression <- if (length(cells) == 0) {
  matrix(numeric(0), nrow = 0, ncol = length(found))
} else {
  do.call(rbind, lapply(values, unlist))
}
colnames(expression) <- found
table <- data.frame(cell = cells, expression, check.names = FALSE, stringsAsFactors = FALSE)
report <- py_to_r(selection$report$to_json())
cluster$close()

cat(sprintf("%s: %d cells x %d genes\n", dataset, length(cells), length(found)))
print(head(table, 5), row.names = FALSE)
cat(sprintf("read %.0f of %.0f bytes on the devices, shipped %.0f; %d of %d slices pruned\n",
            report$bytes_read, report$bytes_matrix, report$bytes_shipped,
            as.integer(report$slices_pruned), as.integer(report$slices_total)))
if (!is.na(output)) {
  write.csv(table, output, row.names = FALSE)
}
