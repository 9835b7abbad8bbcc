"""`sentiment-worker topics create`: the input, output and dead-letter topics."""

from __future__ import annotations

import argparse

from worker.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    CommandError,
    Subparsers,
    add_settings_flags,
    settings_from_args,
)
from worker.tools.topics import OUTPUT_TOPIC_MAX_MESSAGE_BYTES, TopicAdminError, create_topics


def register(subparsers: Subparsers) -> None:
    """Adds `topics create`."""
    topics = subparsers.add_parser("topics", help="manage the worker's topics")
    topics_sub = topics.add_subparsers(dest="topics_command", required=True)
    create = topics_sub.add_parser("create", help="create the input, output and dead-letter topics")
    add_settings_flags(create, "bootstrap_servers", "input_topic", "output_topic", "dlq_topic")
    create.add_argument("--partitions", type=int, default=3)
    create.set_defaults(func=cmd_topics_create)


def cmd_topics_create(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
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
