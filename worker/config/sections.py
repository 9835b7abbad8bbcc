"""The settings by section: what each part of the worker takes, instead of the whole settings object.

Each section is a frozen object built once from the parsed settings (`WorkerSettings.sections`). A section
field has the name of its setting (`kafka.input_topic` is `SENTIMENT_INPUT_TOPIC`), so a setting has one
name from the environment to the code; every setting is in exactly one section. A field named
`<setting>_given` says whether the user gave that setting (flag, environment or config file) rather than
leaving its default: the one place where "given or default" is decided.

    kafka          the brokers, topics, group and this member: where reviews come from and results go
    delivery       at-least-once or exactly-once, commits, and the bound on a clean stop
    registry       the value formats, their fields, and the Schema Registry that holds their schemas
    http           the HTTP port: probes, metrics and the API
    batching       batches and Kafka windows, the token budget and its calibration
    model          which model, and how it runs (device, backend, tokenizer, threads, precision)
    security       how the Kafka clients authenticate and encrypt
    observability  logs, liveness, readiness and the confidence metrics
    limits         what one input may be, at every door (Kafka, HTTP, files)
    live           the control and status topics, and the shadow's share and outputs
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import SecretStr

from worker.config.fields import (
    Backend,
    Compatibility,
    Delivery,
    Device,
    DlqSizeCheck,
    InputFormat,
    LogLevel,
    LongText,
    ModelControlMode,
    OutputFormat,
    OutputPartitioning,
    SettingsFields,
    SubjectStrategy,
    Tokenizer,
)

LIBRDKAFKA_LOGGER = "librdkafka"
"""The logger librdkafka's own log lines go to, at their syslog level mapped to Python's (3 ERROR, 4 WARNING,
5-6 INFO, 7 DEBUG), instead of raw `%N|...` lines on stderr."""

GIVEN = "_given"
"""The suffix of a section field that says whether the user gave the setting it names."""


@dataclass(frozen=True, slots=True, kw_only=True)
class KafkaSettings:
    """The brokers, the three topics, the consumer group and this member, and the clients' timeouts."""

    bootstrap_servers: str
    input_topic: str
    output_topic: str
    dlq_topic: str
    dlq_size_check: DlqSizeCheck
    group_id: str
    worker_id: str
    output_partitioning: OutputPartitioning
    kafka_extra: Mapping[str, str | int | float | bool]
    max_poll_interval_ms: int
    session_timeout_ms: int
    fetch_max_bytes: int
    max_partition_fetch_bytes: int
    receive_message_max_bytes: int
    queued_max_messages_kbytes: int
    undecodable_batch_retries: int

    def consumer_fetch_limits(self) -> dict[str, int]:
        """The librdkafka properties that bound what the consumer fetches and decompresses
        (docs/delivery.md); `kafka_extra` may override them."""
        return {
            "fetch.max.bytes": self.fetch_max_bytes,
            "max.partition.fetch.bytes": self.max_partition_fetch_bytes,
            "receive.message.max.bytes": self.receive_message_max_bytes,
            "queued.max.messages.kbytes": self.queued_max_messages_kbytes,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliverySettings:
    """How results and offsets reach the broker (`delivery`: at_least_once or exactly_once), how often
    offsets are committed, and how long a clean stop may take (finish the window, flush, commit, close)."""

    delivery: Delivery
    transaction_timeout_ms: int
    transaction_call_timeout_s: float
    commit_interval_ms: int
    shutdown_timeout_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class RegistrySettings:
    """The input and output value formats, the input fields that hold text and id, and the Schema
    Registry (URL without user info, credentials, CA, deadline, result subject and its compatibility)."""

    input_format: InputFormat
    text_field: str
    id_field: str
    output_format: OutputFormat
    schema_registry_url: str | None
    schema_registry_basic_auth_user_info: SecretStr | None
    schema_registry_ssl_ca_location: Path | None
    schema_subject_strategy: SubjectStrategy
    schema_compatibility: Compatibility
    schema_registry_timeout_s: float

    def schema_registry_conf(self) -> dict[str, Any]:
        """confluent-kafka `SchemaRegistryClient` configuration, including credentials (handle with care).
        No retries inside the client: the worker retries a window itself, and says so on /readyz."""
        if not self.schema_registry_url:
            raise ValueError("no Schema Registry: set SENTIMENT_SCHEMA_REGISTRY_URL")
        conf: dict[str, Any] = {
            "url": self.schema_registry_url,
            "timeout": self.schema_registry_timeout_s,
            "max.retries": 0,
        }
        if self.schema_registry_basic_auth_user_info is not None:
            conf["basic.auth.user.info"] = self.schema_registry_basic_auth_user_info.get_secret_value()
        if self.schema_registry_ssl_ca_location is not None:
            conf["ssl.ca.location"] = str(self.schema_registry_ssl_ca_location)
        return conf


@dataclass(frozen=True, slots=True, kw_only=True)
class HttpSettings:
    """The HTTP port (probes and metrics; the API with `serve` or `http_api`), the API's token, CORS,
    request limits and the connections' bounds."""

    http_host: str
    http_port: int
    http_api: bool
    api_token: SecretStr | None
    http_max_texts: int
    http_max_body_bytes: int
    http_max_queued_texts: int
    http_max_wait_ms: int
    http_request_timeout_s: float
    http_cors_origins: tuple[str, ...]
    http_max_header_bytes: int
    http_header_timeout_s: float
    http_body_timeout_s: float
    http_keep_alive_s: float
    http_max_connections: int


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchingSettings:
    """Inference batches (texts and padded tokens), Kafka windows (messages, wait, how many queued), the
    token budget's calibration (VRAM budget, tuning cache and latency bound), and which of the batch and
    window bounds the user gave: on a GPU the ones not given take the device's shape."""

    max_batch_size: int
    max_batch_tokens: int
    max_window_messages: int
    max_wait_ms: int
    max_queued_windows: int
    max_batch_tokens_auto: bool
    vram_budget_mb: int | None
    vram_budget_fraction: float | None
    vram_safety_margin: float
    tuning_cache_dir: Path | None
    tuning_latency_bound_ms: float
    max_batch_size_given: bool
    max_batch_tokens_given: bool
    max_batch_tokens_auto_given: bool
    max_window_messages_given: bool
    max_wait_ms_given: bool

    @property
    def token_budget_given(self) -> bool:
        """True when the user chose the token budget: max_batch_tokens (a number) or max_batch_tokens_auto."""
        return self.max_batch_tokens_given or self.max_batch_tokens_auto_given


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSettings:
    """Which model (a verified directory, or a hub name when allowed) and how it runs: device, token limit,
    backend, tokenizer, long-text rule, CPU threads, precision (FP16, TensorRT, BF16)."""

    model: str
    device: Device
    max_seq_len: int | None
    backend: Backend
    allow_identity_model: bool
    allow_hub_model: bool
    tokenizer: Tokenizer
    cpu_threads: int | None
    cpu_threads_per_call: int
    use_fp16: bool
    use_tensorrt: bool
    use_bf16: bool
    long_text: LongText
    chunk_stride_tokens: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class SecuritySettings:
    """How the Kafka clients authenticate (SASL) and encrypt (TLS, mTLS), and whether kafka_extra may
    override these."""

    security_protocol: str | None
    sasl_mechanism: str | None
    sasl_username: str | None
    sasl_password: SecretStr | None
    ssl_ca_location: Path | None
    ssl_certificate_location: Path | None
    ssl_key_location: Path | None
    ssl_endpoint_identification: bool
    allow_kafka_extra_overrides: bool

    @property
    def uses_tls(self) -> bool:
        """True when security_protocol is SSL or SASL_SSL."""
        return protocol_uses_tls(self.security_protocol)


@dataclass(frozen=True, slots=True, kw_only=True)
class ObservabilitySettings:
    """The log level, when /healthz and /readyz fail (a stalled loop, a stuck partition), and the
    confidence under which a result counts as low-confidence."""

    low_confidence: float
    liveness_timeout_s: float
    stuck_partition_s: float
    log_level: LogLevel


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitsSettings:
    """What one input may be, at every door (Kafka values, HTTP texts, file rows): characters per text,
    bytes per value, JSON nesting. Past a limit an input is dead-lettered (Kafka) or refused on its own."""

    max_text_chars: int
    max_value_bytes: int
    max_json_depth: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveModelsSettings:
    """Models that change while the stream flows: how a replica learns which to serve (the control topic, or
    `serve`'s admin route), where it reports what it serves (the status topic), and the shadow's share of the
    CPU, its bound and its outputs."""

    model_control: ModelControlMode
    control_topic: str | None
    status_topic: str | None
    status_interval_s: float
    shadow_cpu_share: float
    shadow_max_groups: int
    shadow_topic: str | None
    shadow_sample_topic: str | None
    shadow_samples_per_s: float
    promote_min_agreement: float
    promote_min_shadowed: int

    def control_topic_of(self, group_id: str) -> str:
        """The control topic of consumer group `group_id`: `control_topic`, else `<group_id>.control`."""
        return self.control_topic or f"{group_id}.control"

    def status_topic_of(self, group_id: str) -> str:
        """The status topic of consumer group `group_id`: `status_topic`, else `<group_id>.status`."""
        return self.status_topic or f"{group_id}.status"


@dataclass(frozen=True, slots=True)
class Sections:
    """Every section of one settings object; a part takes the one (or few) it needs."""

    kafka: KafkaSettings
    delivery: DeliverySettings
    registry: RegistrySettings
    http: HttpSettings
    batching: BatchingSettings
    model: ModelSettings
    security: SecuritySettings
    observability: ObservabilitySettings
    limits: LimitsSettings
    live: LiveModelsSettings


def build_sections(settings: SettingsFields) -> Sections:
    """The sections of `settings`, each field copied from the setting of its name (lists and mappings as
    read-only copies), each `<setting>_given` from whether the user gave that setting."""
    return Sections(
        kafka=_section(KafkaSettings, settings),
        delivery=_section(DeliverySettings, settings),
        registry=_section(RegistrySettings, settings),
        http=_section(HttpSettings, settings),
        batching=_section(BatchingSettings, settings),
        model=_section(ModelSettings, settings),
        security=_section(SecuritySettings, settings),
        observability=_section(ObservabilitySettings, settings),
        limits=_section(LimitsSettings, settings),
        live=_section(LiveModelsSettings, settings),
    )


_Section = TypeVar("_Section")


def _section(kind: type[_Section], settings: SettingsFields) -> _Section:
    values: dict[str, Any] = {}
    for field in dataclasses.fields(kind):  # type: ignore[arg-type]
        if field.name.endswith(GIVEN):
            values[field.name] = field.name.removesuffix(GIVEN) in settings.model_fields_set
        else:
            values[field.name] = _read_only(getattr(settings, field.name))
    return kind(**values)


def _read_only(value: object) -> object:
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, dict):
        return ReadOnlyMap(value)
    return value


class ReadOnlyMap(Mapping[str, Any]):
    """A mapping nothing can change (a section's kafka_extra); unlike MappingProxyType it can be copied and
    pickled with the settings that hold it."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, Any]) -> None:
        self._items = dict(items)

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return repr(self._items)


def protocol_uses_tls(security_protocol: str | None) -> bool:
    """True for SSL and SASL_SSL (in any case)."""
    return (security_protocol or "").upper() in ("SSL", "SASL_SSL")


def librdkafka_common(kafka: KafkaSettings, security: SecuritySettings) -> dict[str, Any]:
    """Properties shared by consumer and producer, including credentials (handle with care).

    librdkafka's log lines go to the `librdkafka` Python logger; a client hands them over when it is
    polled (consume, poll, flush), and those still queued when it is destroyed are dropped."""
    conf: dict[str, Any] = {
        "bootstrap.servers": kafka.bootstrap_servers,
        "client.id": kafka.worker_id,
        "logger": logging.getLogger(LIBRDKAFKA_LOGGER),
    }
    if security.security_protocol:
        conf["security.protocol"] = security.security_protocol
    if security.sasl_mechanism:
        conf["sasl.mechanism"] = security.sasl_mechanism
    if security.sasl_username is not None:
        conf["sasl.username"] = security.sasl_username
    if security.sasl_password is not None:
        conf["sasl.password"] = security.sasl_password.get_secret_value()
    if security.uses_tls:
        # librdkafka reads the files itself: no key material passes through this process's memory.
        if security.ssl_ca_location is not None:
            conf["ssl.ca.location"] = str(security.ssl_ca_location)
        if security.ssl_certificate_location is not None and security.ssl_key_location is not None:
            conf["ssl.certificate.location"] = str(security.ssl_certificate_location)
            conf["ssl.key.location"] = str(security.ssl_key_location)
        verify = "https" if security.ssl_endpoint_identification else "none"
        conf["ssl.endpoint.identification.algorithm"] = verify
    conf.update(kafka.kafka_extra)
    return conf
