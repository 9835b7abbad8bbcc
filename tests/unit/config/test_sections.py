"""Settings by section: every setting is in exactly one section under its own name, and a section holds what
the user gave, whichever way it was given (environment, JSON or TOML config file, flags), with the same
precedence; "given or default" is decided here once (`<setting>_given`)."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from worker.cli.common import SETTING_FLAGS, settings_from_args
from worker.cli.main import build_parser
from worker.config import (
    HttpSettings,
    KafkaSettings,
    Sections,
    WorkerSettings,
    librdkafka_common,
    load_settings,
)
from worker.config.sections import GIVEN

# A value for every setting that is not its default, all of them valid together (SASL_SSL with its
# credentials and mTLS files, registry formats with a registry, a guarded kafka_extra key allowed, ...).
# vram_budget_fraction excludes vram_budget_mb: it keeps its default here.
USER_VALUES: dict[str, Any] = {
    "bootstrap_servers": "broker-a:9093,broker-b:9093",
    "input_topic": "in-topic",
    "output_topic": "out-topic",
    "dlq_topic": "dlq-topic",
    "dlq_size_check": "refuse",
    "group_id": "grp",
    "worker_id": "pod-7",
    "input_format": "avro",
    "text_field": "content",
    "id_field": "review_id",
    "output_format": "protobuf",
    "schema_registry_url": "http://registry:8081",
    "schema_registry_basic_auth_user_info": "reg-user:reg-pass",
    "schema_registry_ssl_ca_location": "/etc/registry-ca.pem",
    "schema_subject_strategy": "record",
    "schema_compatibility": "FULL",
    "schema_registry_timeout_s": 2.5,
    "output_partitioning": "key",
    "fetch_max_bytes": 2_000_000,
    "max_partition_fetch_bytes": 500_000,
    "receive_message_max_bytes": 33_554_432,
    "queued_max_messages_kbytes": 8192,
    "undecodable_batch_retries": 5,
    "transaction_call_timeout_s": 15.0,
    "model_control": "topic",
    "control_topic": "ops.control",
    "status_topic": "ops.status",
    "status_interval_s": 3.0,
    "shadow_cpu_share": 0.5,
    "shadow_max_groups": 4,
    "shadow_topic": "shadow-results",
    "shadow_sample_topic": "shadow-samples",
    "shadow_samples_per_s": 2.5,
    "promote_min_agreement": 0.8,
    "promote_min_shadowed": 50,
    "security_protocol": "SASL_SSL",
    "sasl_mechanism": "SCRAM-SHA-512",
    "sasl_username": "alice",
    "sasl_password": "s3cret",
    "ssl_ca_location": "/etc/kafka-ca.pem",
    "ssl_certificate_location": "/etc/client.pem",
    "ssl_key_location": "/etc/client.key",
    "ssl_endpoint_identification": False,
    "kafka_extra": {"socket.keepalive.enable": True, "ssl.cipher.suites": "ECDHE-RSA-AES256-GCM-SHA384"},
    "allow_kafka_extra_overrides": True,
    "delivery": "exactly_once",
    "transaction_timeout_ms": 90000,
    "max_batch_size": 16,
    "max_batch_tokens": 2048,
    "max_window_messages": 64,
    "max_wait_ms": 20,
    "max_queued_windows": 3,
    "max_batch_tokens_auto": True,
    "vram_budget_mb": 1400,
    "vram_safety_margin": 0.2,
    "tuning_cache_dir": "/var/cache/tuning",
    "tuning_latency_bound_ms": 500.0,
    "max_text_chars": 5000,
    "max_value_bytes": 65536,
    "max_json_depth": 8,
    "model": "models/other",
    "device": "cpu",
    "max_seq_len": 256,
    "backend": "onnx",
    "allow_identity_model": True,
    "allow_hub_model": True,
    "tokenizer": "fast",
    "cpu_threads": 3,
    "cpu_threads_per_call": 3,
    "use_fp16": True,
    "use_tensorrt": True,
    "use_bf16": True,
    "long_text": "chunk",
    "chunk_stride_tokens": 64,
    "http_host": "0.0.0.0",
    "http_port": 9200,
    "low_confidence": 0.6,
    "http_api": True,
    "api_token": "tok-123",
    "http_max_texts": 100,
    "http_max_body_bytes": 500000,
    "http_max_queued_texts": 1000,
    "http_max_wait_ms": 5,
    "http_request_timeout_s": 10.0,
    "http_cors_origins": ["https://reviews.example.com"],
    "http_max_header_bytes": 8192,
    "http_header_timeout_s": 5.0,
    "http_body_timeout_s": 20.0,
    "http_keep_alive_s": 2.0,
    "http_max_connections": 100,
    "shutdown_timeout_s": 15.0,
    "commit_interval_ms": 500,
    "max_poll_interval_ms": 200000,
    "session_timeout_ms": 20000,
    "liveness_timeout_s": 30.0,
    "stuck_partition_s": 60.0,
    "log_level": "DEBUG",
}
NOT_GIVEN = {"vram_budget_fraction"}


def section_fields(sections: Sections) -> dict[str, tuple[str, Any]]:
    """Every section field but the `_given` ones: name → (its section, its value)."""
    found: dict[str, tuple[str, Any]] = {}
    for section in dataclasses.fields(sections):
        for field in dataclasses.fields(getattr(sections, section.name)):
            if not field.name.endswith(GIVEN):
                assert field.name not in found, (
                    f"{field.name} is in {found[field.name][0]} and {section.name}"
                )
                found[field.name] = (section.name, getattr(getattr(sections, section.name), field.name))
    return found


def plain(value: Any) -> Any:
    """A value as the user wrote it: secrets revealed, paths as text, read-only lists and maps as such."""
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, Mapping):
        return dict(value)
    return value


def env_text(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)


def toml_text(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {toml_text(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(toml_text(v) for v in value) + "]"
    if isinstance(value, str):
        return json.dumps(value)
    return str(value)


def from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> WorkerSettings:
    for name, value in USER_VALUES.items():
        monkeypatch.setenv(f"SENTIMENT_{name.upper()}", env_text(value))
    return load_settings()


def from_json_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> WorkerSettings:
    config = tmp_path / "worker.json"
    config.write_text(json.dumps(USER_VALUES), encoding="utf-8")
    return load_settings(config)


def from_toml_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> WorkerSettings:
    config = tmp_path / "worker.TOML"
    config.write_text("".join(f"{k} = {toml_text(v)}\n" for k, v in USER_VALUES.items()), encoding="utf-8")
    return load_settings(config)


def from_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> WorkerSettings:
    return load_settings(None, **USER_VALUES)  # how the CLI's flags reach the settings


@pytest.mark.parametrize("build", [from_environment, from_json_file, from_toml_file, from_flags])
def test_every_section_field_is_the_value_the_user_gave(
    build: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = build(tmp_path, monkeypatch)
    fields = section_fields(settings.sections)
    assert set(fields) == set(WorkerSettings.model_fields)  # each setting in exactly one section
    for name, (section, value) in fields.items():
        assert plain(value) == plain(getattr(settings, name)), (section, name)
        if name not in NOT_GIVEN:
            assert plain(value) == USER_VALUES[name], (section, name)
    batching = settings.sections.batching
    assert batching.max_batch_size_given and batching.max_batch_tokens_given
    assert batching.max_window_messages_given and batching.max_wait_ms_given
    assert batching.max_batch_tokens_auto_given and batching.token_budget_given


def test_the_test_gives_every_setting_a_value_of_its_own() -> None:
    # A new setting needs a value in USER_VALUES (and a section): this test then checks it too.
    assert set(USER_VALUES) | NOT_GIVEN == set(WorkerSettings.model_fields)
    defaults = WorkerSettings()
    assert all(plain(getattr(defaults, k)) != v for k, v in USER_VALUES.items()), (
        "a value equal to its default"
    )


def test_section_fields_are_named_after_settings_and_given_flags_after_batching_settings() -> None:
    sections = WorkerSettings().sections
    for section in dataclasses.fields(sections):
        for field in dataclasses.fields(getattr(sections, section.name)):
            name = field.name.removesuffix(GIVEN)
            assert name in WorkerSettings.model_fields, f"{section.name}.{field.name} names no setting"
    given = [
        f.name for s in dataclasses.fields(sections) for f in dataclasses.fields(getattr(sections, s.name))
    ]
    assert [name for name in given if name.endswith(GIVEN)] == [
        "max_batch_size_given",
        "max_batch_tokens_given",
        "max_batch_tokens_auto_given",
        "max_window_messages_given",
        "max_wait_ms_given",
    ]


def test_flags_beat_environment_which_beats_the_config_file_in_every_section(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "worker.json"
    config.write_text(
        json.dumps({"input_topic": "in-file", "max_batch_size": 8, "http_port": 9300, "device": "gpu"}),
        encoding="utf-8",
    )
    monkeypatch.setenv("SENTIMENT_MAX_BATCH_SIZE", "12")
    monkeypatch.setenv("SENTIMENT_DEVICE", "cpu")
    monkeypatch.setenv("SENTIMENT_CONFIG_FILE", str(config))
    args = build_parser().parse_args(["run", "--device", "auto", "--group-id", "g-flag"])
    s = settings_from_args(args).sections
    assert (s.kafka.input_topic, s.kafka.group_id) == ("in-file", "g-flag")
    assert (s.batching.max_batch_size, s.batching.max_batch_size_given) == (12, True)
    assert (s.http.http_port, s.model.device) == (9300, "auto")
    assert not s.batching.max_window_messages_given  # neither file, environment nor flag gave it


def test_every_settings_flag_lands_in_its_section(tmp_path: Path) -> None:
    flags = {name: USER_VALUES[name] for name in SETTING_FLAGS}
    flags["input_format"] = "text"  # json | text on the command line; the registry formats need a URL
    argv = ["run"] + [
        item for name, value in flags.items() for item in (f"--{name.replace('_', '-')}", str(value))
    ]
    fields = section_fields(settings_from_args(build_parser().parse_args(argv)).sections)
    assert {name: plain(fields[name][1]) for name in flags} == flags


def test_auto_token_budget_is_given_as_auto_not_as_a_number(monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = WorkerSettings().sections.batching
    assert not (defaults.max_batch_size_given or defaults.token_budget_given or defaults.max_wait_ms_given)
    monkeypatch.setenv("SENTIMENT_MAX_BATCH_TOKENS", "auto")
    batching = load_settings().sections.batching
    assert (batching.max_batch_tokens, batching.max_batch_tokens_auto) == (4096, True)
    assert not batching.max_batch_tokens_given and batching.max_batch_tokens_auto_given
    assert batching.token_budget_given


def test_a_copy_rebuilds_its_sections_and_counts_its_update_as_given() -> None:
    settings = WorkerSettings(worker_id="w", http_port=9108)
    copy = settings.model_copy(update={"worker_id": "w-1", "max_batch_size": 4, "http_port": 9109})
    assert (copy.sections.kafka.worker_id, copy.sections.http.http_port) == ("w-1", 9109)
    assert (copy.sections.batching.max_batch_size, copy.sections.batching.max_batch_size_given) == (4, True)
    assert (settings.sections.kafka.worker_id, settings.sections.batching.max_batch_size_given) == (
        "w",
        False,
    )
    assert librdkafka_common(copy.sections.kafka, copy.sections.security)["client.id"] == "w-1"


def test_sections_are_frozen_read_only_and_keep_secrets_masked() -> None:
    settings = load_settings(
        None,
        kafka_extra={"socket.keepalive.enable": True},
        http_cors_origins=["https://a.example"],
        api_token="tok-123",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_username="u",
        sasl_password="pw-456",
    )
    s = settings.sections
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.kafka.input_topic = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        s.kafka.kafka_extra["socket.keepalive.enable"] = False  # type: ignore[index]
    assert isinstance(s.http.http_cors_origins, tuple)
    assert settings.kafka_extra == {"socket.keepalive.enable": True}  # the flat value is its own copy
    shown = repr(s)
    assert "tok-123" not in shown and "pw-456" not in shown
    assert librdkafka_common(s.kafka, s.security)["sasl.password"] == "pw-456"
    assert isinstance(s.kafka, KafkaSettings) and isinstance(s.http, HttpSettings)


def test_the_root_methods_are_their_sections(tmp_path: Path) -> None:
    settings = load_settings(
        None,
        schema_registry_url="http://registry:8081",
        schema_registry_basic_auth_user_info="u:p",
        security_protocol="SSL",
        ssl_ca_location=str(tmp_path / "ca.pem"),
    )
    s = settings.sections
    assert settings.librdkafka_common() == librdkafka_common(s.kafka, s.security)
    assert settings.schema_registry_conf() == s.registry.schema_registry_conf()
    assert settings.uses_tls and s.security.uses_tls


def test_settings_with_their_sections_copy_and_pickle() -> None:
    settings = WorkerSettings(
        kafka_extra={"socket.keepalive.enable": True}, http_cors_origins=["https://a.b"]
    )
    for copied in (
        settings.model_copy(deep=True),
        copy.deepcopy(settings),
        pickle.loads(pickle.dumps(settings)),
    ):
        assert copied == settings and copied.sections == settings.sections
        assert dict(copied.sections.kafka.kafka_extra) == {"socket.keepalive.enable": True}
