"""`sentiment-worker` commands. Thin: parse flags, build the settings once, call into the modules."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from pydantic import ValidationError

from worker.config import WorkerSettings, load_settings

log = logging.getLogger("worker")

# Modules that add sub-commands: each has `register(subparsers, add_settings_flags, settings_from_args)`
# and sets `func` on its parsers (returning an exit code; raise CommandError for user-fixable failures).
COMMAND_MODULES: tuple[str, ...] = (
    "worker.lag",
    "worker.tuning",
    "worker.bench",
    "worker.report",
    "worker.model.train_commands",
    "worker.model.commands",
)

EXIT_OK, EXIT_FAILED, EXIT_CONFIG = 0, 1, 2
OUTPUT_TOPIC_MAX_MESSAGE_BYTES = 2 * 1024 * 1024


class CommandError(Exception):
    """A failure the user can fix; printed without a traceback, exit code attached."""

    def __init__(self, message: str, exit_code: int = EXIT_CONFIG) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# ----- settings from flags -----
_SETTING_FLAGS = {
    "bootstrap_servers": "Kafka bootstrap servers (SENTIMENT_BOOTSTRAP_SERVERS)",
    "input_topic": "input topic (SENTIMENT_INPUT_TOPIC)",
    "output_topic": "results topic (SENTIMENT_OUTPUT_TOPIC)",
    "dlq_topic": "dead-letter topic (SENTIMENT_DLQ_TOPIC)",
    "group_id": "consumer group (SENTIMENT_GROUP_ID)",
    "model": "model directory or PaddleNLP name (SENTIMENT_MODEL)",
    "device": "gpu | cpu | auto (SENTIMENT_DEVICE)",
    "http_port": "port of /metrics /healthz /readyz, 0 = off (SENTIMENT_HTTP_PORT)",
    "input_format": "json | text (SENTIMENT_INPUT_FORMAT)",
    "backend": "auto | dynamic | static (SENTIMENT_BACKEND)",
    "tokenizer": "auto | fast | slow (SENTIMENT_TOKENIZER)",
    "long_text": "truncate | head_tail | chunk (SENTIMENT_LONG_TEXT)",
}


def _add_settings_flags(parser: argparse.ArgumentParser, *names: str) -> None:
    parser.add_argument("--config", type=Path, default=None, help="settings file (JSON or TOML)")
    for name in names:
        kind: Callable[[str], Any] = int if name == "http_port" else str
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=kind, help=_SETTING_FLAGS[name])


def _settings(args: argparse.Namespace) -> WorkerSettings:
    overrides = {name: getattr(args, name, None) for name in _SETTING_FLAGS}
    config = getattr(args, "config", None) or _env_config_file()
    try:
        return load_settings(config, **overrides)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in exc.errors()
        )
        raise CommandError(f"invalid settings: {problems}") from None
    except ValueError as exc:
        raise CommandError(str(exc)) from None


def _env_config_file() -> Path | None:
    # The entry point is the one place that reads the environment (pydantic-settings reads the rest).
    value = os.environ.get("SENTIMENT_CONFIG_FILE")
    return Path(value) if value else None


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )
    # Paddle's import-time notices (ccache, distutils) say nothing about this worker.
    warnings.filterwarnings("ignore", category=UserWarning, module=r"paddle\..*|_distutils_hack")
    if level != "DEBUG":
        _quiet_paddlenlp()


def _quiet_paddlenlp() -> None:
    """PaddleNLP logs every file it loads at INFO through its own logger; keep warnings only."""
    from paddlenlp.utils.log import logger as paddlenlp_logger

    paddlenlp_logger.set_level("WARNING")


# ----- commands -----
def cmd_run(args: argparse.Namespace) -> int:
    from worker.app import SentimentWorker, StartupError

    settings = _settings(args)
    _configure_logging(settings.log_level)
    stop = threading.Event()
    reinstall = _install_stop_handlers(stop.set)  # before the model loads: a signal then stops it at once
    classifier, model_ref = _load_model(settings)
    reinstall()  # loading Paddle replaced them
    worker = SentimentWorker(settings, classifier, model_ref, stop=stop)
    try:
        summary = worker.run(max_messages=args.max_messages, idle_exit_s=args.idle_exit_s)
    except StartupError as exc:
        raise CommandError(str(exc)) from None
    print(
        json.dumps(
            {
                "stopped": summary.stop_reason,
                "consumed": summary.consumed,
                "results": summary.results,
                "dead_letters": summary.dead_letters,
                "dead_letters_by_kind": summary.dead_letters_by_kind,
                "seconds": round(summary.seconds, 2),
                "messages_per_second": round(summary.messages_per_second, 1),
            },
            ensure_ascii=False,
        ),
        flush=True,
    )
    return EXIT_OK


def _install_stop_handlers(request_stop: Callable[[], None]) -> Callable[[], None]:
    """SIGTERM/SIGINT: stop cleanly (handler only sets an event); a second signal exits at once.

    Returns a function that installs the same handlers again (Paddle installs its own when it loads).
    """
    received: list[int] = []

    def handler(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)
        if len(received) > 1:
            os._exit(128 + signum)
        request_stop()

    def install() -> None:
        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    install()
    return install


def _load_model(
    model: str | WorkerSettings, device: str | None = None, max_seq_len: int | None = None
) -> tuple[Any, Any]:
    """The classifier and its ModelRef, built as the settings say: model, device, max_seq_len, backend
    (dynamic/static), tokenizer, long_text, cpu_threads, FP16/TensorRT. Given WorkerSettings, all of it
    comes from them; given a model name (callers with their own --model/--device flags), those three come
    from the arguments and the rest from the environment / config file like any other setting."""
    from schemas.sentiment_result import ModelRef
    from worker.model.device import DeviceUnavailableError, activate, choose_device
    from worker.model.loading import InferenceOptions, ModelLoadError, load_classifier

    if isinstance(model, WorkerSettings):
        settings = model
    else:
        try:
            settings = load_settings(_env_config_file(), model=model, device=device, max_seq_len=max_seq_len)
        except (ValidationError, ValueError) as exc:
            raise CommandError(f"invalid settings: {exc}") from None
    try:
        choice = choose_device(settings.device)
    except DeviceUnavailableError as exc:
        raise CommandError(f"device: {exc}") from None
    log.info("device %s (%s)", choice.paddle_device, choice.reason)
    activate(choice)
    try:
        classifier = load_classifier(
            settings.model,
            choice,
            max_seq_len=settings.max_seq_len,
            options=InferenceOptions.from_settings(settings),
        )
    except ModelLoadError as exc:
        raise CommandError(f"model: {exc}") from None
    log.info("model %r", classifier)
    return classifier, ModelRef(name=classifier.name, version=classifier.version)


def cmd_predict(args: argparse.Namespace) -> int:
    from worker.predict import predict_lines

    _configure_logging("WARNING")
    classifier, _ = _load_model(_settings(args))
    for row in predict_lines(classifier, sys.stdin, max_batch_size=args.batch_size):
        sys.stdout.write(json.dumps(row, ensure_ascii=False) + "\n")
    sys.stdout.flush()
    return EXIT_OK


def cmd_topics_create(args: argparse.Namespace) -> int:
    from worker.topics import TopicAdminError, create_topics

    settings = _settings(args)
    conf = settings.librdkafka_common()
    try:
        outcome = create_topics(conf, [settings.input_topic], partitions=args.partitions)
        # A dead letter carries its input's value plus headers, so the output topics accept larger records
        # than the input topic's default (1 MiB); larger ones still become value-less dead letters.
        outcome |= create_topics(
            conf,
            [settings.output_topic, settings.dlq_topic],
            partitions=args.partitions,
            config={"max.message.bytes": str(OUTPUT_TOPIC_MAX_MESSAGE_BYTES)},
        )
    except TopicAdminError as exc:
        raise CommandError(str(exc), EXIT_FAILED) from None
    for name, what in outcome.items():
        print(f"{name}: {what}")
    return EXIT_OK


def cmd_produce(args: argparse.Namespace) -> int:
    from worker.feed import FeedFileError, produce_reviews, read_reviews

    settings = _settings(args)
    topic = args.topic or settings.input_topic
    try:
        records = read_reviews(args.file, args.format, raw_text=args.raw_text)
        report = produce_reviews(
            settings.librdkafka_common(),
            topic,
            records,
            rate_per_s=args.rate,
            limit=args.limit,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
        )
    except FeedFileError as exc:
        raise CommandError(str(exc)) from None
    print(
        f"produced {report.acknowledged} of {report.sent} reviews to {topic} in {report.seconds:.1f} s"
        + (f"; {report.failed} failed: {report.first_error}" if report.failed else ""),
        flush=True,
    )
    return EXIT_OK if report.failed == 0 else EXIT_FAILED


def cmd_tail(args: argparse.Namespace) -> int:
    from worker.tail import TailError, format_table, result_row, tail_records

    settings = _settings(args)
    topic = args.topic or (settings.dlq_topic if args.dlq else settings.output_topic)
    records = tail_records(
        settings.librdkafka_common(),
        topic,
        from_beginning=not args.from_end,
        max_messages=args.max_messages,
        idle_exit_s=args.idle_exit_s,
    )
    try:
        if args.output == "table":
            rows = [result_row(record) for record in records]
            print(format_table(rows))
            print(f"{len(rows)} records from {topic}")
            return EXIT_OK
        for record in records:
            print(json.dumps(result_row(record), ensure_ascii=False), flush=True)
    except TailError as exc:
        raise CommandError(str(exc), EXIT_FAILED) from None
    return EXIT_OK


def cmd_doctor(args: argparse.Namespace) -> int:
    from worker.doctor import run_checks

    settings = _settings(args)
    checks = run_checks(settings)
    for check in checks:
        print(f"[{check.verdict:4}] {check.name}: {check.detail}")
    failed = [c for c in checks if c.verdict == "FAIL"]
    print(f"{len(checks) - len(failed)}/{len(checks)} checks passed")
    return EXIT_FAILED if failed else EXIT_OK


# ----- parser -----
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sentiment-worker", description="Label a Kafka stream of Chinese reviews with an ERNIE model."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="consume, label and publish until stopped")
    _add_settings_flags(run, *_SETTING_FLAGS)
    run.add_argument("--max-messages", type=int, default=None, help="stop after N inputs are done")
    run.add_argument("--idle-exit-s", type=float, default=None, help="stop after S seconds without input")
    run.set_defaults(func=cmd_run)

    produce = sub.add_parser("produce", help="send a JSONL / CSV / TXT file of reviews to a topic")
    produce.add_argument("file", type=Path)
    _add_settings_flags(produce, "bootstrap_servers", "input_topic")
    produce.add_argument("--topic", default=None, help="topic (default: the input topic)")
    produce.add_argument("--format", default="auto", choices=["auto", "jsonl", "csv", "txt"])
    produce.add_argument("--raw-text", action="store_true", help="txt: send lines as plain text values")
    produce.add_argument("--rate", type=float, default=None, help="messages per second (default: as fast)")
    produce.add_argument("--limit", type=int, default=None, help="send at most N reviews")
    produce.set_defaults(func=cmd_produce)

    tail = sub.add_parser("tail", help="print results (or dead letters) from the output topic")
    _add_settings_flags(tail, "bootstrap_servers", "output_topic", "dlq_topic")
    tail.add_argument("--topic", default=None, help="topic (default: the output topic)")
    tail.add_argument("--dlq", action="store_true", help="read the dead-letter topic")
    tail.add_argument("--output", choices=["json", "table"], default="json")
    tail.add_argument("--from-end", action="store_true", help="only new records")
    tail.add_argument("--max-messages", type=int, default=None)
    tail.add_argument("--idle-exit-s", type=float, default=5.0, help="stop after S seconds without records")
    tail.set_defaults(func=cmd_tail)

    predict = sub.add_parser("predict", help="one review per stdin line → one JSON result per stdout line")
    predict.add_argument("--model", required=True, help="model directory or PaddleNLP name")
    predict.add_argument("--device", default="auto", choices=["gpu", "cpu", "auto"])
    predict.add_argument("--batch-size", type=int, default=32)
    _add_settings_flags(predict, "backend", "tokenizer", "long_text")
    predict.set_defaults(func=cmd_predict)

    topics = sub.add_parser("topics", help="manage the worker's topics")
    topics_sub = topics.add_subparsers(dest="topics_command", required=True)
    create = topics_sub.add_parser("create", help="create the input, output and dead-letter topics")
    _add_settings_flags(create, "bootstrap_servers", "input_topic", "output_topic", "dlq_topic")
    create.add_argument("--partitions", type=int, default=3)
    create.set_defaults(func=cmd_topics_create)

    doctor = sub.add_parser("doctor", help="check Paddle, device, model and broker, each with a verdict")
    _add_settings_flags(doctor, *_SETTING_FLAGS)
    doctor.set_defaults(func=cmd_doctor)

    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(sub, _add_settings_flags, _settings)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except CommandError as exc:
        print(f"sentiment-worker {args.command}: error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - last resort: one clear line, details in the log
        log.error("unexpected failure", exc_info=True)
        print(
            f"sentiment-worker {args.command}: failed: {type(exc).__name__}: {exc}",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
