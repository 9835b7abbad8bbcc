"""Where settings come from: command-line flags > `SENTIMENT_*` environment > the config file > defaults
(`load_settings`), and what start-up warns about in the environment (`environment_warnings`)."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import tomllib
from pydantic_settings import SettingsError

from worker.config.fields import ENV_PREFIX
from worker.config.settings import WorkerSettings, kafka_extra_overrides

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


def load_settings(config_file: Path | None = None, **overrides: Any) -> WorkerSettings:
    """Builds the settings: explicit overrides > SENTIMENT_* environment > config file > defaults.

    Overrides whose value is None are ignored, so CLI flags left unset don't mask the environment.
    """
    file_values = read_config_file(config_file) if config_file else {}
    unknown = sorted(set(file_values) - set(WorkerSettings.model_fields))
    if unknown:
        named = "; ".join(f"{key} ({_file_key_hint(key)})" for key in unknown)
        raise ValueError(f"config file {config_file} has unknown settings: {named}")

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


def _file_key_hint(key: str) -> str:
    """What a config file's unknown `key` may have meant: the setting it names in environment form
    (SENTIMENT_BOOTSTRAP_SERVERS → bootstrap_servers), else the closest setting, as env typos get."""
    known = sorted(WorkerSettings.model_fields)
    plain = key.strip().lower().replace("-", "_")
    plain = plain.removeprefix(ENV_PREFIX.lower())
    if plain in WorkerSettings.model_fields:
        return f"did you mean {plain}?"
    close = difflib.get_close_matches(plain, known, n=1, cutoff=0.6)
    return f"did you mean {close[0]}?" if close else "see docs/settings.md for the settings"


def setting_origin(
    name: str, *, flag_given: bool, environ: Mapping[str, str], config_file: Path | None
) -> str:
    """Where setting `name` came from, in the precedence `load_settings` applies: `--flag`, the
    environment variable, the config file, or the default (say which, so a value from the wrong place
    shows)."""
    variable = ENV_PREFIX + name.upper()
    if flag_given:
        return f"--{name.replace('_', '-')}"
    if any(key.upper() == variable for key in environ):
        return variable
    if config_file is not None:
        try:
            in_file = name in read_config_file(config_file)
        except ValueError:
            in_file = False
        if in_file:
            return f"config file {config_file}"
    return f"the default ({variable} not set)"


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
