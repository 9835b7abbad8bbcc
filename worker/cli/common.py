"""What every `sentiment-worker` command shares: exit codes, the settings flags and the one way settings are
built from them (logging and process start-up are `worker.runtime`'s, model loading `worker.labelling`'s).
A command fails by raising a category of `worker.errors` (`ConfigurationError`: exit 2, `OperationError`:
exit 1); `main` turns it into the exit code. Command modules import this, nothing else in `worker/` imports
`worker.cli`."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeAlias

from pydantic import ValidationError

from worker.config import WorkerSettings, environment_warnings, load_settings
from worker.errors import ConfigurationError
from worker.labelling.loading import load_classifier_for

__all__ = [
    "EXIT_CLOSED_PIPE",
    "EXIT_CONFIG",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "SETTING_FLAGS",
    "Subparsers",
    "add_column_flags",
    "add_cpu_threads_flag",
    "add_device_flag",
    "add_model_dirs_flag",
    "add_settings_flags",
    "env_config_file",
    "evaluate_model",
    "settings_from_args",
]

log = logging.getLogger("worker")

EXIT_OK, EXIT_FAILED, EXIT_CONFIG, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_CLOSED_PIPE = 141
"""The reader of stdout went away (`tail --dlq | head -2`): 128 + SIGPIPE, as `cat` or `yes` end there, so a
pipeline under `set -o pipefail` tells a cut-short output from a finished one."""

# What `build_parser` hands each command module's `register(subparsers)`.
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


# ----- settings from flags -----
SETTING_FLAGS = {
    "bootstrap_servers": "Kafka bootstrap servers (SENTIMENT_BOOTSTRAP_SERVERS)",
    "input_topic": "input topic (SENTIMENT_INPUT_TOPIC)",
    "output_topic": "results topic (SENTIMENT_OUTPUT_TOPIC)",
    "dlq_topic": "dead-letter topic (SENTIMENT_DLQ_TOPIC)",
    "group_id": "consumer group (SENTIMENT_GROUP_ID)",
    "model": "model directory or PaddleNLP name (SENTIMENT_MODEL)",
    "device": "gpu | cpu | auto (SENTIMENT_DEVICE)",
    "http_port": "port of /metrics /healthz /readyz (and the API), 0 = off (SENTIMENT_HTTP_PORT)",
    "http_host": "address the HTTP port binds, 127.0.0.1 by default (SENTIMENT_HTTP_HOST)",
    "input_format": "json | text (SENTIMENT_INPUT_FORMAT)",
    "backend": "auto | dynamic | static | onnx | identity (no inference; SENTIMENT_BACKEND)",
    "tokenizer": "auto | fast | slow (SENTIMENT_TOKENIZER)",
    "long_text": "truncate | head_tail | chunk (SENTIMENT_LONG_TEXT)",
}


def add_settings_flags(parser: argparse.ArgumentParser, *names: str) -> None:
    parser.add_argument("--config", type=Path, default=None, help="settings file (JSON or TOML)")
    for name in names:
        kind: Callable[[str], Any] = int if name == "http_port" else str
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=kind, help=SETTING_FLAGS[name])


def add_column_flags(parser: argparse.ArgumentParser) -> None:
    """--text-field / --id-field: where a CSV or JSONL file keeps the text and the id (produce, predict)."""
    parser.add_argument(
        "--text-field", default=None, help="CSV column / JSON field holding the review text (default: text)"
    )
    parser.add_argument(
        "--id-field", default=None, help="CSV column / JSON field holding the review id (default: id, if any)"
    )
    parser.add_argument(
        "--encoding",
        default="auto",
        help="the file's encoding (default auto: UTF-8, UTF-8 with BOM, then GB18030, which reads GBK and "
        "GB2312 as Excel exports them); any Python codec name",
    )


def add_device_flag(parser: argparse.ArgumentParser) -> None:
    """--device gpu|cpu|auto (default auto): where a command that names its model by its own flags runs it."""
    parser.add_argument("--device", default="auto", choices=["gpu", "cpu", "auto"])


def add_model_dirs_flag(parser: argparse.ArgumentParser, what: str) -> None:
    """--model DIR, required and repeatable: the models a measuring command puts side by side (`what` each
    one is)."""
    parser.add_argument("--model", required=True, type=Path, action="append", help=f"{what} (repeatable)")


def add_cpu_threads_flag(parser: argparse.ArgumentParser) -> None:
    """--cpu-threads N: the math threads a measuring command runs the models on (default: all cores)."""
    parser.add_argument("--cpu-threads", type=int, default=None, help="math threads (default: all cores)")


def settings_from_args(args: argparse.Namespace) -> WorkerSettings:
    overrides = {name: getattr(args, name, None) for name in SETTING_FLAGS}
    config = getattr(args, "config", None) or env_config_file()
    try:
        settings = load_settings(config, **overrides)
    except ValidationError as exc:
        problems = "; ".join(
            ": ".join(filter(None, (".".join(map(str, e["loc"])), e["msg"].removeprefix("Value error, "))))
            for e in exc.errors()
        )
        raise ConfigurationError(f"invalid settings: {problems}") from None
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    # Before logging is configured these go to stderr as bare lines (logging's last resort handler).
    http = settings.sections.http
    serves_api = http.http_port > 0 and (getattr(args, "command", None) == "serve" or http.http_api)
    for warning in environment_warnings(settings, os.environ, serves_api=serves_api):
        log.warning("%s", warning)
    return settings


def env_config_file() -> Path | None:
    # The entry point is the one place that reads the environment (pydantic-settings reads the rest).
    value = os.environ.get("SENTIMENT_CONFIG_FILE")
    return Path(value) if value else None


def settings_for_model(model: str, device: str | None, max_seq_len: int | None) -> WorkerSettings:
    """Settings for commands that name their model with their own flags (evaluate, promote): those three
    from the arguments, the rest from the environment / SENTIMENT_CONFIG_FILE like any other setting."""
    try:
        settings = load_settings(env_config_file(), model=model, device=device, max_seq_len=max_seq_len)
    except (ValidationError, ValueError) as exc:
        raise ConfigurationError(f"invalid settings: {exc}") from None
    for warning in environment_warnings(settings, os.environ, serves_api=False):
        log.warning("%s", warning)
    return settings


def evaluate_model(
    model: str, examples: list[Any], path: Path, *, device: str, max_seq_len: int | None, batch_size: int,
    static_probe: bool,
) -> Any:  # fmt: skip
    """`evaluate`'s report of `model` on labelled `examples` read from `path` (evaluate and promote)."""
    from worker.training.evaluate import evaluate

    sections = settings_for_model(model, device, max_seq_len).sections
    classifier = load_classifier_for(sections.model, sections.batching)
    return evaluate(
        classifier,
        examples,
        model_ref=model,
        data=str(path),
        batch_size=batch_size,
        static_probe=static_probe,
    )
