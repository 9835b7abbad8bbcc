"""doctor's TLS check against a real TLS server (Python's ssl, certificates from the launcher's openssl
maker): each failure gets its one-line name and fix; key material never shows."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kafka_fixtures import load_launcher
from worker.config import WorkerSettings
from worker.tools import doctor, tls
from worker.tools.checks import Check
from worker.tools.tls import (
    CA_FIX,
    CLIENT_CERT_FIX,
    EXPIRED_FIX,
    HOST_FIX,
    NOT_TLS_FIX,
    Handshake,
    verify_failure,
)

kafka_tls: Any = load_launcher().kafka_tls


def handshake(settings: WorkerSettings) -> Handshake:
    """`tls.handshake` with the kafka and security sections of `settings`."""
    return tls.handshake(settings.sections.kafka, settings.sections.security)


def check_tls(settings: WorkerSettings) -> Check:
    """doctor's `check_tls` with the kafka and security sections of `settings`."""
    return doctor.check_tls(settings.sections.kafka, settings.sections.security)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    ours = kafka_tls.make_certificates(tmp_path_factory.mktemp("ours"))
    other = kafka_tls.make_ca(tmp_path_factory.mktemp("other"), cn="another CA")
    kafka_tls.make_leaf(other, "worker")
    return ours, other


def _serve(context: ssl.SSLContext | None) -> Iterator[int]:
    """Accepts connections on a free port; TLS with `context` (None: plain TCP that hangs up)."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    stop = threading.Event()

    def run() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            try:
                if context is None:
                    conn.recv(100)
                else:
                    with context.wrap_socket(conn, server_side=True) as tls:
                        tls.settimeout(2)
                        tls.recv(1)
            except (OSError, ssl.SSLError):
                pass
            finally:
                conn.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    yield port
    stop.set()
    thread.join(5)
    server.close()


@pytest.fixture
def broker_port(pki: tuple[Any, Any]) -> Iterator[int]:
    ours, _ = pki
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(ours.cert("kafka-broker"), ours.key("kafka-broker"))
    context.load_verify_locations(ours.ca)
    context.verify_mode = ssl.CERT_REQUIRED  # like the broker's SSL listener: mTLS
    yield from _serve(context)


def settings(port: int, ca: Path, host: str = "localhost", **extra: Any) -> WorkerSettings:
    return WorkerSettings(
        bootstrap_servers=f"{host}:{port}", security_protocol="SSL", ssl_ca_location=ca, **extra
    )


def test_our_ca_and_client_certificate_pass_and_name_the_broker(
    pki: tuple[Any, Any], broker_port: int
) -> None:
    ours, _ = pki
    outcome = handshake(
        settings(
            broker_port,
            ours.ca,
            ssl_certificate_location=ours.cert("worker"),
            ssl_key_location=ours.key("worker"),
        )
    )
    assert outcome.ok, outcome.detail
    assert "CN=kafka-broker by CN=launcher local CA" in outcome.detail
    assert "host name checked" in outcome.detail


def test_each_failure_is_named_with_its_fix(pki: tuple[Any, Any], broker_port: int) -> None:
    ours, other = pki
    client = {"ssl_certificate_location": ours.cert("worker"), "ssl_key_location": ours.key("worker")}
    unknown_ca = handshake(settings(broker_port, other.ca, **client))
    assert (unknown_ca.ok, unknown_ca.fix) == (False, CA_FIX) and unknown_ca.detail.startswith("unknown CA")
    wrong_host = handshake(settings(broker_port, ours.ca, host="127.0.0.1", **client))
    assert (wrong_host.ok, wrong_host.fix) == (False, HOST_FIX)
    assert wrong_host.detail.startswith("wrong host: the broker's certificate does not name '127.0.0.1'")
    unchecked = handshake(
        settings(broker_port, ours.ca, host="127.0.0.1", ssl_endpoint_identification=False, **client)
    )
    assert unchecked.ok and "host name NOT checked" in unchecked.detail
    foreign = {"ssl_certificate_location": other.cert("worker"), "ssl_key_location": other.key("worker")}
    refused = handshake(settings(broker_port, ours.ca, **foreign))
    assert (refused.ok, refused.fix) == (False, CLIENT_CERT_FIX)
    assert refused.detail.startswith("the broker refused this client's certificate")
    none = handshake(settings(broker_port, ours.ca))
    assert none.detail.startswith("the broker requires a client certificate (mTLS) and none is set")
    missing = handshake(settings(broker_port, ours.ca.with_name("nope.pem")))
    assert missing.detail == f"SENTIMENT_SSL_CA_LOCATION: no file at {ours.ca.with_name('nope.pem')}"
    keys = [ours.key("worker").read_text(), other.key("worker").read_text()]
    for outcome in (unknown_ca, wrong_host, refused, none, missing):
        assert "PRIVATE KEY" not in outcome.detail
        assert not any(line in outcome.detail for key in keys for line in key.splitlines()[1:-1])


def test_a_plain_port_is_not_a_tls_listener(pki: tuple[Any, Any]) -> None:
    ours, _ = pki
    for port in _serve(None):
        outcome = handshake(settings(port, ours.ca))
        assert (outcome.ok, outcome.fix) == (False, NOT_TLS_FIX), outcome.detail


def test_verify_codes_map_to_expired_and_not_yet_valid() -> None:
    expired = verify_failure(10, "certificate has expired", "localhost")
    assert expired.detail.startswith("expired: ") and expired.fix == EXPIRED_FIX
    assert verify_failure(9, "certificate is not yet valid", "localhost").detail.startswith("not yet valid")
    assert verify_failure(20, "unable to get local issuer certificate", "h").detail.startswith("unknown CA")


def test_the_handshake_is_made_with_the_configuration_librdkafka_gets(
    pki: tuple[Any, Any], broker_port: int
) -> None:
    """kafka_extra's overrides (allowed) are what librdkafka uses, so they are what doctor checks. Before:
    doctor checked the settings alone, and said `unknown CA` for a client that connects without checking
    the certificate at all (enable.ssl.certificate.verification=false)."""
    ours, other = pki
    client = {"ssl_certificate_location": ours.cert("worker"), "ssl_key_location": ours.key("worker")}
    unverified = settings(
        broker_port,
        other.ca,  # a CA that did not sign the broker's certificate
        kafka_extra={"enable.ssl.certificate.verification": False},
        allow_kafka_extra_overrides=True,
        **client,
    )
    outcome = handshake(unverified)
    assert outcome.ok and outcome.unverified and outcome.fix == CA_FIX
    assert "NOT verified (enable.ssl.certificate.verification=false)" in outcome.detail
    check = check_tls(unverified)
    assert check.verdict == "WARN" and "NOT verified" in check.detail
    moved = settings(
        1,  # nothing listens there: the override's address is the one dialled
        ours.ca,
        kafka_extra={"bootstrap.servers": f"localhost:{broker_port}"},
        allow_kafka_extra_overrides=True,
        **client,
    )
    assert handshake(moved).ok and f"localhost:{broker_port} TLS" in handshake(moved).detail
