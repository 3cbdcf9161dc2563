"""A local cluster's devices live as long as the program that started them, even one killed
before it could stop them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

PROGRAM = """
import sys, time
import quarry
with quarry.local(devices=2) as cluster:
    print(" ".join(str(spec.pid) for spec in cluster.specs), flush=True)
    time.sleep(120)
"""
GONE_WITHIN_S = 10.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is gone too
        return stat.read().split(") ")[-1][0] != "Z"


@pytest.mark.slow
def test_devices_exit_when_the_program_that_started_them_is_killed() -> None:
    program = subprocess.Popen(
        [sys.executable, "-c", PROGRAM], stdout=subprocess.PIPE, text=True, env=os.environ
    )
    try:
        pids = [int(p) for p in program.stdout.readline().split()]
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        program.send_signal(signal.SIGKILL)  # no cleanup runs
        program.wait(timeout=10)
        deadline = time.monotonic() + GONE_WITHIN_S
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [p for p in pids if _alive(p)]
        for pid in left:  # the test removes what it made whatever happened
            os.kill(pid, signal.SIGKILL)
        assert not left, f"devices {left} outlived their program"
    finally:
        program.kill()
        program.wait(timeout=10)
