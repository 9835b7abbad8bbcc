"""TLS and ACLs for the launcher's broker (`launcher.py up --secure`): certificates made with openssl, and
the server.properties of the SSL / SASL_SSL listeners with KRaft's StandardAuthorizer.

Certificates live in ``<data-dir>/tls`` (keys mode 0600), made once per data dir and reused:
- ``ca.pem`` / ``ca.key``: a private CA (what clients trust: SENTIMENT_SSL_CA_LOCATION);
- ``broker.pem`` / ``broker.key``: CN=kafka-broker, SAN DNS:localhost only (the advertised host), also its
  client certificate towards the controller and the inter-broker listener;
- ``<name>.pem`` / ``<name>.key`` per client (``admin`` and ``worker`` by default): CN=<name>, which the
  broker maps to the principal ``User:<name>``.

Principals: mTLS clients are ``User:<CN>``; SASL_SSL clients ``User:<sasl name>``; PLAINTEXT is
``User:ANONYMOUS`` and is granted nothing (it still answers metadata requests: the launcher's readiness
probe). Super users: ``User:kafka-broker`` (the controller and inter-broker principal) and ``User:admin``.
Stdlib only.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

BROKER_CN = "kafka-broker"
ADMIN_CN = "admin"
DEFAULT_CLIENTS = (ADMIN_CN, "worker")
SUPER_USERS = (f"User:{BROKER_CN}", f"User:{ADMIN_CN}")
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
CERT_DAYS = 365
# ECDSA P-256 keys: made in milliseconds (RSA 2048 takes seconds on a busy machine); PKCS#8 PEM, which both
# OpenSSL (librdkafka) and the broker's PEM key store read.
CURVE = "P-256"
# A certificate subject is only "CN=<name>": the principal is that name.
PRINCIPAL_RULES = "RULE:^CN=([^,]+)$/$1/,DEFAULT"


class TlsError(Exception):
    """Making the certificates failed."""


@dataclass(frozen=True)
class TlsFiles:
    """The PEM files of one data dir's private CA, broker and clients."""

    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    def cert(self, name: str) -> Path:
        return self.directory / f"{name}.pem"

    def key(self, name: str) -> Path:
        return self.directory / f"{name}.key"

    def keystore(self, name: str) -> Path:
        """Key + certificate + CA in one PEM file: a Java `ssl.keystore.type=PEM` keystore."""
        return self.directory / f"{name}-keystore.pem"


def _openssl(*args: str, cwd: Path) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise TlsError("`openssl` is not on PATH (install the openssl package)")
    proc = subprocess.run([openssl, *args], cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise TlsError(f"openssl {args[0]} failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")


def make_ca(directory: Path, cn: str = "launcher local CA", days: int = CERT_DAYS) -> TlsFiles:
    """A self-signed CA in ``directory`` (ca.pem, ca.key) unless one is there."""
    files = TlsFiles(directory)
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    if files.ca.is_file() and files.ca_key.is_file():
        return files
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", f"ec_paramgen_curve:{CURVE}", "-nodes",
        "-sha256", "-days", str(days),
        "-keyout", files.ca_key.name, "-out", files.ca.name, "-subj", f"/CN={cn}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )  # fmt: skip
    files.ca_key.chmod(0o600)
    return files


def make_leaf(files: TlsFiles, name: str, *, server: bool = False, days: int = CERT_DAYS) -> None:
    """``<name>.pem`` / ``<name>.key`` signed by the CA (CN=<name>), unless there; a server certificate gets
    SAN DNS:localhost and is a client certificate too. Also writes ``<name>-keystore.pem``."""
    cert, key = files.cert(name), files.key(name)
    if not (cert.is_file() and key.is_file()):
        csr = files.directory / f"{name}.csr"
        ext = files.directory / f"{name}.ext"
        usage = "serverAuth,clientAuth" if server else "clientAuth"
        lines = ["basicConstraints=CA:FALSE", "keyUsage=critical,digitalSignature"]
        lines.append(f"extendedKeyUsage={usage}")
        if server:
            lines.append("subjectAltName=DNS:localhost")
        ext.write_text("\n".join(lines) + "\n")
        _openssl(
            "req", "-newkey", "ec", "-pkeyopt", f"ec_paramgen_curve:{CURVE}", "-nodes",
            "-keyout", key.name, "-out", csr.name,
            "-subj", f"/CN={name}",
            cwd=files.directory,
        )  # fmt: skip
        key.chmod(0o600)
        _openssl(
            "x509", "-req", "-in", csr.name, "-CA", files.ca.name, "-CAkey", files.ca_key.name,
            "-set_serial", str(secrets.randbits(63)), "-days", str(days), "-sha256",
            "-extfile", ext.name, "-out", cert.name,
            cwd=files.directory,
        )  # fmt: skip
        csr.unlink()
        ext.unlink()
    keystore = files.keystore(name)
    fd = os.open(keystore, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(key.read_text() + cert.read_text() + files.ca.read_text())


def make_certificates(directory: Path, clients: tuple[str, ...] = DEFAULT_CLIENTS) -> TlsFiles:
    """The CA, the broker certificate and one certificate per client (existing ones are kept)."""
    files = make_ca(directory)
    make_leaf(files, BROKER_CN, server=True)
    for name in dict.fromkeys((ADMIN_CN, *clients)):
        make_leaf(files, name)
    return files


def secure_properties(
    files: TlsFiles,
    *,
    host: str,
    advertised_host: str,
    controller_port: int,
    ssl_port: int,
    sasl_ssl_port: int,
) -> dict[str, str]:
    """Properties that turn the node into a TLS + ACL broker (merged over the plain ones by the launcher).

    The controller listener and the inter-broker listener (SSL) require client certificates: the broker
    authenticates to itself as User:kafka-broker, a super user. Clients: SSL (mTLS, principal = CN) and
    SASL_SSL (server-authenticated TLS, principal = SASL name). The caller adds the listeners themselves.
    """
    pem = {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(files.keystore(BROKER_CN)),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(files.ca),
        # The broker checks the controller's certificate against the host it dials.
        "ssl.endpoint.identification.algorithm": "https",
    }
    return {
        **pem,
        # The quorum is dialled by name: the broker certificate's SAN is DNS:localhost only.
        "controller.quorum.voters": f"1@{advertised_host}:{controller_port}",
        "inter.broker.listener.name": "SSL",
        "listener.name.controller.ssl.client.auth": "required",
        "listener.name.ssl.ssl.client.auth": "required",
        "listener.name.sasl_ssl.ssl.client.auth": "none",
        "ssl.principal.mapping.rules": PRINCIPAL_RULES,
        "authorizer.class.name": AUTHORIZER,
        "super.users": ";".join(SUPER_USERS),
        # No ACL means no access (Kafka's default, stated): only the principals we name get in.
        "allow.everyone.if.no.acl.found": "false",
    }


def admin_client_conf(files: TlsFiles, bootstrap: str) -> dict[str, str]:
    """librdkafka settings of the admin (a super user) over the SSL listener."""
    return {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SSL",
        "ssl.ca.location": str(files.ca),
        "ssl.certificate.location": str(files.cert(ADMIN_CN)),
        "ssl.key.location": str(files.key(ADMIN_CN)),
        "ssl.endpoint.identification.algorithm": "https",
    }
