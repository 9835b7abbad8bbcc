"""The one settings object of the worker.

Read once at the entry point (`load_settings`) and passed down; no other module reads the environment.
Every setting is an environment variable `SENTIMENT_<NAME>` and a key of the optional config file
(`SENTIMENT_CONFIG_FILE` or `--config`; JSON, or TOML when the name ends in `.toml`, in any case).
"""

from __future__ import annotations

import difflib
import json
import logging
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal
from urllib.parse import unquote, urlsplit, urlunsplit

import tomllib
from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, SettingsError

DEFAULT_MODEL_DIR = "models/default-int8"
LIBRDKAFKA_LOGGER = "librdkafka"
"""The logger librdkafka's own log lines go to, at their syslog level mapped to Python's (3 ERROR, 4 WARNING,
5-6 INFO, 7 DEBUG), instead of raw `%N|...` lines on stderr."""
"""What `make model` derives from the shipped models/default: ONNX Runtime INT8, the fastest CPU form."""


ENV_PREFIX = "SENTIMENT_"

JSON_EXAMPLES = {
    "http_cors_origins": '["https://reviews.example.com"]',
    "kafka_extra": '{"socket.keepalive.enable": true}',
}
"""The settings whose environment variable holds JSON (a list or an object), with an example each."""

OTHER_ENVIRONMENT = frozenset(
    {
        "SENTIMENT_CONFIG_FILE",
        "SENTIMENT_BASE_MODEL_CACHE",
        "SENTIMENT_KAFKA_CACHE",
        "SENTIMENT_REGISTRY_CACHE",
    }
)
"""SENTIMENT_* variables that are not settings but are read on purpose: the config file's name (by the
command line), the cache directories of the base-model fetch and of the Kafka and registry launchers."""


REGISTRY_FORMATS = frozenset({"avro", "json_schema", "protobuf"})
"""Input and output formats in the Schema Registry wire format (magic byte 0, 4-byte big-endian schema id)."""

DEFAULT_LOW_CONFIDENCE = 0.7
"""See `WorkerSettings.low_confidence` (it is here so worker/metrics.py shares the default)."""


class WorkerSettings(BaseSettings):
    """Everything the worker can be told. Units are in the names."""

    # hide_input_in_errors: a validation error must never echo a password it was given.
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, frozen=True, extra="forbid", hide_input_in_errors=True
    )
    _config_file_values: ClassVar[dict[str, Any]] = {}  # set by load_settings on a subclass

    # --- Kafka ---
    bootstrap_servers: str = Field("localhost:9092", description="Kafka bootstrap servers, comma-separated.")
    input_topic: str = Field("reviews", description="Topic the reviews are read from.")
    output_topic: str = Field("reviews-sentiment", description="Topic the results are published to.")
    dlq_topic: str = Field("reviews-dlq", description="Dead-letter topic for inputs that cannot be labelled.")
    dlq_size_check: bool = Field(
        True,
        description="run: refuse to start (exit 2) when the dead-letter topic's max.message.bytes "
        "cannot hold the input topic's largest record plus the dead-letter headers (`topics create` makes "
        "topics that can); false: start anyway, and such a dead letter goes without key and value (its "
        "source topic, partition and offset in headers).",
    )
    group_id: str = Field("sentiment-worker", description="Consumer group; replicas share it.")
    worker_id: str = Field(
        default_factory=socket.gethostname, description="Identifies this replica in dead letters and logs."
    )
    input_format: Literal["json", "text", "avro", "json_schema", "protobuf"] = Field(
        "json",
        description='json: {"text": ..., "id": ...}; text: the whole value is the review; avro, json_schema, '
        "protobuf: the Schema Registry wire format (magic byte 0, 4-byte schema id), decoded with the "
        "schema the registry (schema_registry_url) holds under that id.",
    )
    text_field: str = Field(
        "text",
        min_length=1,
        description="input_format json, avro, json_schema, protobuf: the field that holds the review text.",
    )
    id_field: str = Field(
        "id",
        min_length=1,
        description="input_format json, avro, json_schema, protobuf: the field that holds the review id "
        "(optional in each message; without it the id is topic/partition/offset).",
    )
    output_format: Literal["json", "avro", "json_schema", "protobuf"] = Field(
        "json",
        description="json: UTF-8 JSON results (schemas/json/sentiment-result.v1.schema.json); avro, "
        "json_schema, protobuf: the registry wire format, the result schema (schemas/avro, schemas/json, "
        "schemas/protobuf) registered at start-up under the subject schema_subject_strategy names. Dead "
        "letters keep the input's bytes whatever the format.",
    )
    schema_registry_url: str | None = Field(
        None,
        description="Schema Registry (Confluent API) base URL, e.g. http://localhost:8081; needed by the "
        "avro, json_schema and protobuf formats. Apicurio Registry: its /apis/ccompat/v7 URL. User info in "
        "it (http://user:password@host) is taken out at start-up into "
        "schema_registry_basic_auth_user_info: the URL shown anywhere is the one without it.",
    )
    schema_registry_basic_auth_user_info: SecretStr | None = Field(
        None,
        description="Schema Registry HTTP basic auth as `user:password` (never logged); or user info in "
        "schema_registry_url, not both.",
    )
    schema_registry_ssl_ca_location: Path | None = Field(
        None,
        description="https registry: PEM file of the CA that signed the registry's certificate; default: "
        "the system's CA store.",
    )
    schema_subject_strategy: Literal["topic", "record", "topic_record"] = Field(
        "topic",
        description="Subject the result schema is registered under: topic `<output_topic>-value`, record "
        "the record's full name `sentiment.SentimentResult`, topic_record `<output_topic>-<record name>`.",
    )
    schema_compatibility: Literal[
        "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE", "NONE"
    ] = Field(
        "BACKWARD",
        description="Compatibility level set on the result subject at start-up: BACKWARD lets a new "
        "result schema add optional fields, and readers of the old one still read.",
    )
    schema_registry_timeout_s: float = Field(
        5.0,
        gt=0,
        description="Longest one registry answer may take, the whole answer (not each read); an unanswered "
        "one makes the worker wait and retry the window (not ready meanwhile), never dead-letter it.",
    )
    output_partitioning: Literal["source", "key"] = Field(
        "source",
        description="source: a result goes to the output partition numbered like its input partition "
        "(modulo the output partition count), which keeps per-partition order end to end; "
        "key: librdkafka's partitioner on the input key.",
    )
    security_protocol: str | None = Field(None, description="librdkafka security.protocol, e.g. SASL_SSL.")
    sasl_mechanism: str | None = Field(None, description="librdkafka sasl.mechanism, e.g. SCRAM-SHA-512.")
    sasl_username: str | None = Field(None, description="SASL user name.")
    sasl_password: SecretStr | None = Field(None, description="SASL password (never logged).")
    ssl_ca_location: Path | None = Field(
        None,
        description="SSL/SASL_SSL: PEM file of the CA that signed the broker's certificate (librdkafka "
        "ssl.ca.location); default: the system's CA store.",
    )
    ssl_certificate_location: Path | None = Field(
        None, description="SSL (mTLS): PEM file of this client's certificate; needs ssl_key_location."
    )
    ssl_key_location: Path | None = Field(
        None, description="SSL (mTLS): PEM file of this client's private key (unencrypted; mode 0600)."
    )
    ssl_endpoint_identification: bool = Field(
        True,
        description="SSL/SASL_SSL: check that the broker's certificate names the host dialled (librdkafka "
        "ssl.endpoint.identification.algorithm=https); turn off only for a certificate without its name.",
    )
    kafka_extra: dict[str, str | int | float | bool] = Field(
        default_factory=dict,
        description="Extra librdkafka properties for consumer and producer, e.g. socket.keepalive.enable. "
        "Keys that change the connection's security (security.*, ssl.*, sasl.*, "
        "enable.ssl.certificate.verification, ...), the bootstrap address or the transactional id are "
        "refused (use their settings) unless allow_kafka_extra_overrides.",
    )
    allow_kafka_extra_overrides: bool = Field(
        False,
        description="Let kafka_extra set the keys it refuses otherwise (security, bootstrap address, "
        "transactional id): start-up names each in a WARNING (never its value) and `doctor` checks the "
        "configuration librdkafka then gets.",
    )
    fetch_max_bytes: int = Field(
        1_048_576,
        ge=1_000_000,
        description="librdkafka fetch.max.bytes: compressed bytes one fetch may bring (a first batch larger "
        "than this still comes, up to the input topic's max.message.bytes). Bounds the memory a fetch can "
        "decompress into (gzip up to ~1032x its bytes); see docs/delivery.md.",
    )
    max_partition_fetch_bytes: int = Field(
        1_048_576,
        ge=1,
        description="librdkafka max.partition.fetch.bytes: compressed bytes one fetch may bring of one "
        "partition (a larger first batch still comes).",
    )
    receive_message_max_bytes: int = Field(
        67_108_864,
        ge=1000,
        description="librdkafka receive.message.max.bytes: the largest fetch response, and the most a zstd "
        "batch may decompress to; a batch that would decompress past it is dead-lettered "
        "(undecodable_batch). At least fetch_max_bytes + 512 and the input topic's max.message.bytes + 512 "
        "(checked at start-up).",
    )
    queued_max_messages_kbytes: int = Field(
        16_384,
        ge=1,
        description="librdkafka queued.max.messages.kbytes: KiB of fetched, not yet consumed messages the "
        "consumer keeps before it stops fetching (one fetch may overshoot it).",
    )
    undecodable_batch_retries: int = Field(
        3,
        ge=0,
        description="A record batch the consumer cannot decompress or parse (e.g. it would decompress past "
        "receive_message_max_bytes) is fetched again this many times (fetch.error.backoff.ms apart), then "
        "its offsets become dead letters (undecodable_batch) and the partition moves on; /readyz fails "
        "meanwhile.",
    )

    delivery: Literal["at_least_once", "exactly_once"] = Field(
        "at_least_once",
        description="at_least_once: idempotent producer, offsets committed after acks (a crash may repeat "
        "a window); exactly_once: one transaction per window with results, dead letters and offsets "
        "(readers use isolation.level=read_committed).",
    )
    transaction_timeout_ms: int = Field(
        60_000, ge=1000, description="exactly_once: librdkafka transaction.timeout.ms (longer than a window)."
    )
    transaction_call_timeout_s: float = Field(
        20.0,
        gt=0,
        description="exactly_once: the longest one transaction call (init, begin, send offsets, commit, "
        "abort) may take. A call past it is given up: the producer is replaced (its transaction fenced and "
        "aborted by the new one), the partitions are read again from their committed offsets; /readyz fails "
        "until transactions work again. Below transaction_timeout_ms.",
    )

    # --- batching ---
    max_batch_size: int = Field(
        32,
        ge=1,
        description="Most reviews in one inference batch. On a GPU only when set (or with use_tensorrt, "
        "whose engine takes batches up to it): there max_batch_tokens alone bounds a batch.",
    )
    max_batch_tokens: int = Field(
        4096,
        ge=16,
        description="Most padded tokens (batch size x longest sequence) in one inference batch. On a GPU, "
        "unless set, calibrated to the device memory budget at start-up (as auto), or 65536 for a "
        "backend whose device memory is not measured (onnx).",
    )
    max_window_messages: int = Field(
        256,
        ge=1,
        description="Most messages gathered before a window is labelled and published. On a GPU, unless "
        "set, a window grows to fill one batch of max_batch_tokens at the mean review length (at least "
        "this many).",
    )
    max_wait_ms: int = Field(
        50, ge=0, description="Longest a window waits for more messages, timed from its first message."
    )
    max_queued_windows: int = Field(
        2,
        ge=1,
        description="Windows queued for or in inference; when full, the poll thread stops consuming "
        "(and pauses the partitions after 2 s).",
    )

    # --- memory budget ---
    max_batch_tokens_auto: bool = Field(
        False,
        description="Calibrate max_batch_tokens at start-up (as `sentiment-worker tune`, cached); "
        "SENTIMENT_MAX_BATCH_TOKENS=auto sets it. max_batch_tokens is then only the fallback.",
    )
    vram_budget_mb: int | None = Field(
        None, ge=1, description="GPU memory (MiB) inference may use; default: all of the device's."
    )
    vram_budget_fraction: float | None = Field(
        None, gt=0, le=1, description="Share of the device's memory inference may use (instead of MiB)."
    )
    vram_safety_margin: float = Field(
        0.1, ge=0, lt=1, description="Share of the VRAM budget kept free (fragmentation, other tensors)."
    )
    tuning_cache_dir: Path | None = Field(
        None, description="Where calibration results are cached; default ~/.cache/sentiment-worker/tuning."
    )
    tuning_latency_bound_ms: float = Field(
        1000.0, gt=0, description="CPU calibration: the longest acceptable inference batch."
    )

    @model_validator(mode="before")
    @classmethod
    def _max_batch_tokens_auto(cls, data: Any) -> Any:
        # max_batch_tokens stays an int for its users; "auto" turns calibration on and keeps the default.
        if isinstance(data, dict) and str(data.get("max_batch_tokens", "")).strip().lower() == "auto":
            data = {key: value for key, value in data.items() if key != "max_batch_tokens"}
            data["max_batch_tokens_auto"] = True
        return data

    @model_validator(mode="before")
    @classmethod
    def _registry_user_info_out_of_the_url(cls, data: Any) -> Any:
        # Moved before anything sees the URL: the registry client gets a URL without a password, so none of
        # its errors (dead-letter reasons, /readyz, logs, doctor) can carry one.
        url = data.get("schema_registry_url") if isinstance(data, dict) else None
        if not isinstance(url, str) or "@" not in url:
            return data
        bare, user_info = split_user_info(url)
        if user_info is None:
            return data
        given = data.get("schema_registry_basic_auth_user_info")
        if isinstance(given, SecretStr):
            given = given.get_secret_value()
        if given is not None and str(given).strip():
            raise ValueError(
                "SENTIMENT_SCHEMA_REGISTRY_URL carries user info (user:password@) and "
                "SENTIMENT_SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO is set too: keep one, preferably the "
                "variable, and take the user info out of the URL"
            )
        return {**data, "schema_registry_url": bare, "schema_registry_basic_auth_user_info": user_info}

    @model_validator(mode="after")
    def _two_input_fields(self) -> WorkerSettings:
        if self.text_field == self.id_field:
            raise ValueError(f"text_field and id_field are both {self.text_field!r}: name two fields")
        return self

    @model_validator(mode="after")
    def _registry_for_registry_formats(self) -> WorkerSettings:
        needs = [
            f"{name}={value}"
            for name, value in (("input_format", self.input_format), ("output_format", self.output_format))
            if value in REGISTRY_FORMATS
        ]
        if needs and not (self.schema_registry_url or "").strip():
            raise ValueError(
                f"{' and '.join(needs)} needs a Schema Registry: set SENTIMENT_SCHEMA_REGISTRY_URL "
                "(e.g. http://localhost:8081)"
            )
        return self

    @model_validator(mode="after")
    def _fetch_limits(self) -> WorkerSettings:
        if self.receive_message_max_bytes < self.fetch_max_bytes + 512:
            raise ValueError(
                f"receive_message_max_bytes ({self.receive_message_max_bytes}) must be at least "
                f"fetch_max_bytes + 512 ({self.fetch_max_bytes + 512}): librdkafka needs room for a whole "
                "fetch response"
            )
        if self.transaction_call_timeout_s * 1000 >= self.transaction_timeout_ms:
            raise ValueError(
                f"transaction_call_timeout_s ({self.transaction_call_timeout_s:g}) must be below "
                f"transaction_timeout_ms ({self.transaction_timeout_ms} ms): a call given up must leave the "
                "transaction time to be fenced and aborted"
            )
        return self

    @model_validator(mode="after")
    def _one_vram_budget(self) -> WorkerSettings:
        if self.vram_budget_mb is not None and self.vram_budget_fraction is not None:
            raise ValueError("set vram_budget_mb or vram_budget_fraction, not both")
        return self

    # --- input limits ---
    max_text_chars: int = Field(10_000, ge=1, description="Longer texts are dead-lettered (text_too_long).")
    max_value_bytes: int = Field(1_048_576, ge=1, description="Larger values are dead-lettered.")
    max_json_depth: int = Field(
        32,
        ge=1,
        description="Deeper JSON nesting is dead-lettered (registry formats: records, maps, arrays and "
        "messages alike, at most 64).",
    )

    # --- model ---
    model: str = Field(
        DEFAULT_MODEL_DIR,
        description="Model directory (training, `export` or `quantize` output, verified against its "
        "model_manifest.json before it is read), or a PaddleNLP model name when allow_hub_model; the default "
        "is the shipped models/default as ONNX Runtime INT8, which `make model` derives.",
    )
    device: Literal["gpu", "cpu", "auto"] = Field(
        "auto", description="gpu fails loudly without a working CUDA device; auto logs its choice."
    )
    max_seq_len: int | None = Field(None, ge=8, description="Token limit per review; default: the model's.")

    # --- inference backend ---
    backend: Literal["auto", "dynamic", "static", "onnx", "identity"] = Field(
        "auto",
        description="static: Paddle Inference predictor on a `sentiment-worker export` directory (oneDNN on "
        "CPU); onnx: ONNX Runtime on an `export --format onnx` or `quantize` (INT8) directory; dynamic: "
        "dygraph on a training directory; auto: the fastest backend `compare-backends --record` measured "
        "in the directory on this CPU without accuracy loss, else static for an exported directory, onnx "
        "for an ONNX-only one, else dynamic. identity: no model at all, for measuring the host path "
        "(`bench --host-ceiling`): the directory's real tokenizer, then fixed probabilities that mean "
        "nothing; never chosen by auto, refused unless allow_identity_model.",
    )
    allow_identity_model: bool = Field(
        False,
        description="Let backend=identity start: its results name the model `identity` and their labels "
        "mean nothing (a measuring instrument, never a service).",
    )
    allow_hub_model: bool = Field(
        False,
        description="Let `model` name a PaddleNLP hub model, which PaddleNLP downloads and unpickles (code "
        "from the hub runs). Off: only verified local model directories load (docs/model-trust.md).",
    )
    tokenizer: Literal["auto", "fast", "slow"] = Field(
        "auto",
        description="fast: Rust WordPiece (same ids as ErnieTokenizer); slow: ErnieTokenizer itself; "
        "auto: fast if it matches the slow one on probe texts (checked by the export for an exported model, "
        "which then loads without PaddleNLP; else at start-up).",
    )
    cpu_threads: int | None = Field(
        None,
        ge=1,
        description="Static and onnx backends on CPU: math threads per predictor/session; "
        "default: all cores.",
    )
    cpu_threads_per_call: int = Field(
        1,
        ge=1,
        description="Onnx backend on CPU: threads one model call uses; a window's batches run "
        "cpu_threads / this calls side by side. 1 labels 1.2-1.4x the reviews/s of one call across 2 "
        "threads; set it to cpu_threads for one call at a time.",
    )
    use_fp16: bool = Field(False, description="Static backend on GPU: FP16 inference.")
    use_tensorrt: bool = Field(False, description="Static backend on GPU: TensorRT subgraphs.")
    use_bf16: bool = Field(
        False,
        description="Static backend on CPU: oneDNN bfloat16 kernels (needs AVX512-BF16 or AMX; the worker "
        "refuses to start without). Compare its accuracy first: `sentiment-worker compare-backends`.",
    )
    long_text: Literal["truncate", "head_tail", "chunk"] = Field(
        "head_tail",
        description="Reviews over max_seq_len tokens: truncate keeps the head; head_tail the first 1/4 and "
        "last 3/4; chunk labels overlapping windows and averages their probabilities (one result each).",
    )
    chunk_stride_tokens: int | None = Field(
        None, ge=1, description="chunk: tokens between window starts; default: half a window."
    )

    # --- operations ---
    http_host: str = Field(
        "127.0.0.1",
        description="Address of /metrics, /healthz, /readyz (and the HTTP API); 0.0.0.0 in containers.",
    )
    http_port: int = Field(
        9108, ge=0, le=65535, description="Port of /metrics, /healthz, /readyz (and the HTTP API); 0 = off."
    )

    low_confidence: float = Field(
        DEFAULT_LOW_CONFIDENCE,
        ge=0,
        le=1,
        description="Confidence under which a result counts as low-confidence "
        "(sentiment_low_confidence_predictions_total, alert SentimentLowConfidenceShareHigh). The shipped "
        "model is calibrated on its held-out reviews (ECE 0.017, INT8 about 0.02: its card): a result of "
        "confidence c is right about c of the time, so under 0.7 about one in three or more is wrong.",
    )

    # --- the HTTP API (`sentiment-worker serve`, or `run` with http_api) ---
    http_api: bool = Field(
        False,
        description="run: also answer POST /v1/sentiment and the page at / on the HTTP port while consuming, "
        "through the same model and engine (serve always does).",
    )
    api_token: SecretStr | None = Field(
        None,
        description="Bearer token POST /v1/sentiment requires (401 without it); unset or blank: open, "
        "which start-up logs as a warning. Never logged.",
    )
    http_max_texts: int = Field(256, ge=1, description="Most texts in one HTTP request (more: 413).")
    http_max_body_bytes: int = Field(
        1_048_576, ge=64, description="Largest HTTP request body in bytes (larger: 413)."
    )
    http_max_queued_texts: int = Field(
        2048,
        ge=1,
        description="Texts accepted over HTTP and not yet answered; a request that would pass it gets 503 "
        "with Retry-After.",
    )
    http_max_wait_ms: int = Field(
        2,
        ge=0,
        description="Longest an HTTP request waits for others to share its batch when the model is idle "
        "(0: at once); while the model is busy, requests gather until it is free.",
    )
    http_request_timeout_s: float = Field(
        30.0, gt=0, description="An HTTP request not answered within this gets 504."
    )
    http_cors_origins: list[str] = Field(
        default_factory=list, description="Origins allowed by CORS (JSON list); empty: no CORS headers."
    )
    http_max_header_bytes: int = Field(
        16_384,
        ge=1024,
        description="Largest HTTP request head (request line and headers) in bytes; larger: 431, and the "
        "connection is closed.",
    )
    http_header_timeout_s: float = Field(
        10.0,
        gt=0,
        description="A request head must be complete within this of the connection's opening (or of its "
        "first byte after an answer); else 408 and closed (a connection that sent nothing: closed).",
    )
    http_body_timeout_s: float = Field(
        30.0,
        gt=0,
        description="A request body must be complete within this of its head; else 408 and closed.",
    )
    http_keep_alive_s: float = Field(
        5.0, gt=0, description="An idle connection is closed this long after its last answer."
    )
    http_max_connections: int = Field(
        512,
        ge=1,
        description="Most HTTP connections open at once; past it a new one gets 503 with Retry-After and is "
        "closed.",
    )
    # --- live models (the control and status topics) ---
    model_control: Literal["auto", "topic", "api", "off"] = Field(
        "auto",
        description="How a running replica learns which models to serve: topic: follows the control topic "
        "(`models shadow|promote` write it; a replica that starts serves what it says); api: `serve`'s "
        "POST /v1/admin/models (needs api_token); off: only SENTIMENT_MODEL; auto: topic for `run`, api for "
        "`serve` when api_token is set.",
    )
    control_topic: str | None = Field(
        None,
        description="Compacted topic holding the models the group should serve (default <group_id>.control); "
        "operators write it, workers read it.",
    )
    status_topic: str | None = Field(
        None,
        description="Compacted topic where each replica reports what it serves and the shadow's agreement "
        "(default <group_id>.status); workers write their own key.",
    )
    status_interval_s: float = Field(10.0, gt=0, description="How often a replica reports its status.")
    shadow_cpu_share: float = Field(
        0.25,
        gt=0,
        le=1,
        description="Share of the CPU threads a shadow model gets (at least 1); its threads also run at a "
        "lower priority, so the primary's results are not delayed by it.",
    )
    shadow_max_groups: int = Field(
        2,
        ge=1,
        description="Most groups (Kafka windows, HTTP requests) queued on or labelled by the shadow at once; "
        "a group arriving while it has this many is not shadowed (counted as skipped).",
    )
    shadow_topic: str | None = Field(
        None,
        description="When set, the shadow's results go there too (the result schema, its own model name and "
        "version; best effort, never holding a commit).",
    )
    shadow_sample_topic: str | None = Field(
        None,
        description="When set, reviews the shadow and the primary label differently go there (rate limited).",
    )
    shadow_samples_per_s: float = Field(
        1.0, gt=0, description="Most disagreements sent to shadow_sample_topic per second (a burst of 10)."
    )

    shutdown_timeout_s: float = Field(
        30.0, gt=0, description="Bound on a clean stop: finish the window, flush, commit, close."
    )
    commit_interval_ms: int = Field(1000, ge=10, description="How often stored offsets are committed.")
    max_poll_interval_ms: int = Field(
        300_000, ge=10_000, description="librdkafka max.poll.interval.ms; the loop polls well within it."
    )
    session_timeout_ms: int = Field(
        10_000,
        ge=1000,
        description="librdkafka session.timeout.ms: how soon the group reassigns a dead member's partitions.",
    )
    liveness_timeout_s: float = Field(60.0, gt=0, description="/healthz fails when the loop stalls longer.")
    stuck_partition_s: float = Field(
        120.0,
        gt=0,
        description="/readyz fails when a partition's oldest unacknowledged input has not moved for longer "
        "while inputs wait (sentiment_partition_stalled_seconds; alert SentimentPartitionStuck).",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="Log level.")

    @field_validator("bootstrap_servers", "input_topic", "output_topic", "dlq_topic", "group_id")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value.strip()

    @field_validator(
        "ssl_ca_location",
        "ssl_certificate_location",
        "ssl_key_location",
        "schema_registry_ssl_ca_location",
        "schema_registry_url",
        mode="before",
    )
    @classmethod
    def _empty_path_is_none(cls, value: Any) -> Any:
        # An empty SENTIMENT_SSL_* (a template's ${VAR:-}) means: not set, not the current directory.
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("api_token", "schema_registry_basic_auth_user_info", mode="before")
    @classmethod
    def _empty_token_is_none(cls, value: Any) -> Any:
        # An empty SENTIMENT_API_TOKEN (e.g. compose's ${SENTIMENT_API_TOKEN:-}) means: no token.
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("schema_registry_basic_auth_user_info")
    @classmethod
    def _user_and_password(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and ":" not in value.get_secret_value():
            raise ValueError("must be `user:password` (a colon between them)")
        return value

    @model_validator(mode="after")
    def _kafka_extra_keeps_security(self) -> WorkerSettings:
        guarded = kafka_extra_overrides(self.kafka_extra)
        if guarded and not self.allow_kafka_extra_overrides:
            instead = "; ".join(
                f"{key}: {KAFKA_EXTRA_GUARDED_ONE_SETTING.get(key.lower(), _NO_SETTING)}" for key in guarded
            )
            raise ValueError(
                f"SENTIMENT_KAFKA_EXTRA sets {', '.join(guarded)}, which would change the connection's "
                f"security, address or transactional id without a word; instead, {instead} (or set "
                "SENTIMENT_ALLOW_KAFKA_EXTRA_OVERRIDES=true: start-up then names each such key)"
            )
        return self

    @model_validator(mode="after")
    def _http_queue_holds_a_request(self) -> WorkerSettings:
        if self.http_max_queued_texts < self.http_max_texts:
            raise ValueError("http_max_queued_texts must be >= http_max_texts (a full request must fit)")
        return self

    @model_validator(mode="after")
    def _topics_distinct(self) -> WorkerSettings:
        if self.input_topic in (self.output_topic, self.dlq_topic):
            raise ValueError("input_topic must differ from output_topic and dlq_topic (it would loop)")
        return self

    @model_validator(mode="after")
    def _sasl_complete(self) -> WorkerSettings:
        if not (self.security_protocol or "").upper().startswith("SASL"):
            return self
        mechanism = (self.sasl_mechanism or "").upper()
        if not mechanism:
            raise ValueError(
                f"security_protocol={self.security_protocol} needs sasl_mechanism (PLAIN, SCRAM-SHA-512, ...)"
            )
        if (mechanism == "PLAIN" or mechanism.startswith("SCRAM")) and (
            not self.sasl_username or self.sasl_password is None
        ):
            raise ValueError(f"sasl_mechanism={self.sasl_mechanism} needs sasl_username and sasl_password")
        return self

    @model_validator(mode="after")
    def _tls_complete(self) -> WorkerSettings:
        files = {
            "ssl_ca_location": self.ssl_ca_location,
            "ssl_certificate_location": self.ssl_certificate_location,
            "ssl_key_location": self.ssl_key_location,
        }
        given = [name for name, path in files.items() if path is not None]
        if given and not self.uses_tls:
            raise ValueError(
                f"{given[0]} is set but security_protocol={self.security_protocol} does not use TLS "
                "(set SENTIMENT_SECURITY_PROTOCOL=SSL or SASL_SSL)"
            )
        if (self.ssl_certificate_location is None) != (self.ssl_key_location is None):
            raise ValueError("ssl_certificate_location and ssl_key_location go together (mTLS needs both)")
        return self  # the files are read by librdkafka (and `doctor`), which say when one is missing

    @property
    def control_topic_name(self) -> str:
        """The control topic: `control_topic`, else `<group_id>.control`."""
        return self.control_topic or f"{self.group_id}.control"

    @property
    def status_topic_name(self) -> str:
        """The status topic: `status_topic`, else `<group_id>.status`."""
        return self.status_topic or f"{self.group_id}.status"

    @property
    def uses_tls(self) -> bool:
        """True when security_protocol is SSL or SASL_SSL."""
        return (self.security_protocol or "").upper() in ("SSL", "SASL_SSL")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Explicit arguments (CLI flags) > environment > config file (see load_settings) > defaults.
        return (init_settings, env_settings, _ConfigFileSource(settings_cls, cls._config_file_values))

    def librdkafka_common(self) -> dict[str, Any]:
        """Properties shared by consumer and producer, including credentials (handle with care).

        librdkafka's log lines go to the `librdkafka` Python logger; a client hands them over when it is
        polled (consume, poll, flush), and those still queued when it is destroyed are dropped."""
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "client.id": self.worker_id,
            "logger": logging.getLogger(LIBRDKAFKA_LOGGER),
        }
        if self.security_protocol:
            conf["security.protocol"] = self.security_protocol
        if self.sasl_mechanism:
            conf["sasl.mechanism"] = self.sasl_mechanism
        if self.sasl_username is not None:
            conf["sasl.username"] = self.sasl_username
        if self.sasl_password is not None:
            conf["sasl.password"] = self.sasl_password.get_secret_value()
        if self.uses_tls:
            # librdkafka reads the files itself: no key material passes through this process's memory.
            if self.ssl_ca_location is not None:
                conf["ssl.ca.location"] = str(self.ssl_ca_location)
            if self.ssl_certificate_location is not None and self.ssl_key_location is not None:
                conf["ssl.certificate.location"] = str(self.ssl_certificate_location)
                conf["ssl.key.location"] = str(self.ssl_key_location)
            verify = "https" if self.ssl_endpoint_identification else "none"
            conf["ssl.endpoint.identification.algorithm"] = verify
        conf.update(self.kafka_extra)
        return conf

    def consumer_fetch_limits(self) -> dict[str, int]:
        """The librdkafka properties that bound what the consumer fetches and decompresses (docs/delivery.md);
        `kafka_extra` may override them."""
        return {
            "fetch.max.bytes": self.fetch_max_bytes,
            "max.partition.fetch.bytes": self.max_partition_fetch_bytes,
            "receive.message.max.bytes": self.receive_message_max_bytes,
            "queued.max.messages.kbytes": self.queued_max_messages_kbytes,
        }

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

    def public_view(self) -> dict[str, Any]:
        """The settings as printable JSON-able values, secrets masked."""
        return json.loads(self.model_dump_json())


KAFKA_EXTRA_GUARDED_ONE_SETTING: Mapping[str, str] = {
    "bootstrap.servers": "set SENTIMENT_BOOTSTRAP_SERVERS",
    "metadata.broker.list": "set SENTIMENT_BOOTSTRAP_SERVERS",
    "security.protocol": "set SENTIMENT_SECURITY_PROTOCOL",
    "sasl.mechanism": "set SENTIMENT_SASL_MECHANISM",
    "sasl.mechanisms": "set SENTIMENT_SASL_MECHANISM",
    "sasl.username": "set SENTIMENT_SASL_USERNAME",
    "sasl.password": "set SENTIMENT_SASL_PASSWORD",
    "ssl.ca.location": "set SENTIMENT_SSL_CA_LOCATION",
    "ssl.certificate.location": "set SENTIMENT_SSL_CERTIFICATE_LOCATION",
    "ssl.key.location": "set SENTIMENT_SSL_KEY_LOCATION",
    "ssl.endpoint.identification.algorithm": "set SENTIMENT_SSL_ENDPOINT_IDENTIFICATION",
    "enable.ssl.certificate.verification": "no setting turns it off: trust the broker's CA with "
    "SENTIMENT_SSL_CA_LOCATION",
    "transactional.id": "no setting: exactly_once derives it from SENTIMENT_GROUP_ID and SENTIMENT_WORKER_ID",
    "plugin.library.paths": "no setting: it loads native code into the worker",
}
"""librdkafka properties kafka_extra may not set without allow_kafka_extra_overrides, each with what to do
instead; and with `_GUARDED_PREFIXES`, every other key of their families."""
_GUARDED_PREFIXES = ("security.", "ssl.", "ssl_", "sasl.", "enable.ssl.", "enable.sasl.", "https.", "oauth")
_NO_SETTING = "no setting of its own"


def kafka_extra_overrides(extra: Mapping[str, object]) -> list[str]:
    """The keys of `extra` (kafka_extra) that change the connection's security (security.*, ssl.*, sasl.*,
    enable.ssl.certificate.verification, OAUTHBEARER and its https.* endpoint, plugins), its bootstrap
    address or the transactional id, in the order given."""
    return [
        key
        for key in extra
        if key.lower() in KAFKA_EXTRA_GUARDED_ONE_SETTING or key.lower().startswith(_GUARDED_PREFIXES)
    ]


def split_user_info(urls: str) -> tuple[str, str | None]:
    """A registry URL (or a comma-separated list of them) without user info, and that user info as basic
    auth's `user:password` (percent-decoding undone, as the registry client does; no password: empty), or
    None when no URL has any. Raises ValueError, without echoing a URL, when the URLs carry different
    user info or the user name holds a colon (basic auth cannot carry one)."""
    bare, found = [], set()
    for url in urls.split(","):
        parts = urlsplit(url.strip())
        user_info, at, host = parts.netloc.rpartition("@")
        if at:
            user, colon, password = user_info.partition(":")
            if ":" in unquote(user):
                raise ValueError(
                    "the user name in SENTIMENT_SCHEMA_REGISTRY_URL holds a colon, which HTTP basic auth "
                    "cannot carry: set SENTIMENT_SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO=user:password"
                )
            found.add(f"{unquote(user)}:{unquote(password) if colon else ''}")
            parts = parts._replace(netloc=host)
        bare.append(urlunsplit(parts))
    if len(found) > 1:
        raise ValueError(
            "the URLs of SENTIMENT_SCHEMA_REGISTRY_URL carry different user info: the registry client sends "
            "one: set it once in SENTIMENT_SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO and take it out of the URLs"
        )
    return ",".join(bare), (found.pop() if found else None)


def read_config_file(path: Path) -> dict[str, Any]:
    """Reads a config file (TOML when the name ends in .toml in any case, else JSON); raises ValueError
    naming the file when it is not a regular file, not UTF-8, or not valid JSON/TOML."""
    if path.exists() and not path.is_file():  # a FIFO would block the read until someone writes to it
        raise ValueError(
            f"config file {path} is not a regular file (a directory, pipe or device): "
            "point --config / SENTIMENT_CONFIG_FILE at a JSON or TOML file"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read config file {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"config file {path} is not UTF-8 text (byte {exc.start}): save it as UTF-8"
        ) from None
    is_toml = path.suffix.lower() == ".toml"
    try:
        data = tomllib.loads(text) if is_toml else json.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        kind = "TOML" if is_toml else "JSON"
        raise ValueError(f"config file {path} is not valid {kind}: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"config file {path} must hold an object of settings")
    return data


class _ConfigFileSource(PydanticBaseSettingsSource):
    """Values of the config file: below the environment, above the defaults."""

    def __init__(self, settings_cls: type[BaseSettings], values: dict[str, Any]) -> None:
        super().__init__(settings_cls)
        self._values = values

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self._values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._values)


def load_settings(config_file: Path | None = None, **overrides: Any) -> WorkerSettings:
    """Builds the settings: explicit overrides > SENTIMENT_* environment > config file > defaults.

    Overrides whose value is None are ignored, so CLI flags left unset don't mask the environment.
    """
    file_values = read_config_file(config_file) if config_file else {}
    unknown = sorted(set(file_values) - set(WorkerSettings.model_fields))
    if unknown:
        raise ValueError(f"config file {config_file} has unknown settings: {', '.join(unknown)}")

    class _Settings(WorkerSettings):
        _config_file_values: ClassVar[dict[str, Any]] = file_values

    try:
        return _Settings(**{key: value for key, value in overrides.items() if value is not None})
    except SettingsError as exc:  # names pydantic's source class: say which variable and what it must be
        field = re.search(r'field "(\w+)"', str(exc))
        if field is None or field.group(1) not in JSON_EXAMPLES:
            raise
        variable, example = ENV_PREFIX + field.group(1).upper(), JSON_EXAMPLES[field.group(1)]
        raise ValueError(f"{variable} must be JSON, e.g. {variable}='{example}'") from None


def environment_warnings(
    settings: WorkerSettings, environ: Mapping[str, str], *, serves_api: bool
) -> list[str]:
    """What start-up should warn about, one line each: SENTIMENT_* variables that are not settings (a typo
    is otherwise ignored, unlike an unknown config-file key), with the closest known name; the keys by
    which kafka_extra overrides the connection's security, address or transactional id (names, never
    values); and, when the process answers the HTTP API (`serves_api`), that it does so without a token."""
    known = {ENV_PREFIX + name.upper() for name in WorkerSettings.model_fields}
    warnings = []
    for name in sorted(environ):
        upper = name.upper()  # pydantic-settings matches the names case-insensitively
        if not upper.startswith(ENV_PREFIX) or upper in known or upper in OTHER_ENVIRONMENT:
            continue
        close = difflib.get_close_matches(upper, sorted(known | OTHER_ENVIRONMENT), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}?" if close else "see docs/settings.md for the settings"
        warnings.append(f"{name} is not a setting and is ignored: {hint}")
    overrides = kafka_extra_overrides(settings.kafka_extra)
    if overrides:
        warnings.append(
            f"SENTIMENT_KAFKA_EXTRA overrides {', '.join(overrides)} (SENTIMENT_ALLOW_KAFKA_EXTRA_OVERRIDES="
            "true): the Kafka clients connect with these, not with the settings of the same meaning; "
            "`sentiment-worker doctor` checks the configuration they get"
        )
    if serves_api and settings.api_token is None:
        blank = any(k.upper() == "SENTIMENT_API_TOKEN" for k in environ)
        why = "SENTIMENT_API_TOKEN is blank" if blank else "SENTIMENT_API_TOKEN is not set"
        warnings.append(
            f"the HTTP API is open: {why}, so POST /v1/sentiment answers anyone who can reach "
            f"{settings.http_host}:{settings.http_port}; set SENTIMENT_API_TOKEN to require a bearer token"
        )
    return warnings
