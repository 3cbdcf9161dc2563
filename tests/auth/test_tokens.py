"""Tokens: signed with the authority's Ed25519 key, checked with its public key; they expire,
can be revoked, and say which of these failed. The device role reads and writes nothing."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time

import pytest

from quarry.auth.revocation import Revocations, Verifier, checked, sign, with_revoked
from quarry.auth.tokens import OLDER, Role, mint, new_signing_key, read_claims, verify
from quarry.errors import ProtocolError, Unauthenticated
from quarry.protocol.control import RevocationList, RevocationPush, RevokedToken

KEY = new_signing_key()
PUBLIC = KEY.public_key()


def test_a_token_carries_its_role_subject_id_and_expiry():
    token = mint(KEY, Role.WRITER, ttl_s=3600, subject="lab")
    claims = verify(PUBLIC, token)
    assert (claims.role, claims.subject, len(claims.id)) == (Role.WRITER, "lab", 32)
    assert claims.expires_at - claims.issued_at == pytest.approx(3600, abs=0.01)
    assert read_claims(token) == claims


def test_a_token_of_another_key_is_refused():
    with pytest.raises(Unauthenticated, match="not issued for this cluster"):
        verify(PUBLIC, mint(new_signing_key(), Role.ADMIN))


def test_a_changed_claim_breaks_the_signature():
    body, signature = mint(KEY, Role.READER).split(".")
    claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    claims["role"] = "admin"
    raised = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    with pytest.raises(Unauthenticated, match="bad signature"):
        verify(PUBLIC, f"{raised}.{signature}")


def test_an_expired_token_says_when_it_expired():
    token = mint(KEY, Role.READER, ttl_s=60, now=time.time() - 3600)
    with pytest.raises(Unauthenticated, match=r"reader token expired at .* \(3,540 s ago\)"):
        verify(PUBLIC, token)


def test_a_revoked_token_names_its_id():
    token = mint(KEY, Role.READER)
    identifier = read_claims(token).id
    with pytest.raises(Unauthenticated, match=f"id {identifier}\\) was revoked"):
        verify(PUBLIC, token, frozenset({identifier}))


def test_an_older_quarrys_hmac_token_is_refused_saying_what_to_do():
    body = base64.urlsafe_b64encode(
        json.dumps({"role": "admin", "id": "x", "issued_at": 1.0}).encode()
    ).decode()
    body = body.rstrip("=")
    signature = hmac.new(b"s" * 32, body.encode(), hashlib.sha256).digest()
    token = f"{body}.{base64.urlsafe_b64encode(signature).decode().rstrip('=')}"
    with pytest.raises(Unauthenticated) as raised:
        verify(PUBLIC, token)
    assert str(raised.value) == OLDER and "quarry up" in OLDER


@pytest.mark.parametrize("ttl_s", [0, -1, 401 * 86_400])
def test_a_lifetime_out_of_bounds_is_refused(ttl_s):
    with pytest.raises(ValueError):
        mint(KEY, Role.READER, ttl_s=ttl_s)


def test_a_device_credential_may_only_do_what_devices_ask_each_other():
    assert Role.DEVICE.allows(Role.DEVICE)
    assert not any(Role.DEVICE.allows(r) for r in (Role.READER, Role.WRITER, Role.ADMIN))
    assert Role.ADMIN.allows(Role.DEVICE)
    assert not Role.WRITER.allows(Role.DEVICE) and not Role.READER.allows(Role.DEVICE)
    assert Role.WRITER.allows(Role.READER) and not Role.READER.allows(Role.WRITER)


def test_a_revocation_list_is_taken_only_if_signed_and_newer(tmp_path):
    first = sign(KEY, 2, (RevokedToken("a" * 32, time.time() + 60),))
    held = Revocations(PUBLIC, tmp_path / "held.json")
    assert held.take(first, ("grpc://p:1",)) and held.ids() == {"a" * 32}
    assert not held.take(sign(KEY, 1, ()))  # no rolling back
    forged = sign(new_signing_key(), 9, ())
    with pytest.raises(Unauthenticated, match="not signed by this cluster's authority"):
        held.take(forged)
    tampered = RevocationList(first.version + 1, first.issued_at, (), first.signature)
    with pytest.raises(Unauthenticated):
        checked(tampered, PUBLIC)
    again = Revocations(PUBLIC, tmp_path / "held.json")  # a restart starts from what it took
    assert (again.version, again.peers, again.ids()) == (2, ("grpc://p:1",), {"a" * 32})
    verifier = Verifier(PUBLIC, again)
    token = mint(KEY, Role.READER)
    assert verifier.check(token).role is Role.READER


def test_a_held_file_that_does_not_read_is_ignored(tmp_path):
    file = tmp_path / "held.json"
    file.write_text(json.dumps(RevocationPush(sign(new_signing_key(), 5, ())).to_json()))
    enrolled = sign(KEY, 1, ())
    assert Revocations(PUBLIC, file, enrolled).version == 1
    file.write_text("{")
    assert Revocations(PUBLIC, file, enrolled).version == 1


def test_the_list_keeps_each_id_once_and_drops_the_expired():
    now = time.time()
    current = RevocationList(1, now, (RevokedToken("a", now + 10), RevokedToken("b", now - 1)))
    kept = with_revoked(current, (RevokedToken("a", now + 20), RevokedToken("c", now + 5)), now)
    assert [(e.id, e.expires_at) for e in kept] == [("c", now + 5), ("a", now + 20)]


def test_too_many_peers_are_refused(tmp_path):
    held = Revocations(PUBLIC)
    with pytest.raises(ProtocolError):
        held.take(sign(KEY, 2, ()), tuple(f"grpc://p:{i}" for i in range(2000)))


def test_a_verifier_keeps_a_checked_token_yet_refuses_it_once_revoked(tmp_path):
    held = Revocations(PUBLIC, tmp_path / "held.json")
    verifier = Verifier(PUBLIC, held)
    token = mint(KEY, Role.READER)
    assert verifier.check(token) == verifier.check(token)  # the second from what it kept
    identifier = read_claims(token).id
    assert held.take(sign(KEY, 1, (RevokedToken(identifier, time.time() + 60),)))
    with pytest.raises(Unauthenticated, match="was revoked"):
        verifier.check(token)


def test_a_kept_token_still_expires(monkeypatch):
    verifier = Verifier(PUBLIC)
    token = mint(KEY, Role.READER, ttl_s=60)
    assert verifier.check(token).role is Role.READER
    later = time.time() + 120
    monkeypatch.setattr(time, "time", lambda: later)
    with pytest.raises(Unauthenticated, match="expired"):
        verifier.check(token)


def test_a_verifier_keeps_a_bounded_number_of_tokens():
    verifier = Verifier(PUBLIC)
    tokens = [mint(KEY, Role.READER) for _ in range(Verifier.VERIFIED_KEPT_MAX + 5)]
    for token in tokens:
        verifier.check(token)
    assert len(verifier._verified) == Verifier.VERIFIED_KEPT_MAX
    assert tokens[0] not in verifier._verified and tokens[-1] in verifier._verified
    body, signature = tokens[-1].split(".")
    other = "B" if signature[10] == "A" else "A"  # a byte of the signature itself changed
    with pytest.raises(Unauthenticated, match="bad signature"):  # another text: checked anew
        verifier.check(f"{body}.{signature[:10]}{other}{signature[11:]}")
