#!/usr/bin/env bash
# Installs Debian packages for a command the tests need, unless the command is already on the
# PATH: `debian-package.sh NAME COMMAND PACKAGE...` (install-r.sh, install-prometheus.sh).
# Needs root (CI runs as root) or sudo. No package's service is started while it installs
# (policy-rc.d 101): a test starts what it needs itself, on ports and folders of its own.
set -euo pipefail

name=$1 command=$2
shift 2

if command -v "$command" >/dev/null 2>&1; then
  echo "$name: $("$command" --version 2>&1 | head -n 1) already installed"
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
  echo "$name: $command is missing and this system has no apt-get;" \
       "install $* by hand and put $command on the PATH" >&2
  exit 1
fi

run_as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    echo "$name: installing $* needs root; run this as root or install sudo" >&2
    exit 1
  fi
}

export DEBIAN_FRONTEND=noninteractive
run_as_root apt-get update
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  run_as_root sh -c "printf '#!/bin/sh\nexit 101\n' > $policy && chmod +x $policy"
  trap 'run_as_root rm -f "$policy"' EXIT
fi
run_as_root apt-get install --yes --no-install-recommends "$@"
echo "$name: $("$command" --version 2>&1 | head -n 1) installed"
