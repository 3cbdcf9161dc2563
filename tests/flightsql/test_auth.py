"""Every call carries a quarry token, as a bearer header or as the password of a login; each
query runs with that token against the devices. Off loopback, only TLS."""

from __future__ import annotations

import json

import adbc_driver_manager
import pytest

from quarry.auth.tokens import Role, mint, new_signing_key
from quarry.errors import ClusterError
from quarry.flightsql.serve import Options, start

QUERY = "SELECT count(*) AS n FROM lab.runs"


def _answer(connection) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(QUERY)
        return cursor.fetchall()


def test_a_reader_token_as_a_bearer_header_queries(endpoint):
    with endpoint.connect() as connection:
        assert _answer(connection) == [(200,)]


@pytest.mark.parametrize(
    "credentials",
    [
        {},  # no token at all
        {"adbc.flight.sql.authorization_header": "Bearer not-a-token"},
        {"adbc.flight.sql.authorization_header": f"Bearer {mint(new_signing_key(), Role.ADMIN)}"},
        {"username": "token", "password": "wrong"},
    ],
    ids=["missing", "malformed", "another-clusters", "wrong-password"],
)
def test_a_call_without_a_token_of_this_cluster_is_refused(endpoint, credentials):
    import adbc_driver_flightsql.dbapi as flight_sql

    with pytest.raises(adbc_driver_manager.Error) as raised:  # noqa: SIM117 - connect may raise
        with flight_sql.connect(endpoint.uri, db_kwargs=credentials, autocommit=True) as connection:
            _answer(connection)
    assert "UNAUTHENTICATED" in str(raised.value)
    assert "token" in str(raised.value)


def test_a_login_with_the_token_as_password_gets_a_bearer_token(endpoint):
    with endpoint.connect(username="token", password=endpoint.token) as connection:
        assert _answer(connection) == [(200,)]


def test_without_the_secret_the_devices_check_each_callers_token(endpoint, tmp_path):
    """An endpoint started from a handed-out cluster file (a reader token, no credentials) can
    not check signatures itself: the devices do, because queries go with the caller's token."""
    handed = [
        {"name": d.name, "address": d.address, "token": endpoint.token}
        for d in endpoint.cluster.specs
    ]
    file = tmp_path / "reader.json"
    file.write_text(json.dumps({"format": 1, "devices": handed}))
    server = start(file)
    try:
        uri = f"grpc://127.0.0.1:{server.port}"
        import adbc_driver_flightsql.dbapi as flight_sql

        forged = {
            "adbc.flight.sql.authorization_header": f"Bearer {mint(new_signing_key(), Role.READER)}"
        }
        for ask in (_answer, lambda c: c.adbc_get_info(), lambda c: c.adbc_get_table_types()):
            with (
                pytest.raises(adbc_driver_manager.Error, match="not issued for this cluster"),
                flight_sql.connect(uri, db_kwargs=forged, autocommit=True) as connection,
            ):
                ask(connection)
        bearer = {"adbc.flight.sql.authorization_header": f"Bearer {endpoint.token}"}
        with flight_sql.connect(uri, db_kwargs=bearer, autocommit=True) as connection:
            assert _answer(connection) == [(200,)]
    finally:
        server.shutdown()


def test_off_loopback_the_endpoint_needs_tls(endpoint):
    with pytest.raises(ClusterError, match="must use TLS"):
        start(endpoint.cluster.cluster_file, Options(host="0.0.0.0"))


def test_over_tls_a_client_checks_the_endpoint_against_the_clusters_ca(endpoint):
    import adbc_driver_flightsql.dbapi as flight_sql

    server = start(endpoint.cluster.cluster_file, Options(tls=True))
    ca = endpoint.credentials.ca_file.read_text()
    try:
        assert server.scheme == "grpc+tls"
        kwargs = {
            "adbc.flight.sql.authorization_header": f"Bearer {endpoint.token}",
            "adbc.flight.sql.client_option.tls_root_certs": ca,
        }
        uri = f"grpc+tls://127.0.0.1:{server.port}"
        with flight_sql.connect(uri, db_kwargs=kwargs, autocommit=True) as connection:
            assert _answer(connection) == [(200,)]
        del kwargs["adbc.flight.sql.client_option.tls_root_certs"]  # the system's CAs only
        with (
            pytest.raises(adbc_driver_manager.Error),
            flight_sql.connect(uri, db_kwargs=kwargs, autocommit=True) as connection,
        ):
            _answer(connection)
    finally:
        server.shutdown()
