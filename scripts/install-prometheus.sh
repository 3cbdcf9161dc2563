#!/usr/bin/env bash
# Installs Prometheus from Debian's packages, for the test that has a real Prometheus scrape a
# local cluster (tests/device/test_prometheus.py). Does nothing when `prometheus` is already on
# the PATH. Needs root (CI runs as root) or sudo. The package's service is left stopped: the
# test starts its own Prometheus, on a loopback port, with a storage folder of its own.
set -euo pipefail

bash "$(dirname "$0")/debian-package.sh" install-prometheus prometheus prometheus
# where systemd runs, the package's service stays disabled too
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
