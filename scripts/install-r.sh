#!/usr/bin/env bash
# Installs R and reticulate from Debian's packages, for examples/r and the R test in tests/genes.
# Does nothing when Rscript is already on the PATH. Needs root (CI runs as root) or sudo.
set -euo pipefail

if command -v Rscript >/dev/null 2>&1; then
  echo "install-r: $(Rscript --version 2>&1 | head -n 1) already installed"
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-r: Rscript is missing and this system has no apt-get;" \
       "install R (r-base-core) and the reticulate package by hand" >&2
  exit 1
fi

run_as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    echo "install-r: installing R needs root; run this script as root or install sudo" >&2
    exit 1
  fi
}

export DEBIAN_FRONTEND=noninteractive
run_as_root apt-get update
run_as_root apt-get install --yes --no-install-recommends r-base-core r-cran-reticulate
echo "install-r: $(Rscript --version 2>&1 | head -n 1) installed"
