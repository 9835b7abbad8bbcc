"""`sentiment-worker topics create`: the input, output and dead-letter topics; `topics acls`: the ACLs a
worker's principal needs (printed as kafka-acls.sh lines, or created with --apply)."""

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
from worker.tools.acls import AclError, apply_acls, worker_acls
from worker.tools.topics import OUTPUT_TOPIC_MAX_MESSAGE_BYTES, TopicAdminError, create_topics


def register(subparsers: Subparsers) -> None:
    """Adds `topics create` and `topics acls`."""
    topics = subparsers.add_parser("topics", help="manage the worker's topics")
    topics_sub = topics.add_subparsers(dest="topics_command", required=True)
    create = topics_sub.add_parser("create", help="create the input, output and dead-letter topics")
    add_settings_flags(create, "bootstrap_servers", "input_topic", "output_topic", "dlq_topic")
    create.add_argument("--partitions", type=int, default=3)
    create.set_defaults(func=cmd_topics_create)
    acls = topics_sub.add_parser(
        "acls", help="the ACLs a worker's principal needs (kafka-acls.sh lines, or --apply them)"
    )
    add_settings_flags(acls, "bootstrap_servers", "input_topic", "output_topic", "dlq_topic", "group_id")
    acls.add_argument("--principal", required=True, help="the worker's principal, e.g. User:worker")
    acls.add_argument(
        "--delivery",
        choices=["at_least_once", "exactly_once"],
        default=None,
        help="delivery mode (default: SENTIMENT_DELIVERY)",
    )
    acls.add_argument(
        "--apply",
        action="store_true",
        help="create them with the admin client, as the principal of these settings (an administrator)",
    )
    acls.set_defaults(func=cmd_topics_acls)


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


def cmd_topics_acls(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    if not args.principal.startswith("User:") or args.principal == "User:":
        raise CommandError(f"--principal must look like User:NAME, got {args.principal!r}")
    rules = worker_acls(settings, args.delivery)
    if args.apply:
        try:
            created = apply_acls(settings.librdkafka_common(), args.principal, rules)
        except AclError as exc:
            raise CommandError(str(exc), EXIT_FAILED) from None
        print(f"{created} ACLs for {args.principal} in place ({args.delivery or settings.delivery})")
        return EXIT_OK
    print(f"# {args.principal}, delivery={args.delivery or settings.delivery}: least privilege, nothing else")
    for rule in rules:
        print(rule.kafka_acls_line(args.principal, settings.bootstrap_servers) + f"  # {rule.why}")
    return EXIT_OK
