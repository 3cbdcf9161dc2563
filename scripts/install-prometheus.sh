#!/usr/bin/env bash
# Installs Prometheus from Debian's packages, for the test that has a real Prometheus scrape a
# local cluster (tests/device/test_prometheus.py). Does nothing when `prometheus` is already on
# the PATH. Needs root (CI runs as root) or sudo. The package's service is left stopped: the
# test starts its own Prometheus, on a loopback port, with a storage folder of its own.
set -euo pipefail

if command -v prometheus >/dev/null 2>&1; then
  echo "install-prometheus: $(prometheus --version 2>&1 | head -n 1) already installed"
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-prometheus: prometheus is missing and this system has no apt-get;" \
       "install Prometheus (2.x) by hand and put it on the PATH" >&2
  exit 1
fi

run_as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    echo "install-prometheus: installing Prometheus needs root; run this script as root or" \
         "install sudo" >&2
    exit 1
  fi
}

export DEBIAN_FRONTEND=noninteractive
run_as_root apt-get update
# policy-rc.d 101: the package's own service is not started (nothing would scrape for it, and
# it would hold port 9090); where systemd runs, it stays disabled too.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  run_as_root sh -c "printf '#!/bin/sh\nexit 101\n' > $policy && chmod +x $policy"
  trap 'run_as_root rm -f "$policy"' EXIT
fi
run_as_root apt-get install --yes --no-install-recommends prometheus
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  run_as_root systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
echo "install-prometheus: $(prometheus --version 2>&1 | head -n 1) installed"
