"""The embedded default: N device processes on localhost, data under one folder."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quarry.auth.credentials import Credentials
from quarry.auth.credentials import create as create_credentials
from quarry.coordinator.cluster import Cluster, write_cluster_file
from quarry.coordinator.membership.membership import client_of
from quarry.device.profile import get_profile
from quarry.device.unit import set_host_profile
from quarry.errors import ClusterError

DEVICES_MAX = 64
STARTS_AT_ONCE = 8  # device processes starting at the same time
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
CLUSTER_FILE = "cluster.json"


def device_command(
    data: Path,
    name: str,
    profile: str,
    port: int = 0,
    ready_file: Path | None = None,
    profiles_file: str | None = None,
    credentials: Credentials | None = None,
    tls: bool = False,
) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "quarry.device",  # the lean entry: no CLI, no coordinator in a device's memory
        "serve",
        "--data",
        str(data),
        "--port",
        str(port),
        "--profile",
        profile,
        "--name",
        name,
    ]
    if ready_file is not None:
        command += ["--ready-file", str(ready_file)]
    if profiles_file is not None:
        command += ["--profiles", profiles_file]
    if credentials is not None:
        command += ["--credentials", str(credentials.folder)]
    else:
        command += ["--insecure"]
    if tls:
        command += ["--tls"]
    return command


def start_device(
    data: Path,
    name: str,
    profile: str,
    port: int = 0,
    detach: bool = False,
    profiles_file: str | None = None,
    credentials: Credentials | None = None,
    tls: bool = False,
) -> dict[str, Any]:
    """Start one device process and wait until it listens; returns its cluster-file entry."""
    command = device_command(
        data, name, profile, port, data / "ready.json", profiles_file, credentials, tls
    )
    process, info = spawn(command, data, f"device {name}", detach)
    spec = {
        "name": name,
        "address": info["address"],
        "pid": process.pid,
        "data": str(data),
        "profile": profile,
        "_process": process,
    }
    if profiles_file is not None:  # so that `quarry device restart` finds the profile again
        spec["profiles_file"] = str(profiles_file)
    return _with_credentials(spec, credentials, tls)


def _with_credentials(
    spec: dict[str, Any], credentials: Credentials | None, tls: bool
) -> dict[str, Any]:
    """A cluster-file entry with how its clients prove who they are (and the CA under TLS)."""
    if credentials is not None:
        spec["credentials"] = str(credentials.folder)
        spec["token_file"] = str(credentials.admin_token_file)
        if tls:
            spec["ca_file"] = str(credentials.ca_file)
    return spec


def spawn(
    command: list[str], data: Path, what: str, detach: bool = False
) -> tuple[subprocess.Popen, dict[str, Any]]:
    """Start a server process (a device or a storage server) logging under ``data``, and wait
    until its ready file says where it listens."""
    data.mkdir(parents=True, exist_ok=True)
    ready = data / "ready.json"
    ready.unlink(missing_ok=True)
    log_file = data / ("device.log" if "quarry.device" in command else "server.log")
    with open(log_file, "ab") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=detach,
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready.exists():
        if process.poll() is not None:
            tail = log_file.read_text(errors="replace")[-2000:]
            raise ClusterError(f"{what} exited with code {process.returncode}:\n{tail}")
        if time.monotonic() > deadline:
            process.kill()
            raise ClusterError(f"{what} did not start within {START_TIMEOUT_S:.0f} s")
        time.sleep(0.05)
    return process, json.loads(ready.read_text())


def _credentials_of(spec: dict[str, Any]) -> Credentials | None:
    return Credentials(Path(spec["credentials"])) if spec.get("credentials") else None


def restart_detached(spec: dict[str, Any]) -> dict[str, Any]:
    """Start a device of a cluster file again, on its data and port, in the background."""
    if spec.get("pid") and is_device(int(spec["pid"]), spec.get("data")):
        raise ClusterError(f"device {spec['name']} is running (pid {spec['pid']})")
    port = int(spec["address"].rsplit(":", 1)[1])
    started = start_device(
        Path(spec["data"]),
        spec["name"],
        spec["profile"],
        port,
        detach=True,
        profiles_file=spec.get("profiles_file"),
        credentials=_credentials_of(spec),
        tls="ca_file" in spec,
    )
    started.pop("_process")
    return started


def is_device(pid: int, data: str | None = None) -> bool:
    """Whether ``pid`` is a quarry device or storage server (of ``data``), not a process that
    took its number."""
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    text = [w.decode(errors="replace") for w in words]
    entry = "quarry.device" in text or "quarry.server" in text
    entry = entry or ("quarry" in text and "device" in text)
    is_quarry = entry and "serve" in text
    return is_quarry and (data is None or data in text)


def stop_device(device: dict[str, Any], timeout_s: float = STOP_TIMEOUT_S) -> str:
    """Stop a device of a cluster file; says what happened: "stopped", "was not running"."""
    pid, data = int(device.get("pid", 0)), device.get("data")
    if data is not None:  # a ready file left behind would look like a live start next time
        (Path(data) / "ready.json").unlink(missing_ok=True)
    if not pid or not is_device(pid, data):
        return "was not running"
    stop_pid(pid, timeout_s)
    return "stopped"


def stop_pid(pid: int, timeout_s: float = STOP_TIMEOUT_S) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        try:  # reap our own child so it does not linger as a zombie
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:
            pass
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


class LocalCluster(Cluster):
    """A Cluster whose device processes this process started (and stops on close)."""

    devices_on_this_machine = True  # they share its cores with the host (cost models ask)

    def __init__(
        self,
        devices: list[dict[str, Any]],
        data: Path,
        owns_data: bool,
        profiles_file: str | None = None,
        below: dict[str, subprocess.Popen] | None = None,
    ):
        self.processes = {d["name"]: d.pop("_process") for d in devices}
        # drives and servers behind storage servers: stopped with the cluster, killed by name
        self.processes.update(below or {})
        self.data = data
        self.owns_data = owns_data
        self.profiles_file = profiles_file
        self.cluster_file = write_cluster_file(data / CLUSTER_FILE, devices)
        super().__init__(devices, source=str(self.cluster_file))

    def kill_device(self, name: str) -> None:
        """Stop a device abruptly (SIGKILL), as a crash would."""
        process = self.processes[name]
        process.kill()
        process.wait(timeout=STOP_TIMEOUT_S)

    def restart_device(self, name: str) -> None:
        """Start a stopped device again on the same data and port."""
        spec = next(d for d in self.spec if d["name"] == name)
        port = int(spec["address"].rsplit(":", 1)[1])
        started = start_device(
            Path(spec["data"]),
            name,
            spec["profile"],
            port,
            profiles_file=self.profiles_file,
            credentials=_credentials_of(spec),
            tls="ca_file" in spec,
        )
        self.processes[name] = started.pop("_process")
        spec["pid"] = started["pid"]
        # A gRPC channel to a dead server backs off before reconnecting: start a fresh one.
        self.devices[name].close()
        self.devices[name] = client_of(spec)
        write_cluster_file(self.cluster_file, self.spec)
        self.refresh()

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


def start_local(
    devices: int = 3,
    profile: str | list[str] = "host",
    data: str | Path | None = None,
    detach: bool = False,
    profiles_file: str | None = None,
    tls: bool = False,
) -> tuple[list[dict[str, Any]], Path, bool]:
    """Start ``devices`` device processes on loopback over a folder. The cluster's credentials
    (a token secret, an admin token, a CA and the devices' certificate) are made in the folder
    first, owner-readable only; every device checks every call's token, over TLS if ``tls``."""
    if not 1 <= devices <= DEVICES_MAX:
        raise ClusterError(f"devices must be between 1 and {DEVICES_MAX}, got {devices}")
    profiles = [profile] * devices if isinstance(profile, str) else list(profile)
    if len(profiles) != devices:
        raise ClusterError(f"{len(profiles)} profiles given for {devices} devices")
    for name in set(profiles):
        get_profile(name, profiles_file)  # fail fast, before any process starts
    owns = data is None
    root = Path(tempfile.mkdtemp(prefix="quarry-")) if data is None else Path(data).resolve()
    root.mkdir(parents=True, exist_ok=True)
    left_out = sorted(
        folder.name
        for folder in root.glob("dev*")
        if (folder / "kv").exists() and folder.name not in {f"dev{i}" for i in range(devices)}
    )
    if left_out:  # their partitions would silently vanish from the catalog
        raise ClusterError(
            f"{root} holds the data of device(s) {', '.join(left_out)}, which {devices} "
            f"device(s) would not start: start them all (--devices "
            f"{devices + len(left_out)}), or move those folders away first"
        )
    credentials = create_credentials(root)
    started: list[dict[str, Any]] = []
    try:
        # in parallel: each device spends most of its start importing, and many fit at once
        with ThreadPoolExecutor(min(devices, STARTS_AT_ONCE), "quarry-start") as pool:
            futures = [
                pool.submit(
                    start_device,
                    root / f"dev{index}",
                    f"dev{index}",
                    device_profile,
                    0,
                    detach,
                    profiles_file,
                    credentials,
                    tls,
                )
                for index, device_profile in enumerate(profiles)
            ]
            failures = []
            for future in futures:
                try:
                    started.append(future.result())
                except BaseException as error:
                    failures.append(error)
        if failures:
            raise failures[0]
    except BaseException:
        for device in started:
            device["_process"].kill()
        if owns:
            shutil.rmtree(root, ignore_errors=True)
        raise
    return started, root, owns


def start_server(
    data: Path,
    name: str,
    profile: str,
    drives: list[dict[str, Any]],
    profiles_file: str | None = None,
    credentials: Credentials | None = None,
    tls: bool = False,
    detach: bool = False,
) -> dict[str, Any]:
    """Start one storage server in front of ``drives`` (their cluster-file entries); returns
    its own entry, which lists them under ``drives``."""
    data.mkdir(parents=True, exist_ok=True)
    listed = [{k: v for k, v in d.items() if not k.startswith("_")} for d in drives]
    (data / "drives.json").write_text(json.dumps(listed, indent=1))
    command = [sys.executable, "-m", "quarry.server", "serve", "--data", str(data)]
    command += ["--drives", str(data / "drives.json"), "--profile", profile, "--name", name]
    command += ["--ready-file", str(data / "ready.json")]
    if profiles_file is not None:
        command += ["--profiles", profiles_file]
    command += ["--credentials", str(credentials.folder)] if credentials else ["--insecure"]
    if tls:
        command += ["--tls"]
    process, info = spawn(command, data, f"storage server {name}", detach)
    spec = {
        "name": name,
        "address": info["address"],
        "pid": process.pid,
        "data": str(data),
        "profile": profile,
        "drives": listed,
        "_process": process,
    }
    return _with_credentials(spec, credentials, tls)


Layout = list  # of drives (their profile names) and storage servers (a Layout each)


@dataclass
class _Node:
    """One process of a layout: a drive (``profile``) or a server over ``below``."""

    name: str
    depth: int
    profile: str | None = None
    below: list[_Node] = field(default_factory=list)


def _nodes(layout: Layout, prefix: str = "", depth: int = 0) -> list[_Node]:
    """A layout's processes, named by where they sit: at each level drives ``d<k>`` and
    servers ``s<k>``, counted apart, after the name of the server they are behind."""
    nodes, counts = [], {"d": 0, "s": 0}
    for item in layout:
        kind = "d" if isinstance(item, str) else "s"
        name = f"{prefix}{kind}{counts[kind]}"
        counts[kind] += 1
        if isinstance(item, str):
            nodes.append(_Node(name, depth, profile=item))
        elif item:
            nodes.append(_Node(name, depth, below=_nodes(item, name, depth + 1)))
        else:
            raise ClusterError(f"storage server {name} has nothing behind it")
    return nodes


def _walk(nodes: list[_Node]) -> Iterator[_Node]:
    for node in nodes:
        yield node
        yield from _walk(node.below)


def hierarchy_layout(
    servers: int, drives_per_server: int, drive_profile: str | list[str], direct: int = 0
) -> Layout:
    """``servers`` storage servers of ``drives_per_server`` drives each (``drive_profile`` one
    for all, or one per drive in server order), and ``direct`` drives the host talks to itself
    (the first drive profile)."""
    if not 1 <= servers * drives_per_server <= DEVICES_MAX or servers < 1:
        raise ClusterError(
            f"servers x drives per server must be 1 to {DEVICES_MAX}, got {servers} x "
            f"{drives_per_server}"
        )
    total = servers * drives_per_server
    profiles = [drive_profile] * total if isinstance(drive_profile, str) else list(drive_profile)
    if len(profiles) != total:
        raise ClusterError(f"{len(profiles)} drive profiles given for {total} drives")
    k = drives_per_server
    return [profiles[i * k : (i + 1) * k] for i in range(servers)] + [profiles[0]] * direct


def start_tree(
    layout: Layout,
    server_profile: str,
    data: Path,
    profiles_file: str | None = None,
    tls: bool = False,
    detach: bool = False,
) -> tuple[list[dict[str, Any]], dict[str, subprocess.Popen]]:
    """Start a cluster of any depth: ``layout`` lists what the host talks to, a drive's profile
    name or a storage server's own layout, e.g. ``[["kinetic", ["host", "scaleflux"]], "host"]``
    (a server in front of a kinetic drive and of a second server, and a drive of the host's).
    Drives start first, all at once; then the servers, deepest first, each level at once.
    Returns the host's devices' entries and the processes below them, by name."""
    nodes = _nodes(layout)
    every = list(_walk(nodes))
    drives = [n for n in every if n.profile is not None]
    if not 1 <= len(drives) <= DEVICES_MAX:
        raise ClusterError(f"a cluster has 1 to {DEVICES_MAX} drives, got {len(drives)}")
    for profile in {n.profile for n in drives} | {server_profile}:
        get_profile(profile, profiles_file)  # fail fast, before any process starts
    credentials = create_credentials(data)
    specs: dict[str, dict[str, Any]] = {}

    def start(node: _Node) -> dict[str, Any]:
        if node.profile is not None:
            return start_device(
                data / node.name,
                node.name,
                node.profile,
                0,
                detach,
                profiles_file,
                credentials,
                tls,
            )
        own = [specs[n.name] for n in node.below]
        return start_server(
            data / node.name,
            node.name,
            server_profile,
            own,
            profiles_file,
            credentials,
            tls,
            detach,
        )

    servers = [n for n in every if n.profile is None]
    waves = [drives] + [
        [n for n in servers if n.depth == depth]
        for depth in sorted({n.depth for n in servers}, reverse=True)
    ]
    try:
        with ThreadPoolExecutor(min(len(drives), STARTS_AT_ONCE), "quarry-start") as pool:
            for wave in waves:
                futures = {node.name: pool.submit(start, node) for node in wave}
                failures = []
                for name, future in futures.items():
                    try:
                        specs[name] = future.result()
                    except BaseException as error:
                        failures.append(error)
                if failures:
                    raise failures[0]
    except BaseException:
        for spec in specs.values():
            spec["_process"].kill()
        raise
    top = [specs[n.name] for n in nodes]
    below = {n.name: specs[n.name]["_process"] for n in every if n.depth > 0}
    return top, below


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
            started, below = start_tree(layout, server_profile, root, profiles_file, tls)
        except BaseException:
            if owns:
                shutil.rmtree(root, ignore_errors=True)
            raise
        cluster = LocalCluster(started, root, owns, profiles_file, below)
    else:
        started, root, owns = start_local(
            devices, profile, data, profiles_file=profiles_file, tls=tls
        )
        cluster = LocalCluster(started, root, owns, profiles_file)
    set_host_profile(host)
    try:
        yield cluster
    finally:
        set_host_profile(None)
        cluster.close()
