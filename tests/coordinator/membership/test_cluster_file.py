"""The cluster file: one read that names a wrong field, one atomic owner-only write, and the
files earlier quarry versions wrote still read."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import time

import pytest

from quarry.coordinator.membership.cluster_file import (
    ClusterFile,
    DeviceSpec,
    HostSpec,
    read_drives,
    write_drives,
)
from quarry.errors import ClusterError

READS_WHILE_WRITTEN = 300
WRITER_WRITES_MAX = 2000


def _device(name: str, port: int, **fields: object) -> DeviceSpec:
    return DeviceSpec(name, f"grpc://127.0.0.1:{port}", **fields)  # type: ignore[arg-type]


def _cluster() -> ClusterFile:
    drive = _device("s0d0", 7001, pid=11, data="/q/s0/d0", profile="kinetic", ca_file="/q/ca.pem")
    return ClusterFile(
        (
            _device(
                "dev0",
                7000,
                pid=10,
                data="/q/dev0",
                profile="host",
                profiles_file="p.toml",
                credentials="/q/credentials",
                token_file="/q/credentials/admin.token",
            ),
            _device("s0", 7002, pid=12, data="/q/s0", profile="host", drives=(drive,)),
            _device("reader", 7003, token="t0ken"),
        ),
        HostSpec("slowhost", "p.toml"),
    )


def test_a_written_file_reads_back_the_same(tmp_path):
    cluster = _cluster()
    path = cluster.write(tmp_path / "cluster.json")
    assert ClusterFile.read(path) == cluster
    body = json.loads(path.read_text())
    assert body["format"] == 1 and body["host"] == {
        "profile": "slowhost",
        "profiles_file": "p.toml",
    }
    # only what an entry says: no nulls, and drives only under a storage server
    assert body["devices"][2] == {
        "name": "reader",
        "address": "grpc://127.0.0.1:7003",
        "token": "t0ken",
    }
    assert "drives" not in body["devices"][0] and body["devices"][1]["drives"][0]["pid"] == 11


def test_files_earlier_versions_wrote_still_read(tmp_path):
    """As `quarry up --host-profile` wrote it (a server with its drives beside a drive), and as
    `quarry token create --output` wrote it (a token, no host)."""
    up = {
        "format": 1,
        "devices": [
            {
                "name": "s0",
                "address": "grpc://127.0.0.1:40001",
                "pid": 101,
                "data": "/d/s0",
                "profile": "host",
                "drives": [
                    {
                        "name": "s0d0",
                        "address": "grpc://127.0.0.1:40002",
                        "pid": 102,
                        "data": "/d/s0d0",
                        "profile": "kinetic",
                        "profiles_file": "/d/p.toml",
                        "credentials": "/d/credentials",
                        "token_file": "/d/credentials/admin.token",
                    }
                ],
                "credentials": "/d/credentials",
                "token_file": "/d/credentials/admin.token",
                "ca_file": "/d/credentials/ca.pem",
            },
            {
                "name": "d0",
                "address": "grpc+tls://127.0.0.1:40003",
                "pid": 103,
                "data": "/d/d0",
                "profile": "host",
                "credentials": "/d/credentials",
                "token_file": "/d/credentials/admin.token",
                "ca_file": "/d/credentials/ca.pem",
            },
        ],
        "host": {"profile": "slowhost", "profiles_file": None},
    }
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(up, indent=2))
    listed = ClusterFile.read(path)
    assert [d.name for d in listed.devices] == ["s0", "d0"]
    assert listed.devices[0].drives[0].profiles_file == "/d/p.toml"
    assert listed.devices[1].ca_file == "/d/credentials/ca.pem" and listed.devices[1].port == 40003
    assert listed.host == HostSpec("slowhost")
    assert listed.to_json() == up  # written back, the same JSON
    handed = {"format": 1, "devices": [{"name": "dev0", "address": "grpc://h:1", "token": "t"}]}
    path.write_text(json.dumps(handed))
    assert ClusterFile.read(path) == ClusterFile((DeviceSpec("dev0", "grpc://h:1", token="t"),))


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"devices": [{"name": "a", "address": "grpc://h:1", "pid": "x"}]}, "devices[0].pid"),
        (
            {"devices": [{"name": "a", "address": "grpc://h:1"}, {"name": "b"}]},
            "devices[1].address",
        ),
        ({"devices": [{"name": "a", "address": "grpc://h:1", "colour": "red"}]}, "colour"),
        ({"devices": [{"name": "", "address": "grpc://h:1"}]}, "a device needs a name"),
        (
            {"devices": [{"name": "s", "address": "grpc://h:1", "drives": [{"address": "x"}]}]},
            "devices[0].drives[0].name",
        ),
        ({"devices": [], "host": {"profiles_file": "p.toml"}}, "host.profile"),
        ({"devices": [], "hosts": {}}, "hosts"),
    ],
)
def test_a_wrong_field_is_named(tmp_path, body, named):
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"format": 1, **body}))
    with pytest.raises(ClusterError) as raised:
        ClusterFile.read(path)
    assert named in str(raised.value) and str(path) in str(raised.value)


def test_what_is_not_a_cluster_file_says_so(tmp_path):
    path = tmp_path / "cluster.json"
    with pytest.raises(ClusterError, match="no cluster file at .*quarry up"):
        ClusterFile.read(path)
    for text in ("{", "[1, 2]", '{"format": 2, "devices": []}', '{"format": 1}'):
        path.write_text(text)
        with pytest.raises(ClusterError, match="cluster file"):
            ClusterFile.read(path)


def test_the_file_is_the_owners_only(tmp_path):
    path = tmp_path / "cluster.json"
    path.write_text("{}")
    path.chmod(0o644)
    _cluster().write(path)  # replaced, not written into: the old mode does not carry over
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["cluster.json"]  # nothing left beside it


def test_a_device_is_replaced_or_removed_by_name():
    cluster = _cluster()
    restarted = DeviceSpec("dev0", "grpc://127.0.0.1:7000", pid=99)
    assert cluster.with_device(restarted).devices[0] == restarted
    assert cluster.with_device(restarted).devices[1:] == cluster.devices[1:]
    assert [d.name for d in cluster.without("s0").devices] == ["dev0", "reader"]
    assert cluster.without("s0").host == cluster.host
    with pytest.raises(ClusterError, match="no device 'ghost'.*dev0, s0, reader"):
        cluster.without("ghost")


def test_a_servers_drives_file(tmp_path):
    drives = _cluster().devices[1].drives
    assert read_drives(write_drives(tmp_path / "drives.json", drives)) == drives
    (tmp_path / "drives.json").write_text('[{"name": "d"}]')
    with pytest.raises(ClusterError, match=r"drives\[0\].address: missing"):
        read_drives(tmp_path / "drives.json")


WRITER = """
import sys
from pathlib import Path
from quarry.coordinator.membership.cluster_file import ClusterFile, DeviceSpec

path, stop = Path(sys.argv[1]), Path(sys.argv[2])
small = ClusterFile(tuple(DeviceSpec(f"d{i}", f"grpc://127.0.0.1:{i + 1}") for i in range(3)))
large = ClusterFile(
    tuple(DeviceSpec(f"d{i}", f"grpc://127.0.0.1:{i + 1}", data="/x" * 50) for i in range(2000))
)
for index in range(int(sys.argv[3])):
    (small if index % 2 else large).write(path)
    if stop.exists():
        break
"""


def test_a_file_written_while_another_process_reads_it_is_never_half_read(tmp_path):
    """Another process rewrites the file as fast as it can, large and small in turn; every
    read here sees one of the two whole, never a mix or a truncated file."""
    path, stop = tmp_path / "cluster.json", tmp_path / "stop"
    ClusterFile((DeviceSpec("d0", "grpc://127.0.0.1:1"),)).write(path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(WRITER),
            str(path),
            str(stop),
            str(WRITER_WRITES_MAX),
        ],
        env=env,
    )
    sizes = set()
    try:
        deadline = time.monotonic() + 60
        while len(sizes) < 3 and time.monotonic() < deadline:  # the writer has begun
            sizes.add(len(ClusterFile.read(path).devices))
        for _ in range(READS_WHILE_WRITTEN):
            sizes.add(len(ClusterFile.read(path).devices))
    finally:
        stop.touch()
        writer.wait(timeout=60)
    assert writer.returncode == 0
    assert sizes == {1, 3, 2000}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
