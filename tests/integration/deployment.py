"""A cluster deployed across storage hosts from the command line, as docs/deploy.md walks it.

The admin's machine runs ``quarry init`` and ``quarry device enroll`` (one folder per device);
each storage host gets its device's folder only and runs ``quarry device serve --tls``; the
admin's cluster file lists the devices. On loopback every host is 127.0.0.1 (each device with
its own port, folders and certificate); the addresses are parameters, and ``prefix`` runs a
device's command where its host is (``["ip", "netns", "exec", "ns1"]`` in a network
namespace), so the same steps run across real links.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.commands import run_quarry

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0


@dataclass
class Host:
    """One storage host and the device it runs: what is on its own disk (``root``)."""

    name: str  # the device's
    address: str  # where it is reached (its certificate names it)
    root: Path
    rack: str = ""
    port: int = 0  # once it has served: kept, so a restart listens where the file says
    process: subprocess.Popen | None = None

    @property
    def credentials(self) -> Path:
        return self.root / "credentials"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def url(self) -> str:
        return f"grpc+tls://{self.address}:{self.port}"


@dataclass
class Deployment:
    admin: Path  # the admin's machine: the authority and the cluster file
    hosts: list[Host]
    prefix: Callable[[Host], list[str]] = lambda host: []
    env: dict[str, str] = field(default_factory=dict)
    serve_flags: tuple[str, ...] = ("--verify-clients",)

    @property
    def authority(self) -> Path:
        return self.admin / "credentials"

    @property
    def cluster_file(self) -> Path:
        return self.admin / "cluster.json"

    def quarry(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """A command on the admin's machine."""
        return run_quarry(*args, cwd=self.admin, check=check)

    def enroll(self, host: Host) -> None:
        """Issue the device's folder on the admin's machine, then copy it to its host."""
        rack = ["--rack", host.rack] if host.rack else []
        issued = self.admin / "enrolled" / host.name
        self.quarry(
            "device", "enroll", host.name, "--host", host.address, "--output", str(issued),
            "--folder", str(self.authority), *rack,
        )  # fmt: skip
        shutil.copytree(issued, host.credentials)

    def serve(self, host: Host) -> None:
        """``quarry device serve`` on the host, with its own folder; back once it listens."""
        ready = host.root / "ready.json"
        ready.unlink(missing_ok=True)
        command = [
            *self.prefix(host), sys.executable, "-m", "quarry", "device", "serve",
            "--data", str(host.data), "--credentials", str(host.credentials), "--tls",
            "--host", host.address, "--port", str(host.port), "--ready-file", str(ready),
            *self.serve_flags,
        ]  # fmt: skip
        log = open(host.root / "device.log", "ab")  # noqa: SIM115 - the process keeps it
        host.process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **self.env}
        )
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready.exists():
            if host.process.poll() is not None:
                tail = (host.root / "device.log").read_text()[-2000:]
                raise AssertionError(f"{host.name} exited: {tail}")
            assert time.monotonic() < deadline, f"{host.name} did not start"
            time.sleep(0.05)
        host.port = json.loads(ready.read_text())["port"]

    def stop(self, host: Host) -> None:
        if host.process is None or host.process.poll() is not None:
            return
        host.process.send_signal(signal.SIGTERM)
        try:
            host.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            host.process.kill()
            host.process.wait()

    def add(self, host: Host) -> None:
        """``quarry device add`` on the admin's machine: the device's identity checked both
        ways, its entry written to the cluster file (the first one starts the file)."""
        self.quarry(
            "device", "add", host.url, "--name", host.name, "--cluster", str(self.cluster_file),
            "--folder", str(self.authority),
        )  # fmt: skip

    def close(self) -> None:
        for host in self.hosts:
            self.stop(host)


def deploy(
    root: Path,
    addresses: list[str],
    racks: list[str] | None = None,
    prefix: Callable[[Host], list[str]] = lambda host: [],
    env: dict[str, str] | None = None,
) -> Deployment:
    """``quarry init``; enroll, copy and serve one device per address; ``quarry device add``
    each; then ``quarry status``, which (from the admin's machine) hands every device the
    revocation list and its peers."""
    admin = root / "admin"
    admin.mkdir(parents=True)
    hosts = [
        Host(f"dev{i}", address, root / f"host{i}", (racks or [""] * len(addresses))[i])
        for i, address in enumerate(addresses)
    ]
    deployment = Deployment(admin, hosts, prefix, env or {})
    deployment.quarry("init", "--folder", str(deployment.authority))
    try:
        for host in hosts:
            deployment.enroll(host)
        for host in hosts:
            deployment.serve(host)
        for host in hosts:
            deployment.add(host)
        deployment.quarry("status", "--cluster", str(deployment.cluster_file))
    except BaseException:
        deployment.close()
        raise
    return deployment
