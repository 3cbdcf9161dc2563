"""Fault injection, for tests of what happens when a device dies at a precise moment.

A device whose environment names a file in ``$QUARRY_FAULT_FILE`` reads it at each fault point;
when the file says ``<device>:<point>``, that device exits at once, as a crash would (no
cleanup, no answer). Points: ``prepare`` (a partition is durable, pending, not yet answered)
and ``commit`` (asked to commit, before committing). Without the variable nothing is read.
"""

from __future__ import annotations

import os

from quarry import settings

CRASH_EXIT_CODE = 137  # what a SIGKILL looks like to a parent


def hit(device: str, point: str) -> None:
    path = settings.FAULT_FILE.get()
    if path is None:
        return
    try:
        with open(path) as file:
            armed = file.read().strip()
    except OSError:
        return
    if armed == f"{device}:{point}":
        os._exit(CRASH_EXIT_CODE)
