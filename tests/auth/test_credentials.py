"""The admin's authority and each device's enrolled folder: what each holds, who may read it,
and the clear errors when a folder is the wrong one (the authority, an older quarry's)."""

from __future__ import annotations

import json
import stat
import time

import pytest
from cryptography.hazmat.primitives import serialization

from quarry.auth import certificates
from quarry.auth.credentials import Credentials, create, init
from quarry.auth.enrollment import DeviceFolder, enroll, ensure_enrolled
from quarry.auth.tokens import Role, mint, read_claims, verify
from quarry.device.server import enrolled_name, security_of
from quarry.errors import ClusterError

AUTHORITY_FILES = [
    "admin.token", "ca.key", "ca.pem", "host.key", "host.pem", "revoked.json", "signing.key",
    "verify.pem",
]  # fmt: skip


def test_init_makes_an_owner_only_authority(tmp_path):
    authority = init(tmp_path / "authority", hosts=("admin.example",))
    assert sorted(p.name for p in authority.folder.iterdir()) == AUTHORITY_FILES
    assert stat.S_IMODE(authority.folder.stat().st_mode) == 0o700
    for path in authority.folder.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    claims = verify(authority.verify_key(), authority.admin_token())
    assert (claims.role, claims.subject) == (Role.ADMIN, "admin")
    assert claims.expires_at - claims.issued_at == pytest.approx(30 * 86_400, abs=1)
    hosts = certificates.hosts_of(authority.cert_file.read_bytes())
    assert "admin.example" in hosts and "127.0.0.1" in hosts
    assert authority.revocations().version == 1


def test_init_again_keeps_the_authority_and_renews_an_aging_admin_token(tmp_path):
    authority = init(tmp_path / "a", admin_ttl_s=3600)
    ca, token = authority.ca_file.read_bytes(), authority.admin_token()
    assert init(tmp_path / "a").admin_token() == token  # more than half its life left
    aging = mint(authority.signing_key(), Role.ADMIN, 100, now=time.time() - 60)
    authority.admin_token_file.write_text(aging)
    renewed = init(tmp_path / "a", admin_ttl_s=7200).admin_token()
    assert renewed != aging and authority.ca_file.read_bytes() == ca
    claims = read_claims(renewed)
    assert claims.expires_at - claims.issued_at == pytest.approx(7200, abs=1)


def test_the_admin_token_lifetime_is_a_setting(tmp_path, monkeypatch):
    monkeypatch.setenv("QUARRY_ADMIN_TOKEN_TTL_S", "600")
    claims = read_claims(init(tmp_path / "a").admin_token())
    assert claims.expires_at - claims.issued_at == pytest.approx(600, abs=1)


def _older_folder(folder):
    folder.mkdir(parents=True)
    for name in ("secret", "admin.token", "ca.pem", "ca.key", "device.pem", "device.key"):
        (folder / name).write_bytes(b"old")


def test_an_older_quarrys_folder_is_replaced_by_quarry_up_and_refused_by_a_device(tmp_path):
    _older_folder(tmp_path / "old")
    with pytest.raises(ClusterError, match="older quarry .* re-run `quarry up`"):
        security_of(tmp_path / "old", tls=False, insecure=False)
    _older_folder(tmp_path / "root" / "credentials")
    authority = create(tmp_path / "root")
    assert not (authority.folder / "secret").exists()
    assert sorted(p.name for p in authority.folder.iterdir()) == AUTHORITY_FILES


def test_enrollment_issues_a_folder_with_nothing_that_signs(tmp_path):
    authority = init(tmp_path / "authority")
    device = enroll(
        authority, "dev1", ("10.0.0.2", "dev1.lab"), tmp_path / "dev1", rack="r2", ttl_s=3600
    )
    names = sorted(p.name for p in device.folder.iterdir())
    assert names == [
        "ca.pem", "device.key", "device.pem", "device.token", "labels.json", "revoked.json",
        "verify.pem",
    ]  # fmt: skip
    assert stat.S_IMODE(device.folder.stat().st_mode) == 0o700
    private = [p.name for p in device.folder.iterdir() if b"PRIVATE KEY" in p.read_bytes()]
    assert private == ["device.key"]
    signing = authority.signing_key().private_bytes_raw()
    assert all(signing not in p.read_bytes() for p in device.folder.iterdir())
    public = serialization.load_pem_public_key(device.verify_key_file.read_bytes())
    assert public.public_bytes_raw() == authority.verify_key().public_bytes_raw()
    cert = device.cert_file.read_bytes()
    assert certificates.hosts_of(cert) == ("10.0.0.2", "dev1.lab")
    assert certificates.signed_by(cert, authority.ca_file.read_bytes())
    claims = verify(authority.verify_key(), device.token())
    assert (claims.role, claims.subject) == (Role.DEVICE, "dev1")
    assert claims.expires_at - claims.issued_at == pytest.approx(3600, abs=1)
    assert json.loads(device.labels_file.read_text()) == {
        "name": "dev1", "host": "10.0.0.2", "rack": "r2"
    }  # fmt: skip


def test_a_device_started_with_its_folder_runs_under_its_name(tmp_path):
    authority = init(tmp_path / "authority")
    enroll(authority, "dev1", ("127.0.0.1",), tmp_path / "dev1", host_label="rack-host-a")
    security = security_of(tmp_path / "dev1", tls=True, insecure=False, data=tmp_path / "data")
    assert security.labels.host == "rack-host-a" and security.credential
    assert security.peer.identity == DeviceFolder(tmp_path / "dev1").identity()
    assert enrolled_name(security, None) == "dev1"
    with pytest.raises(ClusterError, match="enrolled for device 'dev1', not 'dev2'"):
        enrolled_name(security, "dev2")
    with pytest.raises(ClusterError, match="verify-clients .*: add --tls"):
        security_of(tmp_path / "dev1", tls=False, insecure=False, verify_clients=True)


def test_the_authority_is_never_a_devices_folder(tmp_path):
    authority = init(tmp_path / "authority")
    with pytest.raises(ClusterError, match="holds the cluster's authority .* must never hold it"):
        security_of(authority.folder, tls=True, insecure=False)
    with pytest.raises(ClusterError, match="holds the cluster's authority"):
        enroll(authority, "dev0", ("127.0.0.1",), authority.folder)
    with pytest.raises(ClusterError, match="not an enrolled device's folder"):
        security_of(tmp_path, tls=False, insecure=False)


def test_a_folder_from_another_authority_is_enrolled_again(tmp_path):
    first, second = init(tmp_path / "one"), init(tmp_path / "two")
    folder = tmp_path / "dev0"
    kept = ensure_enrolled(first, "dev0", ("127.0.0.1",), folder)
    token = kept.token()
    assert ensure_enrolled(first, "dev0", ("127.0.0.1",), folder).token() == token
    again = ensure_enrolled(second, "dev0", ("127.0.0.1",), folder)
    assert again.ca_file.read_bytes() == second.ca_file.read_bytes()
    assert verify(second.verify_key(), again.token()).subject == "dev0"


@pytest.mark.parametrize("name", ["", "a b", "../x", "-x"])
def test_a_device_name_that_is_no_name_is_refused(tmp_path, name):
    with pytest.raises(ClusterError, match="device name"):
        enroll(init(tmp_path / "a"), name, ("127.0.0.1",), tmp_path / "d")


def test_a_token_is_minted_only_where_the_signing_key_is(tmp_path):
    authority = init(tmp_path / "a")
    token = authority.token(Role.READER, ttl_s=60)
    assert verify(authority.verify_key(), token).role is Role.READER
    with pytest.raises(ClusterError):
        Credentials(tmp_path / "nowhere").token(Role.READER)
