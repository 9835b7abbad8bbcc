#!/usr/bin/env python3
"""Start, stop and inspect a single-node Apache Kafka 4.1.1 broker (KRaft, broker+controller), no Docker.

    python deploy/kafka/launcher.py up [--port 9092] [--controller-port N] [--data-dir DIR] ...
    python deploy/kafka/launcher.py up --sasl-port 9094 --sasl-user alice:alice-secret   # + SASL_PLAINTEXT
    python deploy/kafka/launcher.py up --secure --sasl-user worker:secret   # + SSL, SASL_SSL and ACLs
    python deploy/kafka/launcher.py status [--port 9092]
    python deploy/kafka/launcher.py down [--port 9092]

The broker jars come from Maven Central (deploy/kafka/pom.xml, copied once into a cache directory outside
the repo), or from a Kafka distribution when KAFKA_HOME is set. Stdlib + confluent_kafka only; importable,
so tests can call the small functions below directly.
"""

from __future__ import annotations

import argparse
import base64
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

# kafka_tls.py sits beside this file and launch_common.py above it; this file is run as a script or loaded by
# path (tests), not as a package.
for _folder in (Path(__file__).resolve().parent, Path(__file__).resolve().parent.parent):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))
import kafka_tls  # noqa: E402
import launch_common  # noqa: E402
from launch_common import (  # noqa: E402
    LauncherError,
    Say,
    cache_dir_of,
    fetch_into_place,
    marker_matches,
    port_in_use,
    print_started,
    print_status,
    report_failure,
    running_pid,
    start_detached,
    stop_process,
    wait_answering,
    wait_or_clean_up,
)

KAFKA_VERSION = "4.1.1"
HERE = Path(__file__).resolve().parent
POM = HERE / "pom.xml"
REPO_ROOT = HERE.parent.parent
DEFAULT_HEAP_OPTS = ("-Xmx512m", "-Xms256m")
# Broker JVM flags (a subset of kafka-run-class.sh's KAFKA_JVM_PERFORMANCE_OPTS).
JVM_OPTS = (
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-Djava.awt.headless=true",
    "-Dlog4j2.shutdownHookEnabled=false",
)
# Mechanisms of the optional SASL_PLAINTEXT listener; every --sasl-user gets both.
SASL_MECHANISMS = ("SCRAM-SHA-512", "PLAIN")
SASL_LISTENER = "SASL_PLAINTEXT"
SECURE_SASL_LISTENER = "SASL_SSL"
# Characters a SASL user name / password may not contain: they would break the storage tool's
# `--add-scram 'SCRAM-SHA-512=[name=...,password=...]'` syntax or the JAAS `user_<name>="<password>"` entry.
_SASL_FORBIDDEN = set(" \t\n\r\"\\,;=[]'")


@dataclass(frozen=True)
class SaslUser:
    """A SASL user of the SASL_PLAINTEXT listener: a SCRAM-SHA-512 credential and a PLAIN JAAS entry."""

    name: str
    password: str

    def __repr__(self) -> str:  # never print the password
        return f"SaslUser(name={self.name!r}, password='**********')"

    @classmethod
    def parse(cls, spec: str) -> SaslUser:
        """``name:password`` → SaslUser; raises ValueError on an empty part or a forbidden character."""
        name, sep, password = spec.partition(":")
        if not sep or not name or not password:
            raise ValueError("expected NAME:PASSWORD with both parts non-empty")
        bad = sorted((set(name) | set(password)) & _SASL_FORBIDDEN)
        if bad:
            raise ValueError(f"SASL user names and passwords may not contain {''.join(bad)!r}")
        return cls(name, password)


@dataclass(frozen=True)
class BrokerConfig:
    """Where and how one local broker runs. Ports are TCP ports on ``host``."""

    port: int
    controller_port: int
    data_dir: Path
    pid_file: Path
    log_file: Path
    host: str = "127.0.0.1"
    advertised_host: str = "localhost"
    heap_opts: tuple[str, ...] = DEFAULT_HEAP_OPTS
    # Optional SASL_PLAINTEXT listener (SCRAM-SHA-512 and PLAIN) next to the PLAINTEXT one.
    sasl_port: int | None = None
    sasl_users: tuple[SaslUser, ...] = ()
    # --secure: SSL (mTLS) and SASL_SSL listeners, TLS between controller and broker, StandardAuthorizer.
    ssl_port: int | None = None
    sasl_ssl_port: int | None = None
    tls_clients: tuple[str, ...] = kafka_tls.DEFAULT_CLIENTS

    @property
    def secure(self) -> bool:
        return self.ssl_port is not None

    @property
    def tls(self) -> kafka_tls.TlsFiles:
        """Where the certificates of a secure broker live: ``<data-dir>/tls``."""
        return kafka_tls.TlsFiles(self.data_dir / "tls")

    @property
    def ssl_bootstrap(self) -> str | None:
        return None if self.ssl_port is None else f"{self.advertised_host}:{self.ssl_port}"

    @property
    def sasl_ssl_bootstrap(self) -> str | None:
        return None if self.sasl_ssl_port is None else f"{self.advertised_host}:{self.sasl_ssl_port}"

    @property
    def bootstrap(self) -> str:
        """The bootstrap address clients use, ``host:port``."""
        return f"{self.advertised_host}:{self.port}"

    @property
    def sasl_bootstrap(self) -> str | None:
        """The SASL_PLAINTEXT listener's bootstrap address, when there is one."""
        return None if self.sasl_port is None else f"{self.advertised_host}:{self.sasl_port}"

    @property
    def properties_file(self) -> Path:
        return self.data_dir / "server.properties"

    @property
    def log4j_file(self) -> Path:
        return self.data_dir / "log4j2.properties"

    @property
    def log_dirs(self) -> Path:
        """Kafka's partition data and KRaft metadata log (``log.dirs``)."""
        return self.data_dir / "kraft-logs"


@dataclass(frozen=True)
class MavenJars:
    """Run the broker from jars copied by Maven into ``libs``."""

    libs: Path


@dataclass(frozen=True)
class KafkaHome:
    """Run the broker with a Kafka distribution's own scripts (``KAFKA_HOME``)."""

    home: Path


Runtime = MavenJars | KafkaHome


def make_config(
    port: int = 9092,
    controller_port: int | None = None,
    data_dir: Path | None = None,
    pid_file: Path | None = None,
    log_file: Path | None = None,
    sasl_port: int | None = None,
    sasl_users: Sequence[SaslUser] = (),
    *,
    secure: bool = False,
    ssl_port: int | None = None,
    sasl_ssl_port: int | None = None,
    tls_clients: Sequence[str] = kafka_tls.DEFAULT_CLIENTS,
) -> BrokerConfig:
    """Fill in the defaults: controller on ``port + 1``, data in ``<repo>/var/kafka-<port>``; with
    ``secure``, SSL on ``port + 3`` and SASL_SSL on ``port + 4``."""
    if sasl_users and sasl_port is None and not secure:
        raise LauncherError("SASL users need a SASL listener", "add --sasl-port N or --secure")
    if not secure and (ssl_port is not None or sasl_ssl_port is not None):
        raise LauncherError("TLS listeners need --secure", "add --secure")
    data = (data_dir or REPO_ROOT / "var" / f"kafka-{port}").resolve()
    return BrokerConfig(
        port=port,
        controller_port=controller_port if controller_port is not None else port + 1,
        data_dir=data,
        pid_file=(pid_file or data / "broker.pid").resolve(),
        log_file=(log_file or data / "broker.log").resolve(),
        sasl_port=sasl_port,
        sasl_users=tuple(sasl_users),
        ssl_port=(ssl_port if ssl_port is not None else port + 3) if secure else None,
        sasl_ssl_port=(sasl_ssl_port if sasl_ssl_port is not None else port + 4) if secure else None,
        tls_clients=tuple(tls_clients),
    )


def default_cache_dir(env: Mapping[str, str]) -> Path:
    """``$SENTIMENT_KAFKA_CACHE`` or ``~/.cache/sentiment-worker/kafka-4.1.1``."""
    return cache_dir_of(env, "SENTIMENT_KAFKA_CACHE", f"kafka-{KAFKA_VERSION}")


# --------------------------------------------------------------------------- jars


def pom_digest(pom: Path = POM) -> str:
    """The marker content: a copy made from another pom is not reused."""
    return launch_common.pom_digest(pom)


def jars_ready(cache_dir: Path, pom: Path = POM) -> bool:
    """True when ``cache_dir/libs`` holds a complete copy of this pom's dependencies."""
    return marker_matches(cache_dir, pom) and (cache_dir / "libs").is_dir()


def maven_command(pom: Path, output_dir: Path) -> list[str]:
    return launch_common.maven_command(
        pom,
        "dependency:copy-dependencies",
        f"outputDirectory={output_dir}",
        missing_hint="install Maven, or set KAFKA_HOME to a Kafka distribution",
    )


def ensure_jars(cache_dir: Path, pom: Path = POM, say: Say = print, progress_every_s: float = 15.0) -> Path:
    """Copy the broker jars into ``cache_dir/libs`` with Maven unless a complete copy is there; return it
    (see `launch_common.fetch_into_place`)."""
    libs = cache_dir / "libs"
    if jars_ready(cache_dir, pom):
        return libs
    say(f"Fetching Kafka {KAFKA_VERSION} jars with Maven into {libs} (a minute or so the first time)...")
    started = time.monotonic()
    fetch_into_place(
        cache_dir,
        "libs",
        pom,
        lambda scratch: maven_command(pom, scratch),
        complete=lambda scratch: any(scratch.glob("kafka_2.13-*.jar")),
        failure=lambda rc, log_tail, log: LauncherError(
            f"Maven failed (exit {rc}) copying the Kafka jars:\n{log_tail}",
            f"check Maven Central access (full log: {log}), or set KAFKA_HOME to a Kafka distribution",
        ),
        say=say,
        progress_every_s=progress_every_s,
    )
    say(f"Kafka jars ready ({len(list(libs.glob('*.jar')))} jars, {time.monotonic() - started:.0f} s)")
    return libs


# --------------------------------------------------------------------------- config files


def render_properties(cfg: BrokerConfig) -> str:
    """server.properties of a single combined broker+controller node with a static KRaft quorum."""
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        # A static voter set: storage is formatted without --standalone and the quorum never changes.
        "controller.quorum.voters": f"1@{cfg.host}:{cfg.controller_port}",
        "controller.listener.names": "CONTROLLER",
        **listener_properties(cfg),
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(cfg.log_dirs),
        "num.partitions": "1",
        # Topics are created explicitly (tests, deploy scripts): a typo must fail, not create a topic.
        "auto.create.topics.enable": "false",
        # One broker: internal topics cannot have more than one replica.
        "offsets.topic.replication.factor": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        # ... and need few partitions: 1 instead of 50 makes the first group join / transaction fast.
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.num.partitions": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        # Consumers join a group without the default 3 s wait for more members.
        "group.initial.rebalance.delay.ms": "0",
        "num.network.threads": "2",
        "num.io.threads": "4",
        "log.retention.hours": "24",
    }
    if cfg.sasl_port is not None or cfg.sasl_ssl_port is not None:
        props.update(sasl_properties(cfg))
    if cfg.secure:
        assert cfg.ssl_port is not None and cfg.sasl_ssl_port is not None
        props.update(
            kafka_tls.secure_properties(
                cfg.tls,
                host=cfg.host,
                advertised_host=cfg.advertised_host,
                controller_port=cfg.controller_port,
                ssl_port=cfg.ssl_port,
                sasl_ssl_port=cfg.sasl_ssl_port,
            )
        )
    lines = ["# Written by deploy/kafka/launcher.py; rewritten on every `up`."]
    lines += [f"{key}={value}" for key, value in props.items()]
    return "\n".join(lines) + "\n"


def listener_properties(cfg: BrokerConfig) -> dict[str, str]:
    """listeners / advertised.listeners / the protocol map: PLAINTEXT and CONTROLLER always, SASL_PLAINTEXT
    with ``--sasl-port``, SSL and SASL_SSL with ``--secure`` (the controller then speaks SSL too)."""
    controller_protocol = "SSL" if cfg.secure else "PLAINTEXT"
    client = [("PLAINTEXT", cfg.port), (SASL_LISTENER, cfg.sasl_port)]
    client += [("SSL", cfg.ssl_port), (SECURE_SASL_LISTENER, cfg.sasl_ssl_port)]
    present = [(name, port) for name, port in client if port is not None]
    listeners = [f"{name}://{cfg.host}:{port}" for name, port in present]
    listeners.insert(1, f"CONTROLLER://{cfg.host}:{cfg.controller_port}")
    protocols = [f"{name}:{name}" for name, _ in present]
    protocols.insert(1, f"CONTROLLER:{controller_protocol}")
    return {
        "listeners": ",".join(listeners),
        "advertised.listeners": ",".join(f"{n}://{cfg.advertised_host}:{p}" for n, p in present),
        "listener.security.protocol.map": ",".join(protocols),
    }


def sasl_properties(cfg: BrokerConfig) -> dict[str, str]:
    """SCRAM-SHA-512 and PLAIN on the SASL_PLAINTEXT listener (``--sasl-port``) and, with ``--secure``, on
    the SASL_SSL one.

    SCRAM credentials live in the cluster metadata (created at format time, or upserted later); PLAIN users
    are JAAS entries in this file.
    """
    plain_users = " ".join(f'user_{u.name}="{u.password}"' for u in cfg.sasl_users)
    props = {"sasl.enabled.mechanisms": ",".join(SASL_MECHANISMS)}
    for listener, port in ((SASL_LISTENER, cfg.sasl_port), (SECURE_SASL_LISTENER, cfg.sasl_ssl_port)):
        if port is None:
            continue
        prefix = f"listener.name.{listener.lower()}"
        props[f"{prefix}.sasl.enabled.mechanisms"] = ",".join(SASL_MECHANISMS)
        props[f"{prefix}.scram-sha-512.sasl.jaas.config"] = (
            "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        )
        props[f"{prefix}.plain.sasl.jaas.config"] = (
            "org.apache.kafka.common.security.plain.PlainLoginModule required"
            + (f" {plain_users}" if plain_users else "")
            + ";"
        )
    return props


def render_log4j2(cfg: BrokerConfig) -> str:
    """log4j2 config: INFO to stdout (redirected to the log file), the chattiest loggers at WARN."""
    quiet = {
        "state": "state.change.logger",
        "request": "kafka.request.logger",
        "requestchannel": "kafka.network.RequestChannel$",
        "config": "org.apache.kafka.common.config.AbstractConfig",
        "appinfo": "org.apache.kafka.common.utils.AppInfoParser",
        "raftclient": "org.apache.kafka.raft",
        "metaloader": "org.apache.kafka.image.loader",
        "snapshot": "org.apache.kafka.metadata.publisher",
    }
    lines = [
        "# Written by deploy/kafka/launcher.py",
        "status = warn",
        "appender.out.type = Console",
        "appender.out.name = STDOUT",
        "appender.out.layout.type = PatternLayout",
        "appender.out.layout.pattern = [%d] %p %m (%c)%n",
        "rootLogger.level = INFO",
        "rootLogger.appenderRef.out.ref = STDOUT",
    ]
    for key, name in quiet.items():
        lines += [f"logger.{key}.name = {name}", f"logger.{key}.level = WARN"]
    return "\n".join(lines) + "\n"


def write_properties(cfg: BrokerConfig) -> Path:
    """Write server.properties and the log4j2 config into the data dir; return the properties path."""
    cfg.data_dir.mkdir(parents=True, exist_ok=True)
    # Owner-only: with SASL users the file holds their PLAIN passwords.
    fd = os.open(cfg.properties_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(render_properties(cfg))
    cfg.properties_file.chmod(0o600)
    cfg.log4j_file.write_text(render_log4j2(cfg))
    return cfg.properties_file


# --------------------------------------------------------------------------- commands


def new_cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding (like Uuid.randomUuid)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):  # Kafka avoids these too: they look like CLI flags
            return cid


def java_command(cfg: BrokerConfig, libs: Path, main_class: str, args: Sequence[str]) -> list[str]:
    java = shutil.which("java")
    if java is None:
        raise LauncherError(
            "`java` is not on PATH", "install a JRE 17+ (Kafka 4 needs Java 17 for the broker)"
        )
    return [
        java,
        *cfg.heap_opts,
        *JVM_OPTS,
        f"-Dlog4j2.configurationFile={cfg.log4j_file}",
        f"-Dkafka.logs.dir={cfg.data_dir / 'logs'}",
        "-cp",
        f"{libs}{os.sep}*",
        main_class,
        *args,
    ]


def format_command(cfg: BrokerConfig, runtime: Runtime, cluster_id: str) -> list[str]:
    """The storage format command (static quorum: no --standalone).

    Each SASL user gets a SCRAM-SHA-512 credential in the initial metadata (``--add-scram``).
    """
    args = ["format", "-t", cluster_id, "-c", str(cfg.properties_file)]
    for user in cfg.sasl_users:
        args += ["--add-scram", f"SCRAM-SHA-512=[name={user.name},password={user.password}]"]
    if isinstance(runtime, KafkaHome):
        return [str(runtime.home / "bin" / "kafka-storage.sh"), *args]
    return java_command(cfg, runtime.libs, "kafka.tools.StorageTool", args)


def start_command(cfg: BrokerConfig, runtime: Runtime) -> list[str]:
    """The broker command; it runs in the foreground (the launcher detaches it)."""
    if isinstance(runtime, KafkaHome):
        # kafka-server-start.sh execs kafka-run-class.sh, which execs java: the pid stays the broker's.
        return [str(runtime.home / "bin" / "kafka-server-start.sh"), str(cfg.properties_file)]
    return java_command(cfg, runtime.libs, "kafka.Kafka", [str(cfg.properties_file)])


def command_env(cfg: BrokerConfig, runtime: Runtime, base: dict[str, str]) -> dict[str, str]:
    """Environment for the scripts of a Kafka distribution (heap, log4j2 config, script log dir)."""
    env = dict(base)
    if isinstance(runtime, KafkaHome):
        env["KAFKA_HEAP_OPTS"] = " ".join(cfg.heap_opts)
        env["KAFKA_LOG4J_OPTS"] = f"-Dlog4j2.configurationFile={cfg.log4j_file}"
        env["LOG_DIR"] = str(cfg.data_dir / "logs")
    return env


# --------------------------------------------------------------------------- lifecycle


def is_formatted(cfg: BrokerConfig) -> bool:
    return (cfg.log_dirs / "meta.properties").is_file()


def format_storage(cfg: BrokerConfig, runtime: Runtime, say: Say = print) -> bool:
    """Format the KRaft storage unless already formatted; True when it formatted now."""
    if is_formatted(cfg):
        return False
    cluster_id = new_cluster_id()
    say(f"Formatting KRaft storage in {cfg.log_dirs} (cluster id {cluster_id})")
    proc = subprocess.run(
        format_command(cfg, runtime, cluster_id),
        capture_output=True,
        text=True,
        env=command_env(cfg, runtime, dict(os.environ)),
        stdin=subprocess.DEVNULL,
    )
    if proc.returncode != 0:
        output = redact(proc.stdout + proc.stderr, cfg)
        raise LauncherError(
            f"formatting the storage failed (exit {proc.returncode}):\n{output}",
            f"remove {cfg.log_dirs} if it holds a broken earlier attempt",
        )
    return True


def redact(text: str, cfg: BrokerConfig) -> str:
    """``text`` with every SASL password replaced by asterisks."""
    for user in cfg.sasl_users:
        text = text.replace(user.password, "**********")
    return text


def upsert_scram_users(cfg: BrokerConfig, timeout_s: float = 30.0) -> None:
    """Create or replace the SCRAM-SHA-512 credentials of ``cfg.sasl_users`` through the PLAINTEXT listener.

    Storage formatted earlier (a data dir reused) got its credentials then or never: this makes ``up
    --sasl-user`` hold for it too.
    """
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    admin = AdminClient({**admin_conf(cfg), "log_level": 0})
    upserts: list[Any] = [
        UserScramCredentialUpsertion(
            u.name, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), u.password.encode()
        )
        for u in cfg.sasl_users
    ]
    for name, future in admin.alter_user_scram_credentials(upserts).items():
        try:
            future.result(timeout=timeout_s)
        except Exception as exc:  # noqa: BLE001 - reported with the user name, never the password
            raise LauncherError(
                f"creating the SCRAM credential of {name!r} failed: {redact(str(exc), cfg)}",
                f"see {cfg.log_file}",
            ) from None


def admin_conf(cfg: BrokerConfig) -> dict[str, str]:
    """librdkafka settings of an administrator: PLAINTEXT, or on a secure broker the admin certificate
    over the SSL listener (PLAINTEXT's anonymous principal may do nothing there)."""
    if cfg.ssl_bootstrap is not None:
        return kafka_tls.admin_client_conf(cfg.tls, cfg.ssl_bootstrap)
    return {"bootstrap.servers": cfg.bootstrap}


def ensure_ports_free(cfg: BrokerConfig) -> None:
    """Fail when something already listens on the client or controller port."""
    for port in (cfg.port, cfg.controller_port, cfg.sasl_port, cfg.ssl_port, cfg.sasl_ssl_port):
        if port is not None and port_in_use(cfg.host, port):
            raise LauncherError(
                f"port {cfg.host}:{port} is already in use",
                "stop whatever listens there or pick other ports: --port/--controller-port, or with make "
                f"`make demo KAFKA_PORT={cfg.port + 100}` (also kafka-up, kafka-down, kafka-status)",
            )


def start(cfg: BrokerConfig, runtime: Runtime) -> int:
    """Start the broker detached (own session, stdout+stderr appended to the log file); return its pid."""
    return start_detached(
        start_command(cfg, runtime),
        log_file=cfg.log_file,
        pid_file=cfg.pid_file,
        env=command_env(cfg, runtime, dict(os.environ)),
        cwd=cfg.data_dir,
        what="broker",
    )


def broker_answers(bootstrap: str, timeout_s: float) -> bool:
    """True when a broker at ``bootstrap`` answers a metadata request within ``timeout_s`` seconds."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    # log_level 0: librdkafka would otherwise print "Connection refused" lines while the broker starts.
    admin = AdminClient(
        {"bootstrap.servers": bootstrap, "log_level": 0, "socket.connection.setup.timeout.ms": 2000}
    )
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except KafkaException:
        return False
    return len(metadata.brokers) > 0


def wait_ready(cfg: BrokerConfig, pid: int, timeout_s: float) -> float:
    """Wait until the broker answers metadata requests; return the seconds waited.

    Fails fast when the process exits meanwhile.
    """
    answers = partial(broker_answers, cfg.bootstrap)
    address = (cfg.host, cfg.port)
    return wait_answering("broker", pid, address, answers, cfg.bootstrap, cfg.log_file, timeout_s)


def is_kafka_broker(argv: Sequence[str]) -> bool:
    """True for a ``java ... kafka.Kafka <props>`` command line."""
    return bool(argv) and Path(argv[0]).name == "java" and "kafka.Kafka" in argv[1:]


def stop(pid_file: Path, timeout_s: float = 30.0, say: Say = print) -> bool:
    """Stop the broker named by ``pid_file``: SIGTERM (a controlled shutdown: the broker flushes its logs and
    leaves the quorum), then SIGKILL after ``timeout_s`` seconds. Only a ``java ... kafka.Kafka`` process is
    signalled (see `launch_common.stop_process`)."""
    return stop_process(pid_file, is_kafka_broker, "broker", timeout_s=timeout_s, say=say)


def running_broker(cfg: BrokerConfig) -> int | None:
    """The pid of the live Kafka broker named by the pid file, if any."""
    return running_pid(cfg.pid_file, is_kafka_broker)


def up(cfg: BrokerConfig, runtime_factory: Callable[[], Runtime], timeout_s: float, say: Say = print) -> str:
    """Start the broker unless the one named by the pid file already answers; return the bootstrap address."""
    pid = running_broker(cfg)
    formatted_now = False
    if pid is not None:
        if broker_answers(cfg.bootstrap, 5.0):
            say(f"Broker already running (pid {pid}); nothing to do (`down` first to change its listeners).")
            return cfg.bootstrap
        say(f"Broker pid {pid} is running but not answering yet; waiting.")
    else:
        cfg.pid_file.unlink(missing_ok=True)
        ensure_ports_free(cfg)
        runtime = runtime_factory()
        if cfg.secure:
            try:
                kafka_tls.make_certificates(cfg.tls.directory, cfg.tls_clients)
            except kafka_tls.TlsError as exc:
                raise LauncherError(
                    str(exc), f"remove {cfg.tls.directory} to make new certificates"
                ) from None
        write_properties(cfg)
        formatted_now = format_storage(cfg, runtime, say)
        pid = start(cfg, runtime)
        say(f"Started broker pid {pid}; waiting for it to answer at {cfg.bootstrap} (log: {cfg.log_file})")
    waited = wait_or_clean_up(
        pid,
        cfg.pid_file,
        lambda: wait_ready(cfg, pid, timeout_s),
        lambda: stop(cfg.pid_file, timeout_s=10.0, say=say),
    )
    say(f"Broker ready after {waited:.1f} s.")
    if cfg.sasl_users and not formatted_now:
        upsert_scram_users(cfg)  # storage from an earlier `up`: its credentials may be missing or stale
    if cfg.sasl_bootstrap is not None:
        users = ", ".join(u.name for u in cfg.sasl_users) or "none"
        say(f"SASL_PLAINTEXT ({'/'.join(SASL_MECHANISMS)}) at {cfg.sasl_bootstrap}; users: {users}")
    if cfg.secure:
        users = ", ".join(u.name for u in cfg.sasl_users) or "none"
        tls = cfg.tls
        say(
            f"SSL (client certificates) at {cfg.ssl_bootstrap}; "
            f"SASL_SSL at {cfg.sasl_ssl_bootstrap}; users: {users}"
        )
        say(f"  CA: {tls.ca}; client certificates: {', '.join(str(tls.cert(n)) for n in cfg.tls_clients)}")
        say(f"  StandardAuthorizer: super users {', '.join(kafka_tls.SUPER_USERS)}; no ACL means no access")
    return cfg.bootstrap


# --------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="launcher.py", description=(__doc__ or "").split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (
        ("up", "start the broker (no-op when running)"),
        ("down", "stop the broker"),
        ("status", "running or not, and the address"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--port", type=int, default=9092, help="client (PLAINTEXT) port, default 9092")
        p.add_argument(
            "--controller-port", type=int, default=None, help="KRaft controller port, default port+1"
        )
        p.add_argument("--data-dir", type=Path, default=None, help="default <repo>/var/kafka-<port>")
        p.add_argument("--pid-file", type=Path, default=None, help="default <data-dir>/broker.pid")
        if name == "up":
            p.add_argument(
                "--sasl-port",
                type=int,
                default=None,
                help="also listen with SASL_PLAINTEXT (SCRAM-SHA-512 and PLAIN) on this port",
            )
            p.add_argument(
                "--sasl-user",
                dest="sasl_users",
                metavar="NAME:PASSWORD",
                action="append",
                default=[],
                help="a SASL user (SCRAM-SHA-512 credential + PLAIN entry); repeatable; needs --sasl-port "
                "or --secure",
            )
            p.add_argument(
                "--secure",
                action="store_true",
                help="TLS + ACLs: SSL (client certificates) and SASL_SSL listeners, certificates in "
                "<data-dir>/tls, StandardAuthorizer (super users: kafka-broker, admin)",
            )
            p.add_argument("--ssl-port", type=int, default=None, help="--secure: SSL port, default port+3")
            p.add_argument(
                "--sasl-ssl-port", type=int, default=None, help="--secure: SASL_SSL port, default port+4"
            )
            p.add_argument(
                "--tls-client",
                dest="tls_clients",
                metavar="NAME",
                action="append",
                default=None,
                help="--secure: a client certificate CN=NAME (principal User:NAME); repeatable; "
                f"default {' and '.join(kafka_tls.DEFAULT_CLIENTS)}",
            )
            p.add_argument("--log-file", type=Path, default=None, help="default <data-dir>/broker.log")
            p.add_argument("--timeout-s", type=float, default=90.0, help="seconds to wait for the broker")
            p.add_argument(
                "--cache-dir",
                type=Path,
                default=None,
                help="jar cache, default $SENTIMENT_KAFKA_CACHE or ~/.cache/sentiment-worker/kafka-4.1.1",
            )
        if name == "down":
            p.add_argument(
                "--timeout-s", type=float, default=30.0, help="seconds between SIGTERM and SIGKILL"
            )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        users = [SaslUser.parse(spec) for spec in getattr(args, "sasl_users", [])]
    except ValueError as exc:
        parser.error(f"--sasl-user: {exc}")
    say: Say = lambda msg: print(msg, flush=True)  # noqa: E731
    try:
        cfg = make_config(
            args.port,
            args.controller_port,
            args.data_dir,
            args.pid_file,
            getattr(args, "log_file", None),
            getattr(args, "sasl_port", None),
            users,
            secure=getattr(args, "secure", False),
            ssl_port=getattr(args, "ssl_port", None),
            sasl_ssl_port=getattr(args, "sasl_ssl_port", None),
            tls_clients=tuple(getattr(args, "tls_clients", None) or kafka_tls.DEFAULT_CLIENTS),
        )
        if args.command == "up":
            kafka_home = os.environ.get("KAFKA_HOME")
            cache_dir = args.cache_dir.resolve() if args.cache_dir else default_cache_dir(os.environ)

            def runtime_factory() -> Runtime:
                if kafka_home:
                    return KafkaHome(Path(kafka_home))
                return MavenJars(ensure_jars(cache_dir, say=say))

            return print_started(lambda: up(cfg, runtime_factory, args.timeout_s, say), cfg.log_file)
        if args.command == "down":
            return 0 if stop(cfg.pid_file, args.timeout_s, say) else 1
        return print_status(
            running_broker(cfg), cfg.bootstrap, cfg.pid_file, lambda: broker_answers(cfg.bootstrap, 5.0)
        )
    except LauncherError as exc:
        return report_failure(exc)


if __name__ == "__main__":
    sys.exit(main())
