"""Which processes a cluster on this machine has, and starting them all.

Two shapes: N devices side by side over one folder (``start_local``, what ``quarry up
--devices N`` starts), or a tree of storage servers over drives of any depth (``start_tree``;
``hierarchy_layout`` builds the usual two levels). Processes of one level start at once (each
spends most of its start importing); a start that fails kills every process started so far.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from quarry.auth.credentials import create as create_credentials
from quarry.coordinator.membership.cluster_file import DeviceSpec
from quarry.coordinator.processes.spawn import start_device, start_server
from quarry.device.profile import get_profile
from quarry.errors import ClusterError

DEVICES_MAX = 64
STARTS_AT_ONCE = 8  # device processes starting at the same time

Start = Callable[[], tuple[DeviceSpec, subprocess.Popen]]


@dataclass(frozen=True)
class Started:
    """The processes started for one cluster: the entries of the devices the host talks to
    (what the cluster file lists), and every process by name, those devices first, then what
    stands behind storage servers."""

    specs: tuple[DeviceSpec, ...]
    processes: dict[str, subprocess.Popen]


def _start_at_once(starts: dict[str, Start]) -> dict[str, tuple[DeviceSpec, subprocess.Popen]]:
    """Every start at once (at most ``STARTS_AT_ONCE`` together), each waited for until it
    listens; if one fails, those that started are killed and the first error is raised."""
    started: dict[str, tuple[DeviceSpec, subprocess.Popen]] = {}
    failures: list[BaseException] = []
    with ThreadPoolExecutor(max(1, min(STARTS_AT_ONCE, len(starts))), "quarry-start") as pool:
        futures = {name: pool.submit(start) for name, start in starts.items()}
        for name, future in futures.items():
            try:
                started[name] = future.result()
            except BaseException as error:
                failures.append(error)
    if failures:
        for _, process in started.values():
            process.kill()
        raise failures[0]
    return started


def start_local(
    devices: int = 3,
    profile: str | list[str] = "host",
    data: str | Path | None = None,
    detach: bool = False,
    profiles_file: str | None = None,
    tls: bool = False,
    hosts: int = 0,
) -> tuple[Started, Path, bool]:
    """Start ``devices`` device processes on loopback over a folder (a new temporary one,
    which the caller owns, when ``data`` is None). The cluster's authority (a CA, a token
    signing key, an admin token) is made in the folder first, owner-readable only, and each
    device is enrolled with a folder of its own; every device checks every call's token, over
    TLS if ``tls``.
    ``hosts`` > 0: the devices say they run on that many hosts, dealt round-robin (``host0``,
    ``host1``...), so failure domains can be tried on one machine; 0: on this machine."""
    if not 1 <= devices <= DEVICES_MAX:
        raise ClusterError(f"devices must be between 1 and {DEVICES_MAX}, got {devices}")
    if not 0 <= hosts <= devices:
        raise ClusterError(f"hosts must be between 0 and the devices ({devices}), got {hosts}")
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

    def start(index: int, device_profile: str) -> Start:
        name = f"dev{index}"
        host = emulated_host(index, hosts)
        return lambda: start_device(
            root / name, name, device_profile, 0, detach, profiles_file, credentials, tls, host
        )

    try:
        started = _start_at_once({f"dev{i}": start(i, p) for i, p in enumerate(profiles)})
    except BaseException:
        if owns:
            shutil.rmtree(root, ignore_errors=True)
        raise
    specs = tuple(spec for spec, _ in started.values())
    return Started(specs, {name: process for name, (_, process) in started.items()}), root, owns


def emulated_host(index: int, hosts: int) -> str | None:
    """The host the ``index``-th local device says it runs on, of ``hosts`` emulated ones
    (None: this machine's own name)."""
    return f"host{index % hosts}" if hosts else None


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
) -> Started:
    """Start a cluster of any depth: ``layout`` lists what the host talks to, a drive's profile
    name or a storage server's own layout, e.g. ``[["kinetic", ["host", "scaleflux"]], "host"]``
    (a server in front of a kinetic drive and of a second server, and a drive of the host's).
    Drives start first, all at once; then the servers, deepest first, each level at once."""
    nodes = _nodes(layout)
    every = list(_walk(nodes))
    drives = [n for n in every if n.profile is not None]
    if not 1 <= len(drives) <= DEVICES_MAX:
        raise ClusterError(f"a cluster has 1 to {DEVICES_MAX} drives, got {len(drives)}")
    for profile in {n.profile for n in drives} | {server_profile}:
        get_profile(profile, profiles_file)  # fail fast, before any process starts
    credentials = create_credentials(data)
    started: dict[str, tuple[DeviceSpec, subprocess.Popen]] = {}

    def start(node: _Node) -> Start:
        if node.profile is not None:
            profile = node.profile
            return lambda: start_device(
                data / node.name, node.name, profile, 0, detach, profiles_file, credentials, tls
            )
        # called once the wave below has started: its entries are known by then
        return lambda: start_server(
            data / node.name,
            node.name,
            server_profile,
            tuple(started[n.name][0] for n in node.below),
            profiles_file,
            credentials,
            tls,
            detach,
        )

    servers = [n for n in every if n.profile is None]
    depths = sorted({n.depth for n in servers}, reverse=True)
    waves = [drives] + [[n for n in servers if n.depth == depth] for depth in depths]
    for wave in waves:  # one wave at a time: a server's start reads the entries below it
        try:
            started.update(_start_at_once({n.name: start(n) for n in wave}))
        except BaseException:
            for _, process in started.values():
                process.kill()
            raise
    top = tuple(started[n.name][0] for n in nodes)
    order = [n.name for n in nodes] + [n.name for n in every if n.depth > 0]
    return Started(top, {name: started[name][1] for name in order})
