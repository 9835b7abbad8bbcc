"""Kafka over TLS with ACLs: only the principals we name get in, and a refused one loses nothing.

One secured launcher broker for the module (`up --secure`: SSL with client certificates, SASL_SSL with
SCRAM users, StandardAuthorizer, no ACL = no access). The test's own admin calls, produce and
read_committed reads use the admin certificate (a super user). Workers connect over SASL_SSL with
certificate and host name checks on, holding exactly the ACLs `topics acls` names, minus one:
- without WRITE on the output topic: the worker stops with a line naming the topic and WRITE, nothing is
  committed or visible; after the ACL is granted a restart yields every input exactly once;
- without READ on the input topic: the worker stops with a line naming the topic and READ;
- a client certificate from another CA is refused at the handshake.
The SASL password and key material never appear in logs, `doctor` output or /metrics.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.faults.harness import Collector, WorkerProcess, produce_all, review, tally, worker_env
from tests.kafka_fixtures import DLQ_CONFIG, LAUNCHER, free_port, private_broker
from worker.cli.main import main
from worker.config import WorkerSettings, librdkafka_common
from worker.errors import ConfigurationError
from worker.labelling.control import ControlReader
from worker.model.manifest import model_content_hash
from worker.tools import doctor
from worker.tools.acls import AclRule, apply_acls, operator_acls, worker_acls
from worker.tools.checks import Check
from worker.tools.models import write_desired
from worker.tools.topics import create_topics

sys.path.insert(0, str(LAUNCHER.parent))
import kafka_tls  # noqa: E402  (deploy/kafka/kafka_tls.py: the launcher's certificate maker)

pytestmark = pytest.mark.integration

INPUTS = 40
INVALID = {5, 17, 29}  # not JSON: dead letters


def check_tls(settings: WorkerSettings) -> Check:
    """doctor's TLS check with the kafka and security sections of `settings`."""
    return doctor.check_tls(settings.sections.kafka, settings.sections.security)


def check_broker(settings: WorkerSettings) -> Check:
    """doctor's broker check with the kafka and security sections of `settings`."""
    return doctor.check_broker(settings.sections.kafka, settings.sections.security)


@dataclass(frozen=True)
class SecureBroker:
    ssl: str  # mTLS listener
    sasl_ssl: str
    tls: Any  # kafka_tls.TlsFiles
    passwords: dict[str, str]  # SASL user -> password (random per module)

    def admin_conf(self) -> dict[str, str]:
        return dict(kafka_tls.admin_client_conf(self.tls, self.ssl))


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    data = tmp_path_factory.mktemp("secure-broker")
    passwords = {user: f"pw-{uuid.uuid4().hex}" for user in ("worker", "reader")}
    port, controller, ssl_port, sasl_ssl_port = free_port(), free_port(), free_port(), free_port()
    users = [arg for user, pw in passwords.items() for arg in ("--sasl-user", f"{user}:{pw}")]
    up_args = [
        "--port", str(port), "--controller-port", str(controller), "--secure",
        "--ssl-port", str(ssl_port), "--sasl-ssl-port", str(sasl_ssl_port), *users,
    ]  # fmt: skip
    # ~20 s on an idle machine; generous for a busy one
    with private_broker(data, *up_args, secrets=list(passwords.values()), timeout_s="300"):
        yield SecureBroker(
            f"localhost:{ssl_port}", f"localhost:{sasl_ssl_port}", kafka_tls.TlsFiles(data / "tls"), passwords
        )


@pytest.fixture
def names(secure_broker: SecureBroker) -> dict[str, str]:
    suffix = uuid.uuid4().hex[:8]
    topics = {k: f"tls-{k}-{suffix}" for k in ("reviews", "results", "dlq", "group")}
    conf = secure_broker.admin_conf()
    create_topics(conf, [topics["reviews"]], partitions=2)
    create_topics(conf, [topics["results"], topics["dlq"]], partitions=2, config=DLQ_CONFIG)
    produce_all(secure_broker.ssl, topics["reviews"], inputs(suffix), **_without_bootstrap(conf))
    return topics


def inputs(prefix: str) -> list[tuple[bytes, bytes | None]]:
    return [
        (f"{prefix}-{i:05d}".encode(), b"{not json") if i in INVALID else review(i, prefix)
        for i in range(INPUTS)
    ]


def _without_bootstrap(conf: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in conf.items() if k != "bootstrap.servers"}


def settings_of(names: dict[str, str]) -> WorkerSettings:
    return WorkerSettings(
        input_topic=names["reviews"],
        output_topic=names["results"],
        dlq_topic=names["dlq"],
        group_id=names["group"],
    )


def grant_all_but(admin: dict[str, str], principal: str, names: dict[str, str], missing: AclRule) -> None:
    sections = settings_of(names).sections
    every = worker_acls(sections.kafka, "exactly_once", sections.live)
    rules = [rule for rule in every if rule != missing]
    assert len(rules) == len(every) - 1
    apply_acls(admin, principal, rules)


def sasl_ssl_env(broker: SecureBroker, names: dict[str, str], model: Path, user: str) -> dict[str, str]:
    return worker_env(
        broker.sasl_ssl,
        names,
        model,
        SENTIMENT_SECURITY_PROTOCOL="SASL_SSL",
        SENTIMENT_SSL_CA_LOCATION=str(broker.tls.ca),
        SENTIMENT_SASL_MECHANISM="SCRAM-SHA-512",
        SENTIMENT_SASL_USERNAME=user,
        SENTIMENT_SASL_PASSWORD=broker.passwords[user],
        SENTIMENT_DELIVERY="exactly_once",
        SENTIMENT_LOG_LEVEL="DEBUG",
    )


def committed_offsets(broker: SecureBroker, names: dict[str, str]) -> list[int]:
    consumer = Consumer({**broker.admin_conf(), "group.id": names["group"], "enable.auto.commit": False})
    try:
        parts = [TopicPartition(names["reviews"], p) for p in (0, 1)]
        return [tp.offset for tp in consumer.committed(parts, timeout=10)]
    finally:
        consumer.close()


def _get(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())
    except urllib.error.HTTPError as exc:
        return str(exc.read().decode())


def test_without_write_on_the_output_the_worker_stops_and_after_the_grant_every_input_comes_once(
    secure_broker: SecureBroker, names: dict[str, str], tiny_model_dir: Path, tmp_path: Path
) -> None:
    admin = secure_broker.admin_conf()
    write_output = AclRule("topic", names["results"], "Write", "publish results / dead letters")
    grant_all_but(admin, "User:worker", names, write_output)
    # DESCRIBE only: the worker gets through start-up and is refused when its transaction adds the topic.
    apply_acls(admin, "User:worker", [AclRule("topic", names["results"], "Describe", "metadata")])
    env = sasl_ssl_env(secure_broker, names, tiny_model_dir, "worker")
    collector = Collector(secure_broker.ssl, [names["results"], names["dlq"]], **_without_bootstrap(admin))
    collector.start()
    try:
        refused = WorkerProcess(env, tmp_path, "refused")
        line = refused.refusal_line(timeout_s=300)  # Paddle loads slowly on a busy machine
        assert f"refused User:worker WRITE on topic {names['results']!r}" in line, line
        assert "TOPIC_AUTHORIZATION_FAILED" in line and names["dlq"] not in line, line
        assert committed_offsets(secure_broker, names) == [-1001, -1001]  # nothing committed
        collector.settle(quiet_s=1.0)
        assert collector.count() == 0  # nothing visible to read_committed readers

        apply_acls(admin, "User:worker", [write_output])
        http_port = free_port()
        worker = WorkerProcess({**env, "SENTIMENT_HTTP_PORT": str(http_port)}, tmp_path, "granted")
        try:
            collector.wait_until(lambda: collector.count() >= INPUTS, timeout_s=300, what="every input")
            scraped = [_get(f"http://127.0.0.1:{http_port}{path}") for path in ("/metrics", "/healthz")]
            worker.terminate()
            code = worker.wait(60)
        finally:
            worker.stop()
        collector.settle()
        assert code == 0, worker.stderr_tail()
    finally:
        collector.close()
    figures = tally("tls-grant", [key for key, _ in inputs(names["reviews"].split("-")[-1])],
                    collector.records(names["results"]), collector.records(names["dlq"]))  # fmt: skip
    print(f"\n[tls] after the grant: {figures.line()}")
    assert (figures.results, figures.dead_letters) == (INPUTS - len(INVALID), len(INVALID))
    assert (figures.duplicates, figures.lost) == (0, 0)
    assert "sentiment_" in scraped[0]
    texts = {
        "refused stderr": refused.stderr(),
        "refused stdout": refused.stdout(),
        "stderr": worker.stderr(),
        "stdout": worker.stdout(),
        "/metrics": scraped[0],
        "/healthz": scraped[1],
    }
    for where, text in texts.items():
        assert secure_broker.passwords["worker"] not in text, f"the SASL password leaked into {where}"
        assert "PRIVATE KEY" not in text, f"key material in {where}"


def test_a_principal_without_read_on_the_input_is_refused_with_the_topic_and_read(
    secure_broker: SecureBroker, names: dict[str, str], tiny_model_dir: Path, tmp_path: Path
) -> None:
    admin = secure_broker.admin_conf()
    grant_all_but(
        admin, "User:reader", names, AclRule("topic", names["reviews"], "Read", "consume the input topic")
    )
    worker = WorkerProcess(sasl_ssl_env(secure_broker, names, tiny_model_dir, "reader"), tmp_path, "no-read")
    line = worker.refusal_line(timeout_s=300)
    assert f"refused User:reader READ on topic {names['reviews']!r} (TOPIC_AUTHORIZATION_FAILED)" in line, (
        line
    )
    assert "topics acls --principal User:reader" in line
    assert secure_broker.passwords["reader"] not in worker.stderr() + worker.stdout()
    assert committed_offsets(secure_broker, names) == [-1001, -1001]


def test_mtls_client_of_our_ca_gets_in_and_one_from_another_ca_is_refused_at_the_handshake(
    secure_broker: SecureBroker, names: dict[str, str], tmp_path: Path
) -> None:
    tls = secure_broker.tls
    base: dict[str, Any] = {
        "input_topic": names["reviews"],
        "output_topic": names["results"],
        "dlq_topic": names["dlq"],
        "bootstrap_servers": secure_broker.ssl,
        "security_protocol": "SSL",
        "ssl_ca_location": tls.ca,
    }
    apply_acls(
        secure_broker.admin_conf(),
        "User:worker",
        worker_acls(settings_of(names).sections.kafka, "at_least_once", settings_of(names).sections.live),
    )
    ours = WorkerSettings(
        **base, ssl_certificate_location=tls.cert("worker"), ssl_key_location=tls.key("worker")
    )
    good_tls, good_broker = check_tls(ours), check_broker(ours)
    assert good_tls.verdict == "OK" and "CN=kafka-broker" in good_tls.detail, good_tls.line()
    assert good_broker.verdict == "OK", good_broker.line()

    other = kafka_tls.make_ca(tmp_path / "other-ca", cn="another CA")
    kafka_tls.make_leaf(other, "worker")  # same name, wrong issuer
    foreign = WorkerSettings(
        **base, ssl_certificate_location=other.cert("worker"), ssl_key_location=other.key("worker")
    )
    refused = check_tls(foreign)
    assert refused.verdict == "FAIL" and "the broker refused this client's certificate" in refused.detail
    print(f"\n[tls] foreign client certificate: {refused.line()}")
    admin = AdminClient({**foreign.librdkafka_common(), "log_level": 0})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=5)  # librdkafka is refused too: no metadata, not even the brokers

    unknown_ca = check_tls(WorkerSettings(**{**base, "ssl_ca_location": other.ca}))
    assert unknown_ca.verdict == "FAIL" and unknown_ca.detail.startswith("unknown CA"), unknown_ca.line()
    wrong_host = check_tls(
        WorkerSettings(**{**base, "bootstrap_servers": secure_broker.ssl.replace("localhost", "127.0.0.1")})
    )
    assert wrong_host.verdict == "FAIL" and wrong_host.detail.startswith("wrong host"), wrong_host.line()
    keys = [tls.key("worker").read_text(), other.key("worker").read_text()]
    for check in (good_tls, good_broker, refused, unknown_ca, wrong_host):
        assert "PRIVATE KEY" not in check.line()
        assert not any(line in check.line() for key in keys for line in key.splitlines()[1:-1])


def test_an_operator_writes_the_control_topic_and_a_worker_only_reads_it_and_writes_its_status(
    secure_broker: SecureBroker,
    names: dict[str, str],
    tiny_int8_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    admin = secure_broker.admin_conf()
    group = names["group"]
    control, status = f"{group}.control", f"{group}.status"
    create_topics(admin, [control, status], partitions=1, config={"cleanup.policy": "compact"})
    sections = settings_of(names).sections
    apply_acls(admin, "User:worker", worker_acls(sections.kafka, "at_least_once", sections.live))
    apply_acls(admin, "User:reader", operator_acls(sections.kafka, sections.live))  # the operator
    for name in [k for k in os.environ if k.startswith("SENTIMENT_")]:
        monkeypatch.delenv(name)

    def as_user(user: str) -> WorkerSettings:
        values = {
            "SECURITY_PROTOCOL": "SASL_SSL", "SSL_CA_LOCATION": str(secure_broker.tls.ca),
            "SASL_MECHANISM": "SCRAM-SHA-512", "SASL_USERNAME": user,
            "SASL_PASSWORD": secure_broker.passwords[user], "BOOTSTRAP_SERVERS": secure_broker.sasl_ssl,
            "GROUP_ID": group,
        }  # fmt: skip
        for key, value in values.items():
            monkeypatch.setenv(f"SENTIMENT_{key}", value)
        return WorkerSettings()

    as_user("reader")
    assert main(["models", "shadow", str(tiny_int8_dir)]) == 0, capsys.readouterr().err
    assert main(["models", "status", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert shown["desired"]["shadow"]["content_hash"] == model_content_hash(tiny_int8_dir)

    worker = as_user("worker").sections
    reader = ControlReader(worker)
    try:
        desired = reader.read(timeout_s=30)  # READ on the control topic
    finally:
        reader.close()
    assert desired is not None and desired.shadow is not None
    assert desired.shadow.content_hash == model_content_hash(tiny_int8_dir)
    delivered: list[Any] = []
    producer = Producer(librdkafka_common(worker.kafka, worker.security))
    producer.produce(status, b"{}", b"replica/w", on_delivery=lambda err, _m: delivered.append(err))
    producer.flush(30)
    assert delivered == [None]  # WRITE on the status topic
    with pytest.raises(ConfigurationError, match="TOPIC_AUTHORIZATION_FAILED"):
        write_desired(worker, desired)  # never the control topic
    assert main(["models", "status"]) == 2  # nor read the replicas' status
    assert "not allowed to read topic" in capsys.readouterr().err
