#!/usr/bin/env bash
# Installs R and reticulate from Debian's packages, for examples/r and the R test in tests/genes.
# Does nothing when Rscript is already on the PATH. Needs root (CI runs as root) or sudo.
set -euo pipefail
exec bash "$(dirname "$0")/debian-package.sh" install-r Rscript r-base-core r-cran-reticulate
