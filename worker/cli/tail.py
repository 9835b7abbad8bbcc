"""`sentiment-worker tail`: results (or dead letters) as JSON lines or a table."""

from __future__ import annotations

import argparse
import json
from typing import Any

from worker.cli.common import EXIT_OK, Subparsers, add_settings_flags, settings_from_args
from worker.tools.broker_probe import require_broker
from worker.tools.registry_values import ValueReader
from worker.tools.tail import TailedRecord, format_table, result_row, tail_records


def register(subparsers: Subparsers) -> None:
    """Adds `tail`."""
    tail = subparsers.add_parser(
        "tail",
        help="print results (or dead letters) from the output topic; with SENTIMENT_SCHEMA_REGISTRY_URL "
        "set, Avro, JSON Schema and Protobuf values are decoded",
    )
    add_settings_flags(tail, "bootstrap_servers", "output_topic", "dlq_topic")
    tail.add_argument("--topic", default=None, help="topic (default: the output topic)")
    tail.add_argument("--dlq", action="store_true", help="read the dead-letter topic")
    tail.add_argument(
        "--output",
        choices=["json", "table"],
        default="json",
        help="json: one flat row per record (with its key); table: ID is the review's id (the input's id, "
        "else its input's topic/partition/offset), never the message key",
    )
    tail.add_argument("--from-end", action="store_true", help="only new records")
    tail.add_argument("--max-messages", type=int, default=None)
    tail.add_argument("--idle-exit-s", type=float, default=5.0, help="stop after S seconds without records")
    tail.set_defaults(func=cmd_tail)


def cmd_tail(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    kafka, registry = settings.sections.kafka, settings.sections.registry
    topic = args.topic or (kafka.dlq_topic if args.dlq else kafka.output_topic)
    require_broker(kafka, settings.sections.security, "Nothing was read.")
    records = tail_records(
        settings.librdkafka_common(),
        topic,
        from_beginning=not args.from_end,
        max_messages=args.max_messages,
        idle_exit_s=args.idle_exit_s,
    )
    reader = ValueReader(registry) if registry.schema_registry_url else None

    def row(record: TailedRecord) -> dict[str, Any]:
        # With a registry: values in its wire format (Avro, JSON Schema, Protobuf) are decoded first.
        decoded = reader.fields(record.value) if reader is not None else None
        return result_row(record, decoded, text_field=registry.text_field, id_field=registry.id_field)

    if args.output == "table":
        rows = [row(record) for record in records]
        print(format_table(rows))
        print(f"{len(rows)} records from {topic}")
        return EXIT_OK
    for record in records:
        print(json.dumps(row(record), ensure_ascii=False), flush=True)
    return EXIT_OK
