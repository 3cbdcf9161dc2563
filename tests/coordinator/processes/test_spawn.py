"""Restarting and stopping one process from its cluster-file entry, without starting one: what
an entry cannot be restarted from is refused with why, and a process that is gone is not
mistaken for one that runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from quarry.coordinator.membership.cluster_file import DeviceSpec
from quarry.coordinator.processes.spawn import is_device, restart_detached, stop_device
from quarry.errors import ClusterError


def test_an_entry_without_a_data_folder_is_not_restarted_here():
    handed = DeviceSpec("dev0", "grpc://10.0.0.7:7000", token="t")  # quarry token create's
    with pytest.raises(ClusterError, match="dev0 was not started by quarry up on this machine"):
        restart_detached(handed)


def test_a_storage_server_is_not_restarted_as_a_device(tmp_path):
    drive = DeviceSpec("s0d0", "grpc://127.0.0.1:7001", data=str(tmp_path / "s0d0"))
    server = DeviceSpec(
        "s0", "grpc://127.0.0.1:7000", data=str(tmp_path / "s0"), profile="host", drives=(drive,)
    )
    with pytest.raises(ClusterError, match="s0 is a storage server"):
        restart_detached(server)
    assert not (tmp_path / "s0").exists()  # nothing started


def test_a_process_that_is_not_a_device_is_left_alone(tmp_path):
    (tmp_path / "ready.json").write_text("{}")  # left by a device that crashed
    this = DeviceSpec("dev0", "grpc://127.0.0.1:7000", pid=os.getpid(), data=str(tmp_path))
    assert not is_device(os.getpid())  # the test runner took no device's pid
    assert stop_device(this) == "was not running"
    assert not (tmp_path / "ready.json").exists()  # it would look like a live start
    assert stop_device(DeviceSpec("dev1", "grpc://127.0.0.1:7001")) == "was not running"


def test_a_device_process_asks_for_no_transparent_huge_pages(cluster):
    """Its buffers live milliseconds: a huge page zeroed at each first touch of a fresh region
    cost more than it saved (``quarry.device.__main__.without_huge_pages``)."""
    status = Path("/proc/self/status")
    if not status.exists() or "THP_enabled" not in status.read_text():
        pytest.skip("this kernel does not say whether a process takes transparent huge pages")
    for process in cluster.processes.values():
        lines = Path(f"/proc/{process.pid}/status").read_text().splitlines()
        assert "THP_enabled:\t0" in lines, process.args
