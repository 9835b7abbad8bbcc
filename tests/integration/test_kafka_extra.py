"""SENTIMENT_KAFKA_EXTRA cannot change the connection's security, address or transactional id silently
(issue 50, finding 7), against the real broker: refused unless allowed; allowed, the clients connect as
librdkafka is told, start-up names each key, and `doctor` checks what the clients get."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from typing import Any

import pytest

from tests.worker_commands import run_command
from worker.config import WorkerSettings
from worker.tools.doctor import kafka_checks

pytestmark = pytest.mark.integration

NOWHERE = "localhost:1"  # nothing listens there
SASL_SSL = {
    "SENTIMENT_SECURITY_PROTOCOL": "SASL_SSL",
    "SENTIMENT_SASL_MECHANISM": "SCRAM-SHA-512",
    "SENTIMENT_SASL_USERNAME": "worker",
    "SENTIMENT_SASL_PASSWORD": "worker-secret",
}


def _topics_list(topic: str, **env: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SENTIMENT_BOOTSTRAP_SERVERS": NOWHERE, **env}
    return run_command("topics", "list", "--topic", topic, env=env)


def test_plaintext_to_another_broker_next_to_sasl_settings_is_refused_unless_allowed_and_then_named(
    kafka_bootstrap: str, unique_name: Callable[[str], str], create_topics: Any
) -> None:
    """Before: `topics list` (any command) connected in plaintext to the other broker without a word."""
    topic = unique_name("extra")
    create_topics(topic, partitions=1)
    extra = json.dumps({"security.protocol": "PLAINTEXT", "bootstrap.servers": kafka_bootstrap})
    refused = _topics_list(topic, **SASL_SSL, SENTIMENT_KAFKA_EXTRA=extra)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    [line] = refused.stderr.strip().splitlines()
    assert "SENTIMENT_KAFKA_EXTRA sets security.protocol, bootstrap.servers" in line
    assert "security.protocol: set SENTIMENT_SECURITY_PROTOCOL" in line
    assert "bootstrap.servers: set SENTIMENT_BOOTSTRAP_SERVERS" in line
    assert refused.stdout == ""  # nothing was asked of any broker

    allowed = _topics_list(
        topic, **SASL_SSL, SENTIMENT_KAFKA_EXTRA=extra, SENTIMENT_ALLOW_KAFKA_EXTRA_OVERRIDES="true"
    )
    assert allowed.returncode == 0, allowed.stderr
    assert allowed.stdout.split() == [topic]  # the override's broker answered
    warnings = [line for line in allowed.stderr.splitlines() if "SENTIMENT_KAFKA_EXTRA overrides" in line]
    assert len(warnings) == 1 and "overrides security.protocol, bootstrap.servers" in warnings[0]
    assert kafka_bootstrap not in warnings[0] and "worker-secret" not in allowed.stderr


def test_doctor_checks_the_broker_and_protocol_the_clients_get(kafka_bootstrap: str) -> None:
    """Before: doctor shook hands with the configured SASL_SSL address (and stopped there) while the
    clients went in plaintext to the override's broker."""
    settings = WorkerSettings(
        bootstrap_servers=NOWHERE,
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="worker",
        sasl_password="worker-secret",  # type: ignore[arg-type]
        kafka_extra={"security.protocol": "PLAINTEXT", "bootstrap.servers": kafka_bootstrap},
        allow_kafka_extra_overrides=True,
    )
    checks = kafka_checks(settings.sections.kafka, settings.sections.security)
    by_name = {check.name: check for check in checks}
    assert checks[0].name == "kafka_extra" and checks[0].verdict == "WARN"
    assert "overrides security.protocol, bootstrap.servers" in checks[0].detail
    assert "tls" not in by_name  # the clients do not use TLS: nothing to shake hands with
    assert by_name["broker"].verdict == "OK", by_name["broker"]
    assert by_name["broker"].detail.startswith(f"{kafka_bootstrap} answered")
    assert not any("worker-secret" in check.line() for check in checks)
