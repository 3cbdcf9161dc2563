"""The cluster file: the devices a coordinator talks to, and how it proves who it is to them.

``quarry up`` (and ``quarry.local``) writes it; ``quarry device restart`` and ``remove`` edit
it; ``quarry token create --output`` writes one that carries a token; ``quarry.connect``, every
command and the Flight SQL endpoint read it. It is read in one place (``ClusterFile.read``),
which checks every field and names the one that is wrong, and written in one
(``ClusterFile.write``): atomically, so a reader sees the old file or the new one and never
half of one, and owner-only (0600), since an entry may carry a token or say where the admin's
is. The JSON (format 1) is the one every quarry wrote so far::

    {"format": 1,
     "devices": [{"name": "dev0", "address": "grpc://127.0.0.1:40123", "pid": 4242,
                  "data": "/home/me/.quarry/dev0", "profile": "host",
                  "credentials": "...", "token_file": "...", "ca_file": "..."}, ...],
     "host": {"profile": "slowhost", "profiles_file": null}}

A device's keys other than ``name`` and ``address`` are optional (``host`` and ``rack`` name its
failure domain, ``drained`` is there once ``quarry device drain`` emptied it); the top-level
``host`` is there only when ``quarry up --host-profile`` named one. A storage server lists what
is behind it under ``drives``, as the file lists devices (docs/hierarchy.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Self

from quarry.errors import ClusterError, ProtocolError
from quarry.protocol.control import NAME_CHARS_MAX
from quarry.protocol.message import Message, bounded

CLUSTER_FILE_FORMAT = 1
ENTRIES_MAX = 1 << 16  # devices of one list (the host's, or one storage server's drives)
TOP_KEYS = frozenset({"format", "devices", "host"})


@dataclass(frozen=True)
class DeviceSpec(Message):
    """One device (or storage server) as the cluster file lists it."""

    name: str = bounded(chars_max=NAME_CHARS_MAX)
    address: str = bounded(chars_max=NAME_CHARS_MAX)  # grpc://host:port, grpc+tls://...
    # the process quarry started on this machine (None: started elsewhere, or by hand)
    pid: int | None = bounded(low=0, default=None)
    data: str | None = None  # its data folder (``quarry device restart`` starts it there)
    profile: str | None = None
    profiles_file: str | None = None  # the TOML file that defines a user's profile
    credentials: str | None = None  # the cluster's credentials folder (the admin's machine)
    token: str | None = None  # a token carried inline (``quarry token create --output``)
    token_file: str | None = None  # ... or the file that holds it (the admin's)
    ca_file: str | None = None  # the CA its TLS certificate chains to (TLS only)
    # its failure domain, as the cluster knows it when the device does not answer (the
    # device's hello says it otherwise): the host it runs on, its rack
    host: str | None = bounded(chars_max=NAME_CHARS_MAX, default=None)
    rack: str | None = bounded(chars_max=NAME_CHARS_MAX, default=None)
    # ``quarry device drain``: it holds nothing and takes nothing new (``device remove`` next)
    drained: bool = False
    # a storage server: the drives (and servers) behind it
    drives: tuple[DeviceSpec, ...] = bounded(items_max=ENTRIES_MAX, default=())

    def __post_init__(self) -> None:
        assert self.name, "a device needs a name"
        assert self.address, f"device {self.name} needs an address"

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    def to_json(self) -> dict[str, Any]:
        """Only the keys that say something, as every writer so far wrote them."""
        body = super().to_json()
        return {
            k: v for k, v in body.items() if v is not None and (k not in ("drives", "drained") or v)
        }


@dataclass(frozen=True)
class HostSpec(Message):
    """The host's own profile, applied by every coordinator that opens the file."""

    profile: str = bounded(chars_max=NAME_CHARS_MAX)
    profiles_file: str | None = None


@dataclass(frozen=True)
class ClusterFile:
    """The whole file: the host's devices (each storage server with what is behind it) and
    the host's own profile, if one was named."""

    devices: tuple[DeviceSpec, ...]
    host: HostSpec | None = None
    format: int = CLUSTER_FILE_FORMAT

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "format": self.format,
            "devices": [d.to_json() for d in self.devices],
        }
        if self.host is not None:
            body["host"] = self.host.to_json()
        return body

    @classmethod
    def read(cls, path: str | Path) -> Self:
        """The file at ``path``, every field checked; a clear ``ClusterError`` otherwise."""
        path = Path(path)
        try:
            body = json.loads(path.read_text())
        except FileNotFoundError:
            raise ClusterError(
                f"no cluster file at {path}: start a cluster with `quarry up` or pass "
                "--cluster FILE"
            ) from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ClusterError(f"cannot read cluster file {path}: {error}") from None
        if (
            not isinstance(body, dict)
            or body.get("format") != CLUSTER_FILE_FORMAT
            or not isinstance(body.get("devices"), list)
        ):
            raise ClusterError(
                f"{path} is not a quarry cluster file (format {CLUSTER_FILE_FORMAT})"
            )
        try:
            return cls.from_json(body)
        except ProtocolError as error:
            raise ClusterError(f"cluster file {path}: {error}") from None

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Self:
        """Each entry checked on its own, so an error names it: ``devices[1].pid: expected an
        integer, got 'x'``."""
        unknown = sorted(set(body) - TOP_KEYS)
        if unknown:
            raise ProtocolError(f"unknown field(s) {', '.join(unknown)}")
        host = body.get("host")
        return cls(
            _entries(body["devices"], "devices"),
            None if host is None else HostSpec.from_json(host, "host"),
        )

    def write(self, path: str | Path) -> Path:
        """Write the whole file anew beside the old one, then put it in its place: a reader
        (another process's ``read``) sees one or the other, never half. Owner-only: an entry
        may carry a token."""
        return _write_private(Path(path), json.dumps(self.to_json(), indent=2))

    def device(self, name: str) -> DeviceSpec:
        for spec in self.devices:
            if spec.name == name:
                return spec
        known = ", ".join(d.name for d in self.devices)
        raise ClusterError(f"no device {name!r} in the cluster file; it lists {known}")

    def with_device(self, spec: DeviceSpec) -> Self:
        """The file with the entry of the device named ``spec.name`` replaced by ``spec``."""
        self.device(spec.name)
        return replace(
            self, devices=tuple(spec if d.name == spec.name else d for d in self.devices)
        )

    def with_added(self, spec: DeviceSpec) -> Self:
        """The file with a new device at its end (``quarry device add``)."""
        if any(d.name == spec.name for d in self.devices):
            raise ClusterError(f"the cluster file already lists a device {spec.name!r}")
        if any(d.address == spec.address for d in self.devices):
            raise ClusterError(f"the cluster file already lists a device at {spec.address}")
        return replace(self, devices=(*self.devices, spec))

    def without(self, name: str) -> Self:
        self.device(name)
        return replace(self, devices=tuple(d for d in self.devices if d.name != name))


def read_drives(path: str | Path) -> tuple[DeviceSpec, ...]:
    """What a storage server fronts (``python -m quarry.server serve --drives FILE``): a list
    of entries, as the cluster file lists devices."""
    try:
        return _entries(json.loads(Path(path).read_text()), "drives")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, ProtocolError) as error:
        raise ClusterError(f"cannot read the drives file {path}: {error}") from None


def write_drives(path: str | Path, drives: tuple[DeviceSpec, ...]) -> Path:
    return _write_private(Path(path), json.dumps([d.to_json() for d in drives], indent=1))


def _entries(body: Any, where: str) -> tuple[DeviceSpec, ...]:
    if not isinstance(body, list):
        raise ProtocolError(f"{where}: expected a list, got {type(body).__name__}")
    if len(body) > ENTRIES_MAX:
        raise ProtocolError(f"{where}: more than {ENTRIES_MAX} entries ({len(body)})")
    return tuple(DeviceSpec.from_json(d, f"{where}[{i}]") for i, d in enumerate(body))


def _write_private(path: Path, text: str) -> Path:
    """``text`` written to a new file beside ``path`` (0600, as ``mkstemp`` makes it), synced,
    then renamed over it: atomic for every reader."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(descriptor, "w") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return path
