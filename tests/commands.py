"""The ``quarry`` command as a user runs it, for tests of the command line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_quarry(
    *args: str, cwd: Path, check: bool = True, timeout: float = 300
) -> subprocess.CompletedProcess:
    """``python -m quarry ARGS`` in ``cwd``, bounded by ``timeout``; with ``check``, a failure
    fails the test with what the command printed."""
    done = subprocess.run(
        [sys.executable, "-m", "quarry", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200"},
    )
    if check:
        assert done.returncode == 0, f"exit {done.returncode}\n{done.stderr}{done.stdout}"
    return done
