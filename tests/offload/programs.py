"""Running a test's program two ways: plainly with Python, and under ``quarry run``."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from typing import Any

from quarry.offload.run import run


def plain(script: Any, args: list[str]) -> str:
    """What ``python SCRIPT ARGS`` prints."""
    done = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def under_quarry(script: Any, cluster: Any, args: list[str], **options: Any) -> str:
    """What ``quarry run SCRIPT ARGS`` prints (``options``: run's); a ``report`` list given in
    ``options`` gets what the devices did."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        run(script, cluster, args, **options)
    return out.getvalue()
