"""The settings' fields: every setting the worker can be told, its type, default, bounds and description, in
the order docs/settings.md lists them (`make docs` generates it from here). One field is one environment
variable `SENTIMENT_<NAME>` and one key of the config file; the rules that span fields and the sources are in
`worker.config.settings`.

A new setting: a Field here with a description; a field of the same name in its section
(`worker.config.sections`: the part that reads it takes that section); a value in
tests/unit/config/test_sections.py's USER_VALUES; then `make docs`.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_MODEL_DIR = "models/default-int8"
"""What `make model` derives from the shipped models/default: ONNX Runtime INT8, the fastest CPU form."""

ENV_PREFIX = "SENTIMENT_"

REGISTRY_FORMATS = frozenset({"avro", "json_schema", "protobuf"})
"""Input and output formats in the Schema Registry wire format (magic byte 0, 4-byte big-endian schema id)."""

DEFAULT_LOW_CONFIDENCE = 0.7
"""See `WorkerSettings.low_confidence` (it is here so worker/metrics.py shares the default)."""

# The choices of the settings that have a few, named once for the fields and their sections.
InputFormat = Literal["json", "text", "avro", "json_schema", "protobuf"]
OutputFormat = Literal["json", "avro", "json_schema", "protobuf"]
SubjectStrategy = Literal["topic", "record", "topic_record"]
Compatibility = Literal[
    "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE", "NONE"
]
OutputPartitioning = Literal["source", "key"]
Delivery = Literal["at_least_once", "exactly_once"]
DlqSizeCheck = Literal["warn", "refuse", "off"]
ModelControlMode = Literal["auto", "topic", "api", "off"]
Device = Literal["gpu", "cpu", "auto"]
Backend = Literal["auto", "dynamic", "static", "onnx", "identity"]
Tokenizer = Literal["auto", "fast", "slow"]
LongText = Literal["truncate", "head_tail", "chunk"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]


class SettingsFields(BaseSettings):
    """Everything the worker can be told, flat, as users name it; units are in the names. Read through
    `WorkerSettings`, whose sections (`settings.sections.kafka`, ...) are what the worker's parts take."""

    # hide_input_in_errors: a validation error must never echo a password it was given.
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, frozen=True, extra="forbid", hide_input_in_errors=True
    )

    # --- Kafka ---
    bootstrap_servers: str = Field("localhost:9092", description="Kafka bootstrap servers, comma-separated.")
    input_topic: str = Field("reviews", description="Topic the reviews are read from.")
    output_topic: str = Field("reviews-sentiment", description="Topic the results are published to.")
    dlq_topic: str = Field("reviews-dlq", description="Dead-letter topic for inputs that cannot be labelled.")
    dlq_size_check: DlqSizeCheck = Field(
        "warn",
        description="run: what to do when the dead-letter topic's max.message.bytes cannot hold the input "
        "topic's largest record plus the dead-letter headers (topics made at the broker's defaults): warn: "
        "start and say so once (such a dead letter goes as a stand-in without key and value, its source "
        "topic, partition and offset in headers; `topics create --fix` raises the limit); refuse: exit 2; "
        "off: say nothing. true and false are still read as refuse and off.",
    )
    group_id: str = Field("sentiment-worker", description="Consumer group; replicas share it.")
    worker_id: str = Field(
        default_factory=socket.gethostname, description="Identifies this replica in dead letters and logs."
    )
    input_format: InputFormat = Field(
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
    output_format: OutputFormat = Field(
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
    schema_subject_strategy: SubjectStrategy = Field(
        "topic",
        description="Subject the result schema is registered under: topic `<output_topic>-value`, record "
        "the record's full name `sentiment.SentimentResult`, topic_record `<output_topic>-<record name>`.",
    )
    schema_compatibility: Compatibility = Field(
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
    output_partitioning: OutputPartitioning = Field(
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

    delivery: Delivery = Field(
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
    device: Device = Field(
        "auto", description="gpu fails loudly without a working CUDA device; auto logs its choice."
    )
    max_seq_len: int | None = Field(None, ge=8, description="Token limit per review; default: the model's.")

    # --- inference backend ---
    backend: Backend = Field(
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
    tokenizer: Tokenizer = Field(
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
    long_text: LongText = Field(
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
    model_control: ModelControlMode = Field(
        "auto",
        description="How a running replica learns which models to serve: topic: follows the control topic "
        "(`models shadow|promote` write it; a replica that starts serves what it says); api: `serve`'s "
        "GET|PUT /v1/admin/models (needs api_token); off: only SENTIMENT_MODEL; auto: topic for `run`, api "
        "for `serve` when api_token is set.",
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
    promote_min_agreement: float = Field(
        0.9,
        ge=0,
        le=1,
        description="`models promote --live` refuses a shadow that agrees with the primary on a smaller "
        "share of the reviews it shadowed (summed over the live replicas), unless --force.",
    )
    promote_min_shadowed: int = Field(
        1000,
        ge=0,
        description="`models promote --live` refuses a shadow that labelled fewer live reviews (summed over "
        "the live replicas), unless --force.",
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
    log_level: LogLevel = Field("INFO", description="Log level.")

    @field_validator("bootstrap_servers", "input_topic", "output_topic", "dlq_topic", "group_id")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value.strip()

    @field_validator("dlq_size_check", mode="before")
    @classmethod
    def _dlq_size_check_words(cls, value: Any) -> Any:
        # Before warn|refuse|off it was a bool: true (refuse to start) and false (start anyway).
        if isinstance(value, bool):
            return "refuse" if value else "off"
        if isinstance(value, str):
            word = value.strip().lower()
            return {"true": "refuse", "1": "refuse", "false": "off", "0": "off"}.get(word, word)
        return value

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
