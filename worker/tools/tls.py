"""`doctor`'s TLS check: a handshake with the first bootstrap server, made the way librdkafka makes it with
the configuration it gets (`librdkafka_common()`, kafka_extra's overrides included: the CA file, the client
certificate for mTLS, the host name and certificate checks), and what went wrong in one line: unknown CA,
expired, wrong host, not a TLS port, client certificate refused.

Only file names and certificate fields appear in the verdict; key material is read by OpenSSL alone.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worker.config import KafkaSettings, SecuritySettings, librdkafka_common

# OpenSSL X509_V_ERR_* codes a handshake meets.
_UNKNOWN_CA = {2, 18, 19, 20, 21, 27}  # unable to get issuer / self-signed (in chain) / untrusted
_EXPIRED = 10
_NOT_YET_VALID = 9
_HOSTNAME_MISMATCH = 62
_IP_MISMATCH = 64

CA_FIX = "set SENTIMENT_SSL_CA_LOCATION to the PEM file of the CA that signed the broker's certificate"
EXPIRED_FIX = "renew the broker's certificate (the launcher: remove <data-dir>/tls and `up --secure` again)"
HOST_FIX = (
    "connect by a name the certificate holds (SENTIMENT_BOOTSTRAP_SERVERS, e.g. localhost) or reissue it "
    "with this host in its subjectAltName"
)
NOT_TLS_FIX = "this port is not a TLS listener: use the broker's SSL/SASL_SSL port or its security protocol"
CLIENT_CERT_FIX = (
    "use a client certificate signed by a CA the broker trusts, not expired "
    "(SENTIMENT_SSL_CERTIFICATE_LOCATION and SENTIMENT_SSL_KEY_LOCATION)"
)
CLIENT_FILES_FIX = "check SENTIMENT_SSL_CERTIFICATE_LOCATION and SENTIMENT_SSL_KEY_LOCATION (a PEM pair)"


@dataclass(frozen=True)
class Handshake:
    """The outcome: ``ok`` with a description, or what is wrong and its fix; ``unverified``: it succeeded
    only because the configuration turns the broker's certificate check off."""

    ok: bool
    detail: str
    fix: str | None = None
    unverified: bool = False


@dataclass(frozen=True)
class TlsTarget:
    """What librdkafka's TLS uses, read from the configuration it gets."""

    bootstrap_servers: str
    ca: Path | None
    certificate: Path | None
    key: Path | None
    check_hostname: bool
    verify: bool

    @classmethod
    def of(cls, conf: Mapping[str, Any]) -> TlsTarget:
        """From a librdkafka configuration (`WorkerSettings.librdkafka_common()`)."""

        def path(key: str) -> Path | None:
            return Path(str(conf[key])) if conf.get(key) else None

        verify = str(conf.get("enable.ssl.certificate.verification", True)).lower() not in ("false", "0")
        algorithm = str(conf.get("ssl.endpoint.identification.algorithm", "https")).lower()
        return cls(
            bootstrap_servers=str(conf.get("bootstrap.servers", "")),
            ca=path("ssl.ca.location"),
            certificate=path("ssl.certificate.location"),
            key=path("ssl.key.location"),
            check_hostname=verify and algorithm != "none",
            verify=verify,
        )


def uses_tls(conf: Mapping[str, Any]) -> bool:
    """True when a librdkafka configuration's security.protocol is SSL or SASL_SSL."""
    return str(conf.get("security.protocol") or "PLAINTEXT").upper() in ("SSL", "SASL_SSL")


def first_server(bootstrap_servers: str) -> tuple[str, int]:
    """``host:port`` of the first bootstrap server (a bare host gets 9092; [v6]:port is understood)."""
    first = bootstrap_servers.split(",")[0].strip()
    for prefix in ("SSL://", "SASL_SSL://"):
        first = first.removeprefix(prefix)
    host, sep, port = first.rpartition(":")
    if not sep:
        return first, 9092
    return host.strip("[]"), int(port)


def tls_context(target: TlsTarget) -> ssl.SSLContext:
    """A client context like librdkafka's for this target (raises ssl.SSLError / OSError on bad files)."""
    context = ssl.create_default_context(cafile=str(target.ca) if target.ca is not None else None)
    context.check_hostname = target.check_hostname
    if not target.verify:
        context.verify_mode = ssl.CERT_NONE
    if target.certificate is not None and target.key is not None:
        context.load_cert_chain(str(target.certificate), str(target.key))
    return context


def handshake(kafka: KafkaSettings, security: SecuritySettings, timeout_s: float = 5.0) -> Handshake:
    """Connects to the first bootstrap server librdkafka would dial and shakes hands as it would; never
    raises."""
    target = TlsTarget.of(librdkafka_common(kafka, security))
    host, port = first_server(target.bootstrap_servers)
    files = {
        "SENTIMENT_SSL_CA_LOCATION": target.ca,
        "SENTIMENT_SSL_CERTIFICATE_LOCATION": target.certificate,
        "SENTIMENT_SSL_KEY_LOCATION": target.key,
    }
    for name, path in files.items():
        if path is not None and not path.is_file():
            return Handshake(False, f"{name}: no file at {path}", f"point {name} at an existing PEM file")
    try:
        context = tls_context(target)
    except (ssl.SSLError, OSError) as exc:
        return Handshake(
            False, f"cannot load the client certificate or key ({_reason(exc)})", CLIENT_FILES_FIX
        )
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
    except OSError as exc:
        # No answer at all: the broker check says that (and its fix) better.
        return Handshake(False, f"cannot connect to {host}:{port} ({exc.strerror or exc})")
    try:
        with sock, context.wrap_socket(sock, server_hostname=host) as tls:
            version, peer = tls.version(), tls.getpeercert() or {}
            refused = _client_refused(tls)
    except ssl.SSLCertVerificationError as exc:
        return verify_failure(exc.verify_code, exc.verify_message, host)
    except ssl.SSLError as exc:
        return ssl_failure(_reason(exc), client_cert=target.certificate is not None)
    except OSError as exc:  # connected, then hung up on the ClientHello: EOF / reset
        return ssl_failure(f"eof: {exc.strerror or exc}", client_cert=target.certificate is not None)
    if refused is not None:
        return ssl_failure(refused, client_cert=target.certificate is not None)
    if not target.verify:  # getpeercert() is empty without verification: nothing was checked
        return Handshake(
            True,
            f"{host}:{port} {version}; the broker's certificate NOT verified "
            "(enable.ssl.certificate.verification=false): anyone on the path can pose as the broker",
            CA_FIX,
            unverified=True,
        )
    subject = _name(peer.get("subject", ()))
    issuer = _name(peer.get("issuer", ()))
    hostname = "host name checked" if target.check_hostname else "host name NOT checked"
    return Handshake(
        True,
        f"{host}:{port} {version}, certificate {subject} by {issuer}, valid until {peer.get('notAfter')}; "
        f"{hostname}",
    )


def verify_failure(code: int, message: str, host: str) -> Handshake:
    """A failed check of the broker's certificate, by OpenSSL's verify code."""
    if code in _UNKNOWN_CA:
        return Handshake(
            False, f"unknown CA: the broker's certificate is not signed by a trusted CA ({message})", CA_FIX
        )
    if code == _EXPIRED:
        return Handshake(
            False, f"expired: the broker's certificate is past its notAfter date ({message})", EXPIRED_FIX
        )
    if code == _NOT_YET_VALID:
        return Handshake(
            False, f"not yet valid: the broker's certificate starts later ({message})", EXPIRED_FIX
        )
    if code in (_HOSTNAME_MISMATCH, _IP_MISMATCH):
        return Handshake(
            False, f"wrong host: the broker's certificate does not name {host!r} ({message})", HOST_FIX
        )
    return Handshake(False, f"the broker's certificate was refused ({message})", CA_FIX)


def ssl_failure(reason: str, *, client_cert: bool) -> Handshake:
    """A handshake that failed for another reason than our check of the broker's certificate."""
    lowered = reason.lower()
    if any(sign in lowered for sign in ("wrong version number", "record layer", "packet length", "eof")):
        return Handshake(False, f"not a TLS listener: it hung up on the handshake ({reason})", NOT_TLS_FIX)
    if ("alert" in lowered or "certificate required" in lowered) and not client_cert:
        return Handshake(
            False,
            f"the broker requires a client certificate (mTLS) and none is set ({reason})",
            CLIENT_CERT_FIX,
        )
    if "alert" in lowered or "certificate required" in lowered:
        if "expired" in lowered:
            return Handshake(
                False, f"the broker refused this client's certificate: expired ({reason})", CLIENT_CERT_FIX
            )
        return Handshake(False, f"the broker refused this client's certificate ({reason})", CLIENT_CERT_FIX)
    return Handshake(False, f"TLS handshake failed ({reason})", CA_FIX)


def _client_refused(tls: ssl.SSLSocket) -> str | None:
    """TLS 1.3 sends the server's verdict on our certificate after the handshake: read briefly for it."""
    if tls.version() != "TLSv1.3":
        return None
    tls.settimeout(1.0)
    try:
        tls.recv(1)
    except ssl.SSLError as exc:
        return _reason(exc)
    except (TimeoutError, OSError):
        return None  # nothing to say: the broker waits for a request
    return None


def _reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    return str(reason or exc).replace("_", " ").lower() if reason else str(exc)


def _name(rdns: object) -> str:
    """``CN=...`` of a getpeercert() subject/issuer."""
    parts = []
    for rdn in rdns if isinstance(rdns, tuple) else ():
        for key, value in rdn:
            if key == "commonName":
                parts.append(f"CN={value}")
    return ",".join(parts) or "?"
