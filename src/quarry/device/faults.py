"""Fault injection, for tests of what happens when a device fails at a precise moment.

A device whose environment names a file in ``$QUARRY_FAULT_FILE`` reads it at each fault point;
when the file says ``<device>:<point>``, that device fails there. Points where it exits at once,
as a crash would (no cleanup, no answer): ``prepare`` (a partition is durable, pending, not yet
answered) and ``commit`` (asked to commit, before committing). A point where an error is raised
as its engine would raise it: ``stage`` (about to run a stage over a chunk: ``StageFailed``, so
the device hands the range back and quarantines the plan's shape). Without the variable nothing
is read.
"""

from __future__ import annotations

import os

from quarry import settings
from quarry.errors import StageFailed

CRASH_EXIT_CODE = 137  # what a SIGKILL looks like to a parent


def _armed(device: str, point: str) -> bool:
    path = settings.FAULT_FILE.get()
    if path is None:
        return False
    try:
        with open(path) as file:
            armed = file.read().strip()
    except OSError:
        return False
    return armed == f"{device}:{point}"


def hit(device: str, point: str) -> None:
    """Crash here if the fault file says so."""
    if _armed(device, point):
        os._exit(CRASH_EXIT_CODE)


def stage(device: str) -> None:
    """Fail the stage about to run if the fault file says ``<device>:stage``."""
    if _armed(device, "stage"):
        raise StageFailed(f"fault injected: a stage failed on device {device}")
