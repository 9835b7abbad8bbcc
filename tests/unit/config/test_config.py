"""Settings: precedence, validation, secrets."""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from worker.config import LIBRDKAFKA_LOGGER, WorkerSettings, load_settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("SENTIMENT_"):
            monkeypatch.delenv(key)


def test_defaults_match_the_documented_names() -> None:
    s = WorkerSettings()
    assert s.bootstrap_servers == "localhost:9092"
    assert (s.input_topic, s.output_topic, s.dlq_topic) == ("reviews", "reviews-sentiment", "reviews-dlq")
    assert s.model == "models/default-int8" and s.device == "auto"


def test_flags_beat_environment_which_beats_the_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "worker.json"
    config.write_text(
        json.dumps({"input_topic": "from-file", "output_topic": "out-file", "group_id": "g-file"})
    )
    monkeypatch.setenv("SENTIMENT_INPUT_TOPIC", "from-env")
    monkeypatch.setenv("SENTIMENT_GROUP_ID", "g-env")
    s = load_settings(config, group_id="g-flag", output_topic=None)
    assert (s.input_topic, s.output_topic, s.group_id) == ("from-env", "out-file", "g-flag")


def test_toml_config_and_kafka_extra_passthrough(tmp_path: Path) -> None:
    config = tmp_path / "worker.toml"
    config.write_text('security_protocol = "SSL"\n[kafka_extra]\n"socket.keepalive.enable" = true\n')
    conf = load_settings(config).librdkafka_common()
    assert conf["security.protocol"] == "SSL" and conf["socket.keepalive.enable"] is True


def test_unknown_keys_and_bad_values_are_refused_with_their_names(tmp_path: Path) -> None:
    config = tmp_path / "worker.json"
    config.write_text(json.dumps({"max_batch_sise": 8}))
    with pytest.raises(ValueError, match="max_batch_sise"):
        load_settings(config)
    with pytest.raises(ValidationError, match="device"):
        WorkerSettings(device="tpu")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="would loop"):
        WorkerSettings(input_topic="same", output_topic="same")


def test_password_is_masked_everywhere_but_in_the_librdkafka_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SENTIMENT_SASL_PASSWORD", "hunter2-secret")
    s = WorkerSettings(sasl_username="svc")
    assert "hunter2-secret" not in repr(s) and "hunter2-secret" not in json.dumps(s.public_view())
    assert s.librdkafka_common()["sasl.password"] == "hunter2-secret"


def test_tls_files_are_handed_to_librdkafka_with_host_name_checks_on_by_default(tmp_path: Path) -> None:
    ca, cert, key = (tmp_path / name for name in ("ca.pem", "c.pem", "c.key"))
    s = WorkerSettings(
        security_protocol="SSL", ssl_ca_location=ca, ssl_certificate_location=cert, ssl_key_location=key
    )
    conf = s.librdkafka_common()
    assert conf["ssl.ca.location"] == str(ca)
    assert (conf["ssl.certificate.location"], conf["ssl.key.location"]) == (str(cert), str(key))
    assert conf["ssl.endpoint.identification.algorithm"] == "https"
    unchecked = WorkerSettings(security_protocol="SSL", ssl_endpoint_identification=False)
    assert unchecked.librdkafka_common()["ssl.endpoint.identification.algorithm"] == "none"
    assert not [k for k in WorkerSettings().librdkafka_common() if k.startswith("ssl.")]  # PLAINTEXT
    empty = WorkerSettings(security_protocol="SSL", ssl_certificate_location="", ssl_key_location="")
    assert "ssl.certificate.location" not in empty.librdkafka_common()  # empty = unset, not "."


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"ssl_ca_location": "ca.pem"}, "ssl_ca_location is set but security_protocol=None does not use TLS"),
        ({"security_protocol": "SSL", "ssl_certificate_location": "c.pem"}, "go together"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN", "sasl_username": "u",
          "sasl_password": "p", "ssl_key_location": "c.key"}, "go together"),
    ],
)  # fmt: skip
def test_tls_settings_that_cannot_work_are_refused(values: dict[str, str], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        WorkerSettings(**values)  # type: ignore[arg-type]


def test_librdkafka_log_lines_reach_python_logging_at_their_level(caplog: pytest.LogCaptureFixture) -> None:
    from confluent_kafka import Producer

    from worker.bench.worker_process import free_port

    closed = f"127.0.0.1:{free_port()}"  # nothing listens: librdkafka logs `%3|...|FAIL|... refused`
    producer = Producer(WorkerSettings(bootstrap_servers=closed, worker_id="log-test").librdkafka_common())
    deadline = time.monotonic() + 20
    with caplog.at_level(logging.DEBUG, logger=LIBRDKAFKA_LOGGER):
        while time.monotonic() < deadline and not any("refused" in r.getMessage() for r in caplog.records):
            producer.poll(0.1)  # hands the queued log lines to the logger
    refused = [r for r in caplog.records if "refused" in r.getMessage()]
    assert refused, "no librdkafka line reached the `librdkafka` logger"
    assert refused[0].name == LIBRDKAFKA_LOGGER and refused[0].levelno == logging.ERROR  # syslog 3
    assert "FAIL" in refused[0].getMessage() and "log-test" in refused[0].getMessage()


@pytest.mark.parametrize(("name", "value"), [("input_format", "avro"), ("output_format", "protobuf")])
def test_a_registry_format_without_a_registry_url_says_which_variable_to_set(name: str, value: str) -> None:
    with pytest.raises(ValidationError, match=f"{name}={value} needs a Schema Registry.*SCHEMA_REGISTRY_URL"):
        WorkerSettings(**{name: value})  # type: ignore[arg-type]


def test_registry_client_conf_carries_the_credentials_and_ca_and_no_client_retries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SENTIMENT_INPUT_FORMAT", "json_schema")
    monkeypatch.setenv("SENTIMENT_SCHEMA_REGISTRY_URL", "https://registry:8081")
    monkeypatch.setenv("SENTIMENT_SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO", "alice:s3cret")
    monkeypatch.setenv("SENTIMENT_SCHEMA_REGISTRY_SSL_CA_LOCATION", "/etc/ca.pem")
    s = load_settings()
    assert s.schema_registry_conf() == {
        "url": "https://registry:8081",
        "timeout": 5.0,
        "max.retries": 0,
        "basic.auth.user.info": "alice:s3cret",
        "ssl.ca.location": "/etc/ca.pem",
    }
    assert "s3cret" not in json.dumps(s.public_view())


def test_registry_user_info_needs_a_colon_and_blank_means_unset() -> None:
    with pytest.raises(ValidationError, match="user:password"):
        WorkerSettings(schema_registry_basic_auth_user_info="alice")  # type: ignore[arg-type]
    assert (
        WorkerSettings(schema_registry_basic_auth_user_info=" ").schema_registry_basic_auth_user_info is None
    )  # type: ignore[arg-type]


def test_registry_user_info_leaves_the_url_for_the_basic_auth_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SENTIMENT_SCHEMA_REGISTRY_URL", "https://alice:p%40ss%3Aword@registry:8081/api")
    s = load_settings()
    assert s.schema_registry_url == "https://registry:8081/api"
    conf = s.schema_registry_conf()
    assert conf["url"] == "https://registry:8081/api" and conf["basic.auth.user.info"] == "alice:p@ss:word"
    assert "p@ss" not in repr(s) and "p%40ss" not in json.dumps(s.public_view())
    several = WorkerSettings(schema_registry_url="http://bob@r1:8081, http://bob@r2:8081")
    assert several.schema_registry_conf()["url"] == "http://r1:8081,http://r2:8081"
    assert several.schema_registry_conf()["basic.auth.user.info"] == "bob:"  # a user without a password


def test_fetch_limits_reach_the_consumer_and_kafka_extra_may_override_them() -> None:
    settings = WorkerSettings(kafka_extra={"fetch.max.bytes": 2_000_000})
    conf = {**settings.consumer_fetch_limits(), **settings.librdkafka_common()}
    assert conf["fetch.max.bytes"] == 2_000_000
    assert conf["receive.message.max.bytes"] == 64 * 1024 * 1024
    assert conf["max.partition.fetch.bytes"] == 1_048_576
    assert conf["queued.max.messages.kbytes"] == 16_384


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {
                "schema_registry_url": "http://a:secret-1@r:8081",
                "schema_registry_basic_auth_user_info": "b:c",
            },
            "carries user info .*BASIC_AUTH_USER_INFO is set too",
        ),
        ({"schema_registry_url": "http://a:secret-1@r1:1,http://b:secret-1@r2:2"}, "different user info"),
        ({"schema_registry_url": "http://a%3Ab:secret-1@r:8081"}, "user name .* holds a colon"),
    ],
)
def test_registry_user_info_that_cannot_be_moved_is_refused_without_echoing_it(
    values: dict[str, str], message: str
) -> None:
    with pytest.raises(ValidationError, match=message) as refused:
        WorkerSettings(**values)  # type: ignore[arg-type]
    assert "secret-1" not in str(refused.value)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"fetch_max_bytes": 8_000_000, "receive_message_max_bytes": 8_000_000}, "fetch_max_bytes + 512"),
        ({"transaction_call_timeout_s": 60}, "below transaction_timeout_ms"),
    ],
)
def test_limits_that_cannot_work_are_refused(values: dict[str, int], message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        WorkerSettings(**values)
