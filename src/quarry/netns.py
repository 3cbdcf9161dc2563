"""Devices on their own addresses behind links the kernel shapes: a test and benchmark facility.

Every figure measured on one machine over loopback, and every fault made by killing a process,
hides what a network does: a killed process's kernel resets its connections at once, a cut link
resets nothing. This module puts each device in a Linux network namespace of its own, as if on
its own host, and lets a test or a benchmark cut, heal and shape its link
(``tests/integration/test_partitions.py``, ``bench/partitions.py``,
``bench/kinetic_pipe.py --netns``). It is not part of a cluster: nothing else imports it.

    root namespace (the host: the test or benchmark process)
      bridge <prefix>br        10.A.B.1/24, the host's address
        veth <prefix>h<i>  --  <prefix>d<i> in namespace <prefix><i>, 10.A.B.(10+i)/24
                                 `ip netns exec <prefix><i> python -m quarry.device serve
                                  --host 10.A.B.(10+i) --tls ...`

A host may run several devices (``cluster(devices_per_host=...)``): they share its namespace and
address, listen on ports from ``DEVICE_PORT`` up, and say the address as their host's failure
domain, so replicas and stripes spread over hosts as on real machines.

- ``cut``: the veth's root end set down. Silence, both ways, and no reset: what a pulled cable or
  a dead switch port looks like (checked on this kernel: a call across it waited 12 s without
  an error until the link came back). A bridge port set "disabled" was tried and kept
  forwarding; ``iptables``/``nft`` are not installed here.
- ``heal``: the root end up again; the bridge forwards at once (no STP).
- ``shape``: a token bucket (``tc tbf``) each way on a device's link; ``shape_host``: one on the
  host's own link, shared by every device (an ``ifb`` takes what the bridge delivers to the
  host). Added delay needs ``netem``, which this kernel lacks: ``shape(delay_ms=...)`` raises
  ``NetnsUnavailable`` saying so where it is missing.

TLS is on: the cluster's authority is made here (``make_credentials``) and each device runs with its
own folder, enrolled for its address, as on a storage host (docs/deploy.md). It needs root, ``ip``
and ``tc``: ``missing()`` says in one line what is not there, and the tests skip with that line.
Everything is named with a per-run prefix (``qn<pid><letter>``), so parallel runs never collide, and
``close`` removes all of it (device processes, namespaces, links, the bridge), also when a test
fails; a run killed before it could clean up is swept by the next (``sweep``: prefixes whose process
is gone). Every command is bounded in time.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from quarry.auth.credentials import Credentials, create
from quarry.auth.enrollment import DeviceFolder, ensure_enrolled
from quarry.coordinator.cluster import Cluster
from quarry.coordinator.membership.cluster_file import ClusterFile, DeviceSpec
from quarry.coordinator.membership.membership import client_of
from quarry.coordinator.processes.layouts import STARTS_AT_ONCE
from quarry.coordinator.processes.spawn import (
    ENROLLED,
    STOP_TIMEOUT_S,
    credentials_of,
    device_command,
    spawn,
)
from quarry.errors import QuarryError

COMMAND_TIMEOUT_S = 20.0  # one `ip` or `tc` command
DEVICE_PORT = 31337  # every host has an address of its own: its devices listen from this port up
FIRST_DEVICE_HOST = 10  # device i listens on 10.A.B.(10 + i)
DEVICES_MAX = 200
SUBNET_TRIES_MAX = 64
PREFIX = re.compile(r"^qn(\d+)[a-z]")
TBF_LATENCY_MS = 100  # how long a packet may wait in a token bucket before it is dropped
TBF_BURST_S = 0.005  # a bucket holds this many seconds of its rate (at least 16 KiB)
_runs = itertools.count()


class NetnsUnavailable(QuarryError):
    """This machine cannot make namespaces or shape links (not root, no ``ip``/``tc``, no
    ``netem``): the message says what is missing."""

    code = "netns_unavailable"


def missing() -> str | None:
    """What keeps this machine from running devices in namespaces, in one line; None if
    nothing does."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"network namespaces need `{tool}` (iproute2)"
    probe = f"qn{os.getpid()}z"
    try:
        _run("ip", "netns", "add", probe)
    except NetnsUnavailable as error:
        return f"cannot make a network namespace here: {error}"
    _run("ip", "netns", "del", probe, check=False)
    return None


def _run(*command: str, check: bool = True) -> str:
    """One command, bounded in time; its output, or ``NetnsUnavailable`` naming it."""
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        if check:
            raise NetnsUnavailable(f"`{' '.join(command)}` failed: {error}") from None
        return ""
    if check and done.returncode != 0:
        raise NetnsUnavailable(f"`{' '.join(command)}` failed: {done.stderr.strip()}")
    return done.stdout


def make_credentials(folder: Path, hosts: tuple[str, ...]) -> Credentials:
    """The cluster's credentials for devices at ``hosts`` (the one place they are made here)."""
    return create(folder, hosts=hosts)


@dataclass(frozen=True)
class Link:
    """One device's namespace and its link to the bridge."""

    name: str  # the device's
    namespace: str
    root_end: str  # on the bridge, in the root namespace: cut here
    device_end: str  # inside the namespace
    address: str


@dataclass
class Network:
    """A bridge and a namespace per device, made for one run; ``close`` removes them all."""

    prefix: str = field(default_factory=lambda: f"qn{os.getpid()}{'abcdefghij'[next(_runs) % 10]}")
    links: dict[str, Link] = field(default_factory=dict)
    subnet: ipaddress.IPv4Network | None = None
    _host_shaped: bool = False

    def __post_init__(self) -> None:
        sweep()
        if self.subnet is None:
            self.subnet = _free_subnet(self.prefix)
        self.bridge = f"{self.prefix}br"
        self.ifb = f"{self.prefix}i"
        try:
            _run("ip", "link", "add", self.bridge, "type", "bridge")
            _run("ip", "addr", "add", f"{self.host_address}/24", "dev", self.bridge)
            _run("ip", "link", "set", self.bridge, "up")
        except BaseException:
            self.close()
            raise

    @property
    def host_address(self) -> str:
        assert self.subnet is not None
        return str(self.subnet.network_address + 1)

    def add(self, name: str) -> Link:
        """A namespace for device ``name`` on the bridge, with its own address."""
        assert self.subnet is not None and len(self.links) < DEVICES_MAX
        index = len(self.links)
        link = Link(
            name=name,
            namespace=f"{self.prefix}{index}",
            root_end=f"{self.prefix}h{index}",
            device_end=f"{self.prefix}d{index}",
            address=str(self.subnet.network_address + FIRST_DEVICE_HOST + index),
        )
        self.links[name] = link
        ns = link.namespace
        _run("ip", "netns", "add", ns)
        _run("ip", "link", "add", link.root_end, "type", "veth", "peer", "name", link.device_end)
        _run("ip", "link", "set", link.device_end, "netns", ns)
        _run("ip", "link", "set", link.root_end, "master", self.bridge, "up")
        _run("ip", "-n", ns, "addr", "add", f"{link.address}/24", "dev", link.device_end)
        _run("ip", "-n", ns, "link", "set", link.device_end, "up")
        _run("ip", "-n", ns, "link", "set", "lo", "up")
        return link

    def exec_prefix(self, name: str) -> list[str]:
        """What runs a command inside device ``name``'s namespace."""
        return ["ip", "netns", "exec", self.links[name].namespace]

    # ---- faults and shapes ------------------------------------------------------------------

    def cut(self, name: str) -> None:
        """Device ``name``'s link goes silent both ways, resetting nothing."""
        _run("ip", "link", "set", self.links[name].root_end, "down")

    def heal(self, name: str) -> None:
        _run("ip", "link", "set", self.links[name].root_end, "up")

    def shape(
        self, name: str, bytes_per_s: float | None = None, delay_ms: float | None = None
    ) -> None:
        """Device ``name``'s link: a token bucket of ``bytes_per_s`` each way (None: none);
        ``delay_ms`` each way needs ``netem``."""
        link = self.links[name]
        inside = ["ip", "netns", "exec", link.namespace]
        _qdisc([], link.root_end, bytes_per_s, delay_ms)
        _qdisc(inside, link.device_end, bytes_per_s, delay_ms)

    def shape_host(self, bytes_per_s: float | None) -> None:
        """The host's own link, shared by every device: what the host receives goes through an
        ``ifb`` the bridge redirects to, what it sends through the bridge's own queue."""
        if bytes_per_s is None:
            if self._host_shaped:
                _run("tc", "qdisc", "del", "dev", self.bridge, "ingress", check=False)
                _run("tc", "qdisc", "del", "dev", self.bridge, "root", check=False)
                _run("ip", "link", "del", self.ifb, check=False)
                self._host_shaped = False
            return
        if not self._host_shaped:
            _run("ip", "link", "add", self.ifb, "type", "ifb")
            _run("ip", "link", "set", self.ifb, "up")
            _run("tc", "qdisc", "add", "dev", self.bridge, "ingress")
            _run(
                *("tc", "filter", "add", "dev", self.bridge, "parent", "ffff:"),
                *("protocol", "all", "u32", "match", "u32", "0", "0"),
                *("action", "mirred", "egress", "redirect", "dev", self.ifb),
            )
            self._host_shaped = True
        _qdisc([], self.ifb, bytes_per_s, None)
        _qdisc([], self.bridge, bytes_per_s, None)

    # ---- the end ------------------------------------------------------------------------------

    def close(self) -> None:
        """Remove every namespace (with what runs in it), link and the bridge of this run."""
        _remove(self.prefix)
        self.links = {}


def _qdisc(inside: list[str], device: str, bytes_per_s: float | None, delay_ms: float | None):
    """A link's queue: a token bucket, or netem's delay (with its own rate), or none."""
    if delay_ms is not None:
        rate = [] if bytes_per_s is None else ["rate", f"{int(bytes_per_s * 8)}bit"]
        command = [*inside, "tc", "qdisc", "replace", "dev", device, "root", "netem"]
        try:
            _run(*command, "delay", f"{delay_ms}ms", *rate)
        except NetnsUnavailable as error:
            raise NetnsUnavailable(
                f"added delay needs netem, which this kernel does not offer ({error})"
            ) from None
        return
    if bytes_per_s is None:
        _run(*inside, "tc", "qdisc", "del", "dev", device, "root", check=False)
        return
    burst = max(16 << 10, int(bytes_per_s * TBF_BURST_S))
    _run(
        *(*inside, "tc", "qdisc", "replace", "dev", device, "root", "tbf"),
        *("rate", f"{int(bytes_per_s * 8)}bit", "burst", str(burst)),
        *("latency", f"{TBF_LATENCY_MS}ms"),
    )


def _free_subnet(prefix: str) -> ipaddress.IPv4Network:
    """A /24 in 10.200.0.0/13 that no interface of this machine is on (per run, from its
    prefix: parallel runs pick apart)."""
    used = _run("ip", "-o", "-4", "addr", "show")
    start = int.from_bytes(prefix.encode(), "big") % 2048
    for offset in range(SUBNET_TRIES_MAX):
        number = (start + offset) % 2048
        subnet = ipaddress.ip_network(f"10.{200 + number // 256}.{number % 256}.0/24")
        if f" {str(subnet.network_address)[:-1]}" not in used:  # " 10.200.5." : any on it
            return subnet
    raise NetnsUnavailable("no free /24 in 10.200.0.0/13 for the devices' addresses")


def _names() -> set[str]:
    """Namespaces and links of this machine that a run of this module made."""
    found = set()
    for line in _run("ip", "netns", "list", check=False).splitlines():
        if line.split():
            found.add(line.split()[0])
    for line in _run("ip", "-o", "link", "show", check=False).splitlines():
        parts = line.split(":")
        if len(parts) > 1:
            found.add(parts[1].strip().split("@")[0])
    return {name for name in found if PREFIX.match(name)}


def _remove(prefix: str) -> None:
    """Every namespace (its processes killed first) and link whose name starts with
    ``prefix``."""
    names = sorted(n for n in _names() if n.startswith(prefix))
    namespaces = set(_run("ip", "netns", "list", check=False).split())
    for name in names:
        if name in namespaces:
            for pid in _run("ip", "netns", "pids", name, check=False).split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            _run("ip", "netns", "del", name, check=False)
    for name in names:
        if name not in namespaces:  # links left in the root namespace: bridge, ifb, veths
            _run("ip", "link", "del", name, check=False)


def sweep() -> list[str]:
    """Remove what runs that are gone left behind (their prefixes name their pid); what was
    removed, by prefix."""
    swept = []
    for prefix in sorted({PREFIX.match(n).group(0) for n in _names()}):  # type: ignore[union-attr]
        pid = int(PREFIX.match(prefix).group(1))  # type: ignore[union-attr]
        if pid != os.getpid() and not Path(f"/proc/{pid}").exists():
            _remove(prefix)
            swept.append(prefix)
    return swept


# ---- a cluster on them ------------------------------------------------------------------------


@dataclass
class NamespacedCluster:
    """Devices started in namespaces, the cluster that talks to them, and their network."""

    network: Network
    cluster: Cluster
    specs: tuple[DeviceSpec, ...]
    processes: dict[str, subprocess.Popen]
    data: Path
    profiles_file: str | None = None
    # each device's host: the name of its namespace's link (a device of its own host: its own)
    hosts: dict[str, str] = field(default_factory=dict)

    def link(self, name: str) -> Link:
        """The link of a host, or of the host device ``name`` runs on."""
        return self.network.links[self.hosts.get(name, name)]

    def cut(self, name: str) -> None:
        """A host's link (device ``name``'s host's: with every device on it) goes silent."""
        self.network.cut(self.link(name).name)

    def heal(self, name: str) -> None:
        self.network.heal(self.link(name).name)

    def kill(self, name: str) -> None:
        """Stop a device abruptly (SIGKILL), as a crash would."""
        process = self.processes[name]
        process.kill()
        process.wait(timeout=STOP_TIMEOUT_S)

    def start(self, name: str) -> None:
        """Start a stopped device again in its namespace, on its data and address, and give the
        cluster a fresh client of it (a gRPC channel to a dead server backs off before it
        reconnects)."""
        spec = next(s for s in self.specs if s.name == name)
        assert spec.data is not None and spec.profile is not None
        process, _ = _start(self.network, self.link(name), spec, self.profiles_file)
        self.processes[name] = process
        self.cluster.devices[name].close()
        self.cluster.devices[name] = client_of(spec)
        self.cluster.refresh()


def _start(
    network: Network, link: Link, spec: DeviceSpec, profiles_file: str | None
) -> tuple[subprocess.Popen, dict]:
    """One device's process in its host's namespace, once it listens."""
    assert spec.data is not None and spec.profile is not None
    command = device_command(
        Path(spec.data),
        spec.name,
        spec.profile,
        spec.port,
        Path(spec.data) / "ready.json",
        profiles_file,
        _enrolled(spec, link),
        tls=True,
        host_label=spec.host,  # its failure domain: the host (namespace) it runs on
    )
    command = [*network.exec_prefix(link.name), *command, "--host", link.address]
    return spawn(command, Path(spec.data), f"device {spec.name} in {link.namespace}")


def _start_all(
    network: Network, links: list[Link], specs: list[DeviceSpec]
) -> dict[str, subprocess.Popen]:
    """Every device's process, started at once (``STARTS_AT_ONCE`` together), by name; if one
    fails, the first error (those started are stopped with the network's namespaces)."""
    with ThreadPoolExecutor(min(STARTS_AT_ONCE, len(specs)), "quarry-netns-start") as pool:
        futures = [
            pool.submit(_start, network, link, spec, spec.profiles_file)
            for link, spec in zip(links, specs, strict=True)
        ]
        return {spec.name: future.result()[0] for spec, future in zip(specs, futures, strict=True)}


def _enrolled(spec: DeviceSpec, link: Link) -> DeviceFolder:
    """The device's own folder, issued by the cluster's authority for its address (a device
    never holds the authority: it starts refusing to)."""
    assert spec.data is not None
    authority = credentials_of(spec)
    assert authority is not None
    return ensure_enrolled(authority, spec.name, (link.address,), Path(spec.data) / ENROLLED)


@contextlib.contextmanager
def cluster(
    devices: int = 3,
    profile: str = "host",
    data: str | Path | None = None,
    profiles_file: str | None = None,
    devices_per_host: int = 1,
) -> Iterator[NamespacedCluster]:
    """``devices`` devices, ``devices_per_host`` to a host: each host a namespace of its own
    on its own address (its devices on ports from ``DEVICE_PORT`` up, its address their
    failure domain), TLS on; the cluster talks to them from this process (the root
    namespace). A host of one device is named as its device (``dev0``), others ``host0``...
    Everything is removed on exit, the folder too unless ``data`` names it."""
    reason = missing()
    if reason is not None:
        raise NetnsUnavailable(reason)
    assert 1 <= devices_per_host <= devices, (devices_per_host, devices)
    owns = data is None
    root = Path(tempfile.mkdtemp(prefix="quarry-netns-")) if owns else Path(data)
    root.mkdir(parents=True, exist_ok=True)
    network = Network()
    processes: dict[str, subprocess.Popen] = {}
    running: Cluster | None = None
    try:
        names = [f"dev{i}" for i in range(devices)]
        hosts = {
            name: name if devices_per_host == 1 else f"host{i // devices_per_host}"
            for i, name in enumerate(names)
        }
        links = {host: network.add(host) for host in dict.fromkeys(hosts.values())}
        addresses = tuple(link.address for link in links.values())
        credentials = make_credentials(root, addresses)
        specs = [
            DeviceSpec(
                name=name,
                address=f"grpc+tls://{link.address}:{DEVICE_PORT + i % devices_per_host}",
                data=str(root / name),
                profile=profile,
                profiles_file=profiles_file,
                credentials=str(credentials.folder),
                token_file=str(credentials.admin_token_file),
                ca_file=str(credentials.ca_file),
                host=link.address,
            )
            for i, name in enumerate(names)
            for link in (links[hosts[name]],)
        ]
        processes.update(_start_all(network, [links[hosts[s.name]] for s in specs], specs))
        specs = [replace(spec, pid=processes[spec.name].pid) for spec in specs]
        ClusterFile(tuple(specs)).write(root / "cluster.json")
        running = Cluster(tuple(specs), source=str(root / "cluster.json"))
        yield NamespacedCluster(
            network, running, tuple(specs), processes, root, profiles_file, hosts
        )
    finally:
        if running is not None:
            running.close()
        for process in processes.values():
            with contextlib.suppress(OSError):
                process.terminate()
        for process in processes.values():
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
        network.close()  # kills whatever still runs in its namespaces
        if owns:
            shutil.rmtree(root, ignore_errors=True)


# ---- a fault at a moment ------------------------------------------------------------------------

ROUND_TIMEOUT_S = 300.0  # a round whose work has not ended by then hangs: it is reported so


@dataclass
class Round:
    """One piece of work with a device's link cut while it ran: what came of it, and when."""

    victim: str
    cut_after_s: float  # from the start of the work to the cut
    seconds: float = 0.0  # the work's wall time, to its answer or its error
    landed: bool = False  # the work was still running when the link was cut
    hung: bool = False  # it had not ended after ``ROUND_TIMEOUT_S``
    error: BaseException | None = None
    result: object = None

    @property
    def after_cut_s(self) -> float:
        """From the cut to the work's end (what the silence bound bounds)."""
        return max(0.0, self.seconds - self.cut_after_s)

    def to_json(self) -> dict[str, object]:
        return {
            "victim": self.victim,
            "cut_after_s": round(self.cut_after_s, 3),
            "seconds": round(self.seconds, 3),
            "after_cut_s": round(self.after_cut_s, 3),
            "landed": self.landed,
            "hung": self.hung,
            "error": "" if self.error is None else f"{type(self.error).__name__}: {self.error}",
        }


def cut_during(
    running: NamespacedCluster,
    victim: str,
    cut_after_s: float,
    work: Callable[[], object],
    timeout_s: float = ROUND_TIMEOUT_S,
) -> Round:
    """Run ``work`` on a thread, cut ``victim``'s link ``cut_after_s`` into it, and wait for it
    (bounded). The link stays cut: healing is the caller's."""
    outcome = Round(victim, cut_after_s)
    ended = threading.Event()

    def run() -> None:
        try:
            outcome.result = work()
        except BaseException as error:  # handed to the caller
            outcome.error = error
        finally:
            outcome.seconds = time.perf_counter() - started
            ended.set()

    started = time.perf_counter()
    thread = threading.Thread(target=run, name="quarry-netns-round", daemon=True)
    thread.start()
    ended.wait(cut_after_s)
    outcome.landed = not ended.is_set()
    running.cut(victim)
    outcome.hung = not ended.wait(timeout_s)
    return outcome


def wait_until(condition: Callable[[], bool], timeout_s: float, period_s: float = 0.1) -> bool:
    """Whether ``condition`` came true within ``timeout_s`` (asked every ``period_s``)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(period_s)
    return True
