"""One server process on this machine: a device, a storage server (or the Flight SQL endpoint).

Started with its log under its data folder and waited for until its ready file says where it
listens (``spawn``); a start returns the process's cluster-file entry and the process itself,
side by side: the entry is what the file keeps, the process only its starter can wait on.
Stopped by pid, and only while that pid is still a quarry server of the same data folder
(``is_device``), never a process that took its number since.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from quarry import settings
from quarry.auth.certificates import LOOPBACK_HOSTS
from quarry.auth.credentials import Credentials
from quarry.auth.enrollment import DeviceFolder, ensure_enrolled
from quarry.coordinator.membership.cluster_file import DeviceSpec, write_drives
from quarry.errors import ClusterError

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
ENROLLED = "credentials"  # a local server's own folder, under its data folder
METRICS_PORTS_TRIED_MAX = 1_000  # past $QUARRY_METRICS_PORT, before giving up
_metrics_ports_given: set[int] = set()  # to the servers this process started
_metrics_lock = threading.Lock()


def metrics_port() -> int | None:
    """The port the next server this process starts serves its metrics on: from
    $QUARRY_METRICS_PORT on, the first not given yet that nothing listens on (None: unset,
    no metrics; 0: any free port, the server's choice)."""
    first = settings.METRICS_PORT.get()
    if not first:
        return first
    with _metrics_lock:
        for port in range(first, min(first + METRICS_PORTS_TRIED_MAX, 65_536)):
            if port not in _metrics_ports_given and _free(port):
                _metrics_ports_given.add(port)
                return port
    raise ClusterError(
        f"no free port for metrics from {settings.METRICS_PORT.name}={first} on: set it to "
        "another port, or unset it"
    )


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def device_command(
    data: Path,
    name: str,
    profile: str,
    port: int = 0,
    ready_file: Path | None = None,
    profiles_file: str | None = None,
    enrolled: DeviceFolder | None = None,
    tls: bool = False,
    host_label: str | None = None,
    rack: str | None = None,
) -> list[str]:
    """A device's command line; ``enrolled``: its own credentials folder (None: no token
    checked, ``--insecure``)."""
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
    if enrolled is not None:
        command += ["--credentials", str(enrolled.folder)]
    else:
        command += ["--insecure"]
    if tls:
        command += ["--tls"]
    if host_label:  # an emulated host of its own (``quarry up --hosts``)
        command += ["--host-label", host_label]
    if rack:
        command += ["--rack", rack]
    return command + _metrics_option()


def _metrics_option() -> list[str]:
    port = metrics_port()
    return [] if port is None else ["--metrics-port", str(port)]


def enrolled_here(data: Path, name: str, credentials: Credentials | None) -> DeviceFolder | None:
    """The folder a server started on this machine runs with: its own, under its data folder,
    issued by the cluster's authority (``credentials``) for loopback; never the authority's."""
    if credentials is None:
        return None
    return ensure_enrolled(credentials, name, LOOPBACK_HOSTS, data / ENROLLED)


def start_device(
    data: Path,
    name: str,
    profile: str,
    port: int = 0,
    detach: bool = False,
    profiles_file: str | None = None,
    credentials: Credentials | None = None,
    tls: bool = False,
    host_label: str | None = None,
    rack: str | None = None,
) -> tuple[DeviceSpec, subprocess.Popen]:
    """Start one device process and wait until it listens: its cluster-file entry (with the
    profiles file and its labels, so that ``quarry device restart`` starts it as it was) and
    its process. ``credentials``: the cluster's authority, which enrolls the device (its entry
    names the authority: the coordinator's side); the device itself gets its enrolled folder
    only."""
    enrolled = enrolled_here(data, name, credentials)
    command = device_command(
        data,
        name,
        profile,
        port,
        data / "ready.json",
        profiles_file,
        enrolled,
        tls,
        host_label,
        rack,
    )
    process, info = spawn(command, data, f"device {name}", detach)
    spec = DeviceSpec(
        name=name,
        address=info["address"],
        pid=process.pid,
        data=str(data),
        profile=profile,
        profiles_file=None if profiles_file is None else str(profiles_file),
        **_credential_fields(credentials, tls),
        host=host_label,
        rack=rack,
    )
    return spec, process


def start_server(
    data: Path,
    name: str,
    profile: str,
    drives: tuple[DeviceSpec, ...],
    profiles_file: str | None = None,
    credentials: Credentials | None = None,
    tls: bool = False,
    detach: bool = False,
) -> tuple[DeviceSpec, subprocess.Popen]:
    """Start one storage server in front of ``drives`` (their cluster-file entries, written to
    its ``drives.json``); its own entry lists them under ``drives``."""
    data.mkdir(parents=True, exist_ok=True)
    write_drives(data / "drives.json", drives)
    command = [sys.executable, "-m", "quarry.server", "serve", "--data", str(data)]
    command += ["--drives", str(data / "drives.json"), "--profile", profile, "--name", name]
    command += ["--ready-file", str(data / "ready.json")]
    if profiles_file is not None:
        command += ["--profiles", profiles_file]
    enrolled = enrolled_here(data, name, credentials)
    command += ["--credentials", str(enrolled.folder)] if enrolled else ["--insecure"]
    if tls:
        command += ["--tls"]
    command += _metrics_option()
    process, info = spawn(command, data, f"storage server {name}", detach)
    spec = DeviceSpec(
        name=name,
        address=info["address"],
        pid=process.pid,
        data=str(data),
        profile=profile,
        drives=drives,
        **_credential_fields(credentials, tls),
    )
    return spec, process


def _credential_fields(credentials: Credentials | None, tls: bool) -> dict[str, str | None]:
    """How an entry's clients prove who they are (and the CA under TLS): the authority's
    files, on the admin's machine."""
    if credentials is None:
        return {}
    return {
        "credentials": str(credentials.folder),
        "token_file": str(credentials.admin_token_file),
        "ca_file": str(credentials.ca_file) if tls else None,
    }


def credentials_of(spec: DeviceSpec) -> Credentials | None:
    return Credentials(Path(spec.credentials)) if spec.credentials else None


def spawn(
    command: list[str], data: Path, what: str, detach: bool = False
) -> tuple[subprocess.Popen, dict[str, Any]]:
    """Start a server process (a device or a storage server) logging under ``data``, and wait
    until its ready file says where it listens."""
    data.mkdir(parents=True, exist_ok=True)
    ready = data / "ready.json"
    ready.unlink(missing_ok=True)
    log_file = data / ("device.log" if "quarry.device" in command else "server.log")
    if not detach:  # it lives as long as this process, however this one ends
        command = [*command, "--exit-with", str(os.getpid())]
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


def restart_detached(spec: DeviceSpec) -> DeviceSpec:
    """Start a device of a cluster file again, on its data and port, in the background; its
    entry with the new process's pid (the rest as it was)."""
    if spec.pid and is_device(spec.pid, spec.data):
        raise ClusterError(f"device {spec.name} is running (pid {spec.pid})")
    if spec.drives:
        raise ClusterError(
            f"{spec.name} is a storage server: restart the cluster (quarry down, quarry up)"
        )
    if spec.data is None or spec.profile is None:
        raise ClusterError(
            f"device {spec.name} was not started by quarry up on this machine (its entry names "
            "no data folder or profile): start it where it runs"
        )
    started, _process = start_device(
        Path(spec.data),
        spec.name,
        spec.profile,
        spec.port,
        detach=True,
        profiles_file=spec.profiles_file,
        credentials=credentials_of(spec),
        tls=spec.ca_file is not None,
        host_label=spec.host,
        rack=spec.rack,
    )
    return replace(spec, address=started.address, pid=started.pid)


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


def stop_device(device: DeviceSpec, timeout_s: float = STOP_TIMEOUT_S) -> str:
    """Stop a device of a cluster file; says what happened: "stopped", "was not running"."""
    if device.data is not None:  # a ready file left behind would look like a live start next time
        (Path(device.data) / "ready.json").unlink(missing_ok=True)
    if not device.pid or not is_device(device.pid, device.data):
        return "was not running"
    stop_pid(device.pid, timeout_s)
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
