"""The one settings object of the worker: `WorkerSettings`, its sections, and the rules that span fields.

Read once at the entry point (`worker.config.load_settings`) and passed down; no other module reads the
environment. Every setting is an environment variable `SENTIMENT_<NAME>` and a key of the optional config
file (`SENTIMENT_CONFIG_FILE` or `--config`; JSON, or TOML when the name ends in `.toml`, in any case).
The flat fields (`worker.config.fields`) are how settings are given and checked; the parts of the worker
take sections (`settings.sections.kafka`, `.batching`, ...: `worker.config.sections`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar, Self
from urllib.parse import unquote, urlsplit, urlunsplit

from pydantic import PrivateAttr, SecretStr, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from worker.config.fields import REGISTRY_FORMATS, SettingsFields
from worker.config.sections import Sections, build_sections, librdkafka_common, protocol_uses_tls


class WorkerSettings(SettingsFields):
    """Everything the worker can be told (the fields of `SettingsFields`), checked across fields, with its
    sections built once: `sections` is what the parts of the worker take."""

    _config_file_values: ClassVar[dict[str, Any]] = {}  # set by load_settings on a subclass
    _sections: Sections | None = PrivateAttr(default=None)

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

    @model_validator(mode="after")
    def _sections_built(self) -> WorkerSettings:
        # Last: the sections are built from settings that passed every rule above.
        self._sections = build_sections(self)
        return self

    @property
    def sections(self) -> Sections:
        """The settings by section, built once from these settings."""
        assert self._sections is not None  # built by the last validator
        return self._sections

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy (`update` as pydantic's: not validated, its names counted as given), with its sections
        built again from what it holds."""
        copied = super().model_copy(update=update, deep=deep)
        copied._sections = build_sections(copied)
        return copied

    @property
    def uses_tls(self) -> bool:
        """True when security_protocol is SSL or SASL_SSL."""
        return protocol_uses_tls(self.security_protocol)

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
        return (init_settings, env_settings, ConfigFileSource(settings_cls, cls._config_file_values))

    def consumer_fetch_limits(self) -> dict[str, int]:
        """`sections.kafka.consumer_fetch_limits()` (the CLI and tests)."""
        return self.sections.kafka.consumer_fetch_limits()

    @property
    def control_topic_name(self) -> str:
        """The control topic of this group (the CLI and tests; parts use `sections.live.control_topic_of`)."""
        return self.sections.live.control_topic_of(self.group_id)

    @property
    def status_topic_name(self) -> str:
        """The status topic of this group (the CLI and tests; parts use `sections.live.status_topic_of`)."""
        return self.sections.live.status_topic_of(self.group_id)

    def librdkafka_common(self) -> dict[str, Any]:
        """`librdkafka_common` of the kafka and security sections (credentials included: handle with care)."""
        return librdkafka_common(self.sections.kafka, self.sections.security)

    def schema_registry_conf(self) -> dict[str, Any]:
        """The registry section's `schema_registry_conf()` (credentials included: handle with care)."""
        return self.sections.registry.schema_registry_conf()

    def public_view(self) -> dict[str, Any]:
        """The settings as printable JSON-able values, secrets masked."""
        return json.loads(self.model_dump_json())


class ConfigFileSource(PydanticBaseSettingsSource):
    """Values of the config file: below the environment, above the defaults."""

    def __init__(self, settings_cls: type[BaseSettings], values: dict[str, Any]) -> None:
        super().__init__(settings_cls)
        self._values = values

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self._values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._values)


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
