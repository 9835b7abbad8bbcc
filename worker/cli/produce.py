"""`sentiment-worker produce`: a JSONL / CSV / TXT file of reviews → the input topic, the whole file or
nothing (or, with --skip-bad, its good rows), ending with the counts."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from worker.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    Subparsers,
    add_column_flags,
    add_settings_flags,
    settings_from_args,
)
from worker.config import REGISTRY_FORMATS, KafkaSettings, SecuritySettings
from worker.errors import ConfigurationError, OperationError
from worker.files.review_files import BadRow, ReviewFile
from worker.tools.broker_probe import require_broker
from worker.tools.produce import (
    FeedFileError,
    MessageFields,
    ProduceReport,
    check_file,
    feed_records,
    produce_reviews,
)
from worker.tools.registry_values import value_encoder, value_format


def register(subparsers: Subparsers) -> None:
    """Adds `produce`."""
    produce = subparsers.add_parser(
        "produce",
        help="send a JSONL / CSV / TXT file of reviews to a topic: all rows, or none when one is bad",
    )
    produce.add_argument("file", type=Path)
    add_settings_flags(produce, "bootstrap_servers", "input_topic")
    produce.add_argument("--topic", default=None, help="topic (default: the input topic)")
    produce.add_argument(
        "--format",
        default="auto",
        choices=["auto", "jsonl", "csv", "txt", "avro", "json_schema", "protobuf"],
        help="the file's format (auto: by its name), or the values' registry format (avro, json_schema, "
        "protobuf: "
        "each row written with --schema, registered under <topic>-value in SENTIMENT_SCHEMA_REGISTRY_URL; "
        "the file's format is then told by its name)",
    )
    produce.add_argument(
        "--schema",
        type=Path,
        default=None,
        help="Avro (.avsc), JSON Schema (.json) or Protobuf (.proto; its first message) file the values "
        "are written with (a registry format)",
    )
    add_column_flags(produce)
    produce.add_argument(
        "--map",
        action="append",
        default=[],
        metavar="COLUMN=FIELD",
        help="CSV: read COLUMN as FIELD (repeatable), e.g. --map 评论内容=content; with a registry format "
        "the columns go to the schema's fields of the same name (others are dropped, and named)",
    )
    produce.add_argument(
        "--skip-bad",
        action="store_true",
        help="send the good rows, naming each bad one (default: send nothing)",
    )
    produce.add_argument(
        "--from-line", type=int, default=1, help="start at this line (resume after a failed send)"
    )
    produce.add_argument("--raw-text", action="store_true", help="txt: send lines as plain text values")
    produce.add_argument("--rate", type=float, default=None, help="messages per second (default: as fast)")
    produce.add_argument("--limit", type=int, default=None, help="send at most N reviews")
    produce.set_defaults(func=cmd_produce)


def cmd_produce(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    s = settings.sections
    topic = args.topic or s.kafka.input_topic
    if args.from_line < 1:
        raise ConfigurationError(f"--from-line {args.from_line}: lines are numbered from 1")
    fmt = value_format(args.format, args.schema)
    file = ReviewFile(
        args.file,
        "auto" if args.format in REGISTRY_FORMATS else args.format,  # the file's own format, or by its name
        text_field=args.text_field,
        id_field=args.id_field,
        encoding=args.encoding,
        rename=_renames(args.map),
        max_text_chars=s.limits.max_text_chars,
        max_value_bytes=s.limits.max_value_bytes,
        max_json_depth=s.limits.max_json_depth,
    )
    fields = MessageFields(text=s.registry.text_field, id=s.registry.id_field)
    encode = value_encoder(s.registry, fmt, args.schema, topic) if fmt is not None else None
    if encode is not None:
        # A registry format: --text-field / --id-field name the schema's fields the text and id go to.
        fields = MessageFields(text=args.text_field or fields.text, id=args.id_field or fields.id)
        note = worker_fields_note(fields, s.registry.text_field, s.registry.id_field)
        if note:
            print(note, file=sys.stderr, flush=True)
    checked = check_file(file, fields, from_line=args.from_line, encode=encode)
    dropped = encode.dropped_note() if encode is not None else None
    if dropped:
        print(dropped, file=sys.stderr, flush=True)
    duplicates = file.duplicate_warning()
    if duplicates:
        print(duplicates, file=sys.stderr, flush=True)
    if checked.bad and not args.skip_bad:
        raise FeedFileError(file.name, None, checked.refusal(file.name))

    reachable(s.kafka, s.security, topic)

    def skipped(row: BadRow) -> None:
        print(f"skipped {row}", file=sys.stderr, flush=True)

    report = produce_reviews(
        settings.librdkafka_common(),
        topic,
        feed_records(
            file, fields, raw_text=args.raw_text, from_line=args.from_line, on_bad=skipped, encode=encode
        ),
        rate_per_s=args.rate,
        limit=args.limit,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    print(summary(file.name, topic, checked.read, len(checked.bad), report, args.limit), flush=True)
    return EXIT_OK if report.failed == 0 else EXIT_FAILED


def reachable(kafka: KafkaSettings, security: SecuritySettings, topic: str) -> None:
    """Before sending: a broker answers within the deadline every command keeps (one line when none does,
    librdkafka's retries kept out of sight), and `topic` exists (a producer would wait for it, or have the
    broker create it)."""
    metadata = require_broker(kafka, security, "Nothing was sent.")
    described = metadata.topics.get(topic)
    if described is None or described.error is not None:
        raise OperationError(
            f"topic {topic!r} does not exist at {kafka.bootstrap_servers}: create it (`sentiment-worker "
            f"topics create --bootstrap-servers {kafka.bootstrap_servers}`) or give --topic. Nothing was "
            "sent."
        )


def _renames(pairs: list[str]) -> dict[str, str]:
    renames: dict[str, str] = {}
    for pair in pairs:
        column, sep, name = pair.partition("=")
        if not sep or not column.strip() or not name.strip():
            raise ConfigurationError(f"--map {pair!r}: give COLUMN=FIELD, e.g. --map 评论内容=content")
        renames[column.strip()] = name.strip()
    return renames


def worker_fields_note(fields: MessageFields, text_field: str, id_field: str) -> str | None:
    """What the worker must be told when the values hold text and id under other names than it reads."""
    wrong = [
        f"SENTIMENT_{setting}={sent}"
        for setting, sent, read in (
            ("TEXT_FIELD", fields.text, text_field),
            ("ID_FIELD", fields.id, id_field),
        )
        if sent != read
    ]
    if not wrong:
        return None
    return (
        f"note: these values hold the text in `{fields.text}` and the id in `{fields.id}`, but the worker "
        f"reads `{text_field}` and `{id_field}`: run it with {' '.join(wrong)}"
    )


def summary(name: str, topic: str, read: int, skipped: int, report: ProduceReport, limit: int | None) -> str:
    """`reviews.csv → reviews: read 50, sent 46, skipped 4, failed 0 in 0.4 s`, and when some failed, what
    went and where to resume."""
    line = (
        f"{name} → {topic}: read {read}, sent {report.acknowledged}, skipped {skipped}, "
        f"failed {report.failed} in {report.seconds:.1f} s"
    )
    unsent = read - skipped - report.sent
    if limit is not None and unsent > 0:
        line += f"; {unsent} not sent (--limit {limit})"
    if report.failed:
        line += f"\nnot sent: {report.first_error}"
        if report.resume_line is not None:
            line += (
                f"\nevery row before line {report.resume_line} is on the topic; to send the rest, run again "
                f"with --from-line {report.resume_line}"
            )
            if report.delivered_after_resume:
                line += (
                    f" ({report.delivered_after_resume} rows after line {report.resume_line} did arrive and "
                    "would be sent twice)"
                )
    return line
