"""deploy/kafka/launcher.py without a broker: config files, commands, pid-file safety."""

from __future__ import annotations

import base64
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.kafka_fixtures import load_launcher


@pytest.fixture(scope="module")
def launcher() -> ModuleType:
    return load_launcher()


@pytest.fixture
def cfg(launcher: ModuleType, tmp_path: Path) -> Any:
    return launcher.make_config(port=19092, data_dir=tmp_path / "data")


def parse_properties(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return {key: value for key, value in pairs}


def test_defaults_put_controller_on_next_port_and_files_in_data_dir(
    launcher: ModuleType, tmp_path: Path
) -> None:
    cfg = launcher.make_config(port=29092, data_dir=tmp_path)
    assert cfg.controller_port == 29093
    assert cfg.pid_file == tmp_path / "broker.pid"
    assert cfg.log_file == tmp_path / "broker.log"
    assert cfg.bootstrap == "localhost:29092"
    assert launcher.make_config(port=9092).data_dir == launcher.REPO_ROOT / "var" / "kafka-9092"


def test_properties_describe_a_single_combined_kraft_node(launcher: ModuleType, cfg: Any) -> None:
    props = parse_properties(launcher.render_properties(cfg))
    assert props["process.roles"] == "broker,controller"
    assert props["node.id"] == "1"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["advertised.listeners"] == "PLAINTEXT://localhost:19092"
    assert props["controller.listener.names"] == "CONTROLLER"
    assert props["auto.create.topics.enable"] == "false"
    assert props["log.dirs"] == str(cfg.data_dir / "kraft-logs")
    for key in (
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
        "num.partitions",
    ):
        assert props[key] == "1", key
    assert props["group.initial.rebalance.delay.ms"] == "0"


def test_cluster_id_is_a_kafka_uuid(launcher: ModuleType) -> None:
    ids = {launcher.new_cluster_id() for _ in range(200)}
    assert len(ids) == 200
    for cid in ids:
        assert len(cid) == 22 and not cid.startswith("-")
        assert len(base64.urlsafe_b64decode(cid + "==")) == 16


def test_kafka_home_uses_the_distribution_scripts(launcher: ModuleType, cfg: Any) -> None:
    runtime = launcher.KafkaHome(Path("/opt/kafka"))
    props = str(cfg.properties_file)
    assert launcher.format_command(cfg, runtime, "AAAAAAAAAAAAAAAAAAAAAA") == [
        "/opt/kafka/bin/kafka-storage.sh",
        "format",
        "-t",
        "AAAAAAAAAAAAAAAAAAAAAA",
        "-c",
        props,
    ]
    assert launcher.start_command(cfg, runtime) == ["/opt/kafka/bin/kafka-server-start.sh", props]
    env = launcher.command_env(cfg, runtime, {"PATH": "/usr/bin"})
    assert env["PATH"] == "/usr/bin"
    assert env["KAFKA_HEAP_OPTS"] == "-Xmx512m -Xms256m"
    assert env["KAFKA_LOG4J_OPTS"] == f"-Dlog4j2.configurationFile={cfg.log4j_file}"


def test_maven_jars_run_the_broker_and_storage_tool_classes(launcher: ModuleType, cfg: Any) -> None:
    runtime = launcher.MavenJars(Path("/cache/libs"))
    props = str(cfg.properties_file)
    start = launcher.start_command(cfg, runtime)
    assert Path(start[0]).name == "java"
    assert start[-4:] == ["-cp", "/cache/libs/*", "kafka.Kafka", props]
    assert "-Xmx512m" in start and "-Xms256m" in start
    fmt = launcher.format_command(cfg, runtime, "AAAAAAAAAAAAAAAAAAAAAA")
    assert fmt[-8:] == [
        "-cp",
        "/cache/libs/*",
        "kafka.tools.StorageTool",
        "format",
        "-t",
        "AAAAAAAAAAAAAAAAAAAAAA",
        "-c",
        props,
    ]
    assert launcher.is_kafka_broker(start)
    assert not launcher.is_kafka_broker(fmt)
    assert launcher.command_env(cfg, runtime, {"A": "1"}) == {"A": "1"}


def test_jar_cache_is_reused_only_with_a_marker_for_this_pom(launcher: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "libs").mkdir()
    assert not launcher.jars_ready(tmp_path)
    (tmp_path / ".complete").write_text("not-this-pom\n")
    assert not launcher.jars_ready(tmp_path)
    (tmp_path / ".complete").write_text(launcher.pom_digest() + "\n")
    assert launcher.jars_ready(tmp_path)


def test_down_without_pid_file_is_a_no_op(launcher: ModuleType, tmp_path: Path) -> None:
    said: list[str] = []
    assert launcher.stop(tmp_path / "missing.pid", say=said.append) is True
    assert said == [f"No pid file at {tmp_path / 'missing.pid'}: no broker to stop."]


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def test_down_never_signals_a_process_that_is_not_a_broker(
    launcher: ModuleType, tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    pid_file = tmp_path / "broker.pid"
    pid_file.write_text(f"{sleeper.pid}\n")
    assert launcher.stop(pid_file, timeout_s=1.0, say=lambda _msg: None) is False
    assert sleeper.poll() is None  # still running
    assert not pid_file.exists()  # the pid file was stale: it named someone else's process


def test_down_removes_the_pid_file_of_a_dead_broker(launcher: ModuleType, tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    pid_file = tmp_path / "broker.pid"
    pid_file.write_text(f"{proc.pid}\n")
    assert launcher.stop(pid_file, say=lambda _msg: None) is True
    assert not pid_file.exists()


# --------------------------------------------------------------------------- SASL listener


@pytest.fixture
def sasl_cfg(launcher: ModuleType, tmp_path: Path) -> Any:
    users = [launcher.SaslUser.parse("alice:alice-s3cret"), launcher.SaslUser.parse("bob:pw:with:colons")]
    return launcher.make_config(port=19092, data_dir=tmp_path / "data", sasl_port=19094, sasl_users=users)


def test_sasl_listener_adds_scram_and_plain_next_to_plaintext(launcher: ModuleType, sasl_cfg: Any) -> None:
    props = parse_properties(launcher.render_properties(sasl_cfg))
    assert props["listeners"] == (
        "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093,SASL_PLAINTEXT://127.0.0.1:19094"
    )
    assert props["advertised.listeners"] == "PLAINTEXT://localhost:19092,SASL_PLAINTEXT://localhost:19094"
    assert props["listener.security.protocol.map"] == (
        "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT"
    )
    assert props["inter.broker.listener.name"] == "PLAINTEXT"  # brokers never need the users
    assert props["listener.name.sasl_plaintext.sasl.enabled.mechanisms"] == "SCRAM-SHA-512,PLAIN"
    assert props["listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config"] == (
        "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    )
    assert props["listener.name.sasl_plaintext.plain.sasl.jaas.config"] == (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        'user_alice="alice-s3cret" user_bob="pw:with:colons";'
    )
    assert sasl_cfg.sasl_bootstrap == "localhost:19094"


def test_without_sasl_port_there_is_no_sasl_listener(launcher: ModuleType, cfg: Any) -> None:
    props = parse_properties(launcher.render_properties(cfg))
    assert not [key for key in props if "sasl" in key]
    assert "SASL" not in props["listeners"] + props["listener.security.protocol.map"]
    assert cfg.sasl_bootstrap is None


def test_sasl_users_get_scram_credentials_at_format_time(launcher: ModuleType, sasl_cfg: Any) -> None:
    fmt = launcher.format_command(sasl_cfg, launcher.KafkaHome(Path("/opt/kafka")), "AAAAAAAAAAAAAAAAAAAAAA")
    scram = [fmt[i + 1] for i, arg in enumerate(fmt) if arg == "--add-scram"]
    assert scram == [
        "SCRAM-SHA-512=[name=alice,password=alice-s3cret]",
        "SCRAM-SHA-512=[name=bob,password=pw:with:colons]",
    ]


def test_properties_file_is_private_because_it_holds_plain_passwords(
    launcher: ModuleType, sasl_cfg: Any
) -> None:
    path = launcher.write_properties(sasl_cfg)
    assert path.stat().st_mode & 0o077 == 0
    assert 'user_alice="alice-s3cret"' in path.read_text()


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("alice", "NAME:PASSWORD"),
        (":pw", "NAME:PASSWORD"),
        ("alice:", "NAME:PASSWORD"),
        ("alice:a,b", "','"),
        ('alice:a"b', "'\"'"),
        ("al ice:pw", "' '"),
        ("alice:a]b", "']'"),
    ],
)
def test_sasl_user_specs_that_would_break_the_tool_syntax_are_refused(
    launcher: ModuleType, spec: str, problem: str
) -> None:
    with pytest.raises(ValueError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        launcher.SaslUser.parse(spec)


def test_sasl_user_repr_and_redaction_hide_the_password(launcher: ModuleType, sasl_cfg: Any) -> None:
    user = sasl_cfg.sasl_users[0]
    assert "alice-s3cret" not in repr(user) and "alice-s3cret" not in repr(sasl_cfg)
    assert launcher.redact("bad value alice-s3cret for alice", sasl_cfg) == "bad value ********** for alice"


def test_sasl_users_without_a_sasl_port_are_refused(launcher: ModuleType, capsys: Any) -> None:
    assert launcher.main(["up", "--port", "19092", "--sasl-user", "alice:pw"]) == 1
    err = capsys.readouterr().err
    assert "SASL users need a SASL listener" in err and "--sasl-port" in err


# --------------------------------------------------------------------------- --secure: TLS + ACLs


def test_secure_adds_ssl_and_sasl_ssl_listeners_mtls_between_brokers_and_the_standard_authorizer(
    launcher: ModuleType, tmp_path: Path
) -> None:
    users = [launcher.SaslUser.parse("worker:w-s3cret")]
    cfg = launcher.make_config(port=19092, data_dir=tmp_path / "data", sasl_users=users, secure=True)
    props = parse_properties(launcher.render_properties(cfg))
    assert props["listeners"] == (
        "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093,SSL://127.0.0.1:19095,SASL_SSL://127.0.0.1:19096"
    )
    assert props["advertised.listeners"] == (
        "PLAINTEXT://localhost:19092,SSL://localhost:19095,SASL_SSL://localhost:19096"
    )
    assert (
        props["listener.security.protocol.map"]
        == "PLAINTEXT:PLAINTEXT,CONTROLLER:SSL,SSL:SSL,SASL_SSL:SASL_SSL"
    )
    assert props["inter.broker.listener.name"] == "SSL"
    assert props["controller.quorum.voters"] == "1@localhost:19093"  # the certificate names localhost only
    assert props["listener.name.controller.ssl.client.auth"] == "required"
    assert props["listener.name.ssl.ssl.client.auth"] == "required"
    assert props["listener.name.sasl_ssl.ssl.client.auth"] == "none"
    assert props["authorizer.class.name"] == "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    assert props["super.users"] == "User:kafka-broker;User:admin"
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert props["ssl.keystore.location"] == str(cfg.data_dir / "tls" / "kafka-broker-keystore.pem")
    assert props["listener.name.sasl_ssl.plain.sasl.jaas.config"].endswith('user_worker="w-s3cret";')
    assert (cfg.ssl_bootstrap, cfg.sasl_ssl_bootstrap) == ("localhost:19095", "localhost:19096")
    admin = launcher.admin_conf(cfg)
    assert (admin["bootstrap.servers"], admin["security.protocol"]) == ("localhost:19095", "SSL")
    assert admin["ssl.certificate.location"].endswith("tls/admin.pem")


def test_tls_ports_need_secure(launcher: ModuleType, tmp_path: Path) -> None:
    with pytest.raises(launcher.LauncherError, match="--secure"):
        launcher.make_config(port=19092, data_dir=tmp_path, ssl_port=19095)


def test_certificates_chain_to_the_ca_the_broker_names_localhost_and_keys_are_private(
    launcher: ModuleType, tmp_path: Path
) -> None:
    files = launcher.kafka_tls.make_certificates(tmp_path / "tls", ("admin", "worker"))
    for name in ("kafka-broker", "admin", "worker"):
        verify = subprocess.run(
            ["openssl", "verify", "-CAfile", str(files.ca), str(files.cert(name))],
            capture_output=True,
            text=True,
        )
        assert verify.returncode == 0, verify.stderr
        assert files.key(name).stat().st_mode & 0o077 == 0
        assert files.keystore(name).stat().st_mode & 0o077 == 0
    text = subprocess.run(
        ["openssl", "x509", "-in", str(files.cert("kafka-broker")), "-noout", "-text"],
        capture_output=True,
        text=True,
    ).stdout
    assert "DNS:localhost" in text and "IP Address" not in text
    assert "Subject: CN = worker" in subprocess.run(
        ["openssl", "x509", "-in", str(files.cert("worker")), "-noout", "-subject"],
        capture_output=True,
        text=True,
    ).stdout.replace("subject=", "Subject: ")
    before = files.cert("worker").read_bytes()
    launcher.kafka_tls.make_certificates(tmp_path / "tls", ("admin", "worker"))
    assert files.cert("worker").read_bytes() == before  # made once, reused by the next `up`
