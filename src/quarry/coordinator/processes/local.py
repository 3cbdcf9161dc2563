"""``quarry.local(...)``: a cluster whose device processes this process started, and stops.

The processes are started by ``layouts`` (side by side, or a tree of storage servers) and
kept beside the cluster file's entries, never in them: ``LocalCluster.processes`` holds them
by name, while the cluster file (``data/cluster.json``) holds what any other coordinator needs
to connect.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from quarry.coordinator.cluster import Cluster
from quarry.coordinator.membership.cluster_file import ClusterFile, DeviceSpec
from quarry.coordinator.membership.membership import client_of
from quarry.coordinator.processes.layouts import (
    Layout,
    Started,
    hierarchy_layout,
    start_local,
    start_tree,
)
from quarry.coordinator.processes.spawn import STOP_TIMEOUT_S, credentials_of, start_device
from quarry.device.profile import get_profile
from quarry.device.unit import set_host_profile

CLUSTER_FILE = "cluster.json"


class LocalCluster(Cluster):
    """A Cluster whose device processes this process started (and stops on close)."""

    devices_on_this_machine = True  # they share its cores with the host (cost models ask)

    def __init__(
        self, started: Started, data: Path, owns_data: bool, profiles_file: str | None = None
    ):
        # every process by name: the host's devices, and drives and servers behind storage
        # servers (stopped with the cluster, killed by name)
        self.processes: dict[str, subprocess.Popen] = dict(started.processes)
        self.data = data
        self.owns_data = owns_data
        self.profiles_file = profiles_file
        self.cluster_file = ClusterFile(started.specs).write(data / CLUSTER_FILE)
        super().__init__(started.specs, source=str(self.cluster_file))

    def kill_device(self, name: str) -> None:
        """Stop a device abruptly (SIGKILL), as a crash would."""
        process = self.processes[name]
        process.kill()
        process.wait(timeout=STOP_TIMEOUT_S)

    def restart_device(self, name: str) -> None:
        """Start a stopped device again on the same data and port."""
        spec = next(d for d in self.specs if d.name == name)
        assert spec.data is not None and spec.profile is not None, f"{name} was not started here"
        started, process = start_device(
            Path(spec.data),
            name,
            spec.profile,
            spec.port,
            profiles_file=self.profiles_file,
            credentials=credentials_of(spec),
            tls=spec.ca_file is not None,
            host_label=spec.host,
            rack=spec.rack,
        )
        self.processes[name] = process
        spec = replace(spec, pid=started.pid)
        self.specs = tuple(spec if d.name == name else d for d in self.specs)
        # A gRPC channel to a dead server backs off before reconnecting: start a fresh one.
        self.devices[name].close()
        self.devices[name] = client_of(spec)
        ClusterFile(self.specs).write(self.cluster_file)
        self.refresh()

    def start_device(
        self,
        name: str,
        profile: str = "host",
        host_label: str | None = None,
        rack: str | None = None,
    ) -> DeviceSpec:
        """Start one more device process on this machine with the cluster's credentials, and
        add it (``add_device``: checked both ways); its entry. ``rebalance()`` gives it its
        share."""
        first = self.specs[0]
        started, process = start_device(
            self.data / name,
            name,
            profile,
            profiles_file=self.profiles_file,
            credentials=credentials_of(first),
            tls=first.ca_file is not None,
            host_label=host_label,
            rack=rack,
        )
        self.processes[name] = process
        try:
            added = self.add_device(started.address, name)
        except BaseException:
            process.kill()
            raise
        spec = replace(started, host=added.host, rack=added.rack)
        self.specs = tuple(spec if d.name == name else d for d in self.specs)
        ClusterFile(self.specs).write(self.cluster_file)  # with where it runs: restart finds it
        return spec

    def remove_device(self, name: str, force: bool = False) -> DeviceSpec:
        """``Cluster.remove_device``, and its process stopped."""
        spec = super().remove_device(name, force)
        process = self.processes.pop(name, None)
        if process is not None and process.poll() is None:
            process.terminate()
            process.wait(timeout=STOP_TIMEOUT_S)
        return spec

    def close(self) -> None:
        super().close()
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        for process in self.processes.values():
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self.owns_data:
            shutil.rmtree(self.data, ignore_errors=True)


@contextmanager
def local(
    devices: int = 3,
    profile: str | list[str] = "host",
    data: str | Path | None = None,
    profiles_file: str | None = None,
    tls: bool = False,
    host_profile: str | None = None,
    servers: int = 0,
    drives_per_server: int = 0,
    server_profile: str = "host",
    drive_profile: str | list[str] | None = None,
    direct_drives: int = 0,
    layout: Layout | None = None,
    hosts: int = 0,
) -> Iterator[LocalCluster]:
    """Start ``devices`` device processes on localhost; stop them (and clean up) on exit.

    ``data`` defaults to a temporary folder that is removed afterwards; give a folder to keep it.
    Calls carry the cluster's admin token; ``tls`` also encrypts them. ``host_profile``: limits
    for this process while the cluster is open: its ingress link (every device stream into it
    shares one bucket), its cores and compute factor (completions run under them).

    ``servers`` > 0 starts a hierarchy instead: that many storage servers (``server_profile``),
    each in front of ``drives_per_server`` drives of its own (``drive_profile``, else
    ``profile``); the host sees the servers as its devices, and ``direct_drives`` more drives it
    talks to directly. ``layout`` starts a cluster of any depth instead (``start_tree``): what
    the host talks to, drives by profile name and servers as lists of what is behind them.
    ``hosts`` > 0: the devices say they run on that many hosts (``host0``... round-robin), so
    failure domains can be tried on one machine.
    """
    host = get_profile(host_profile, profiles_file) if host_profile is not None else None
    if servers and layout is None:
        layout = hierarchy_layout(
            servers, drives_per_server, drive_profile or profile, direct_drives
        )
    if layout is not None:
        owns = data is None
        root = Path(tempfile.mkdtemp(prefix="quarry-")) if owns else Path(data).resolve()
        root.mkdir(parents=True, exist_ok=True)
        try:
            started = start_tree(layout, server_profile, root, profiles_file, tls)
        except BaseException:
            if owns:
                shutil.rmtree(root, ignore_errors=True)
            raise
    else:
        started, root, owns = start_local(
            devices, profile, data, profiles_file=profiles_file, tls=tls, hosts=hosts
        )
    cluster = LocalCluster(started, root, owns, profiles_file)
    set_host_profile(host)
    try:
        yield cluster
    finally:
        set_host_profile(None)
        cluster.close()
