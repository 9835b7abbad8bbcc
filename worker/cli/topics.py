"""`sentiment-worker topics create|check|list|delete`: the worker's topics, as kafka-topics manages them
(`check`: the start-up checks `run` makes; `create --fix` settles them with the admin API);
`topics acls`: the ACLs a worker's principal needs (kafka-acls.sh lines, or created with --apply)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from worker.cli.common import EXIT_FAILED, EXIT_OK, Subparsers, add_settings_flags, settings_from_args
from worker.config import KafkaSettings
from worker.errors import ConfigurationError, OperationError
from worker.tools.acls import apply_acls, operator_acls, worker_acls
from worker.tools.broker_probe import require_broker
from worker.tools.topics import (
    OUTPUT_TOPIC_MAX_MESSAGE_BYTES,
    TopicConsumer,
    add_partitions,
    alter_topic_configs,
    check_worker_topics,
    consumers_of,
    create_topics,
    delete_topics,
    describe_topics,
    list_topic_names,
    matching_topics,
)

_TOPIC_HELP = "a regular expression the whole topic name must match (repeatable), as kafka-topics --topic"


def register(subparsers: Subparsers) -> None:
    """Adds `topics create`, `topics list`, `topics delete` and `topics acls`."""
    topics = subparsers.add_parser(
        "topics", help="create, list or delete the worker's topics; the ACLs its principal needs"
    )
    topics_sub = topics.add_subparsers(dest="topics_command", required=True)
    create = topics_sub.add_parser(
        "create",
        help="create the input, output and dead-letter topics, and the group's control and status topics",
    )
    add_settings_flags(create, "bootstrap_servers", "input_topic", "output_topic", "dlq_topic", "group_id")
    create.add_argument(
        "--partitions",
        type=int,
        default=None,
        help="partitions of the topics it creates (default 3); with --fix: raise existing topics to "
        "this many",
    )
    create.add_argument(
        "--fix",
        action="store_true",
        help="also settle what `topics check` finds on existing topics, with the admin API (dead-letter "
        "max.message.bytes, cleanup.policy, retention.ms; partitions only with --partitions)",
    )
    create.set_defaults(func=cmd_topics_create)
    check = topics_sub.add_parser(
        "check",
        help="every start-up check `run` makes on the topics (limits, partitions, compaction, retention)",
    )
    add_settings_flags(check, "bootstrap_servers", "input_topic", "output_topic", "dlq_topic", "group_id")
    check.add_argument("--replicas", type=int, default=None, help="how many workers will share the group")
    check.set_defaults(func=cmd_topics_check)
    acls = topics_sub.add_parser(
        "acls", help="the ACLs a worker's principal needs (kafka-acls.sh lines, or --apply them)"
    )
    add_settings_flags(acls, "bootstrap_servers", "input_topic", "output_topic", "dlq_topic", "group_id")
    acls.add_argument("--principal", required=True, help="the worker's principal, e.g. User:worker")
    acls.add_argument(
        "--role",
        choices=["worker", "operator"],
        default="worker",
        help="worker: what a replica needs; operator: what `models status|shadow|promote` needs",
    )
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

    listing = topics_sub.add_parser("list", help="the cluster's topics, one per line (kafka-topics --list)")
    add_settings_flags(listing, "bootstrap_servers")
    listing.add_argument("--topic", action="append", default=[], metavar="REGEX", help=_TOPIC_HELP)
    listing.add_argument("--exclude-internal", action="store_true", help="leave out __consumer_offsets etc.")
    listing.add_argument("--partitions", action="store_true", help="print each topic's partition count")
    listing.set_defaults(func=cmd_topics_list)

    delete = topics_sub.add_parser(
        "delete",
        help="delete the input, output and dead-letter topics (or --topic REGEX); asks for --yes",
        description="Without --topic: the input, output and dead-letter topics of the settings. Without "
        "--yes it only says what it would delete (exit 1). Topics in use are refused unless --force: those "
        "an active consumer group member is assigned, and the output and dead-letter topics while the "
        "settings' group consumes their input topic.",
    )
    add_settings_flags(delete, "bootstrap_servers", "input_topic", "output_topic", "dlq_topic")
    delete.add_argument("--topic", action="append", default=[], metavar="REGEX", help=_TOPIC_HELP)
    delete.add_argument("--yes", action="store_true", help="really delete them")
    delete.add_argument("--force", action="store_true", help="delete even topics that are in use")
    delete.add_argument("--if-exists", action="store_true", help="no error when a topic does not exist")
    delete.set_defaults(func=cmd_topics_delete)


def cmd_topics_create(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    require_broker(settings.sections.kafka, settings.sections.security, "Nothing was done.")
    kafka = settings.sections.kafka
    conf = settings.librdkafka_common()
    partitions = args.partitions or 3
    outcome = create_topics(conf, [kafka.input_topic], partitions=partitions)
    # A dead letter carries its input's value plus headers, so the output topics accept larger records
    # than the input topic's default (1 MiB), as `run` checks at start-up; larger ones still become dead
    # letters without key and value.
    outcome |= create_topics(
        conf,
        [kafka.output_topic, kafka.dlq_topic],
        partitions=partitions,
        config={"max.message.bytes": str(OUTPUT_TOPIC_MAX_MESSAGE_BYTES)},
    )
    # The group's control topic holds one desired state: compacted (the newest kept forever), one partition
    # (one order). The status topic holds each replica's latest report: compacted, and old segments rolled
    # daily so a replica gone long ago is compacted away with its last report kept.
    live, group = settings.sections.live, kafka.group_id
    outcome |= create_topics(
        conf, [live.control_topic_of(group)], partitions=1, config={"cleanup.policy": "compact"}
    )
    outcome |= create_topics(
        conf,
        [live.status_topic_of(group)],
        partitions=1,
        config={"cleanup.policy": "compact", "segment.ms": str(24 * 3600 * 1000)},
    )
    for name, what in outcome.items():
        print(f"{name}: {what}")
    if args.fix:
        for name, what in fix_worker_topics(conf, kafka, args.partitions).items():
            print(f"{name}: {what}")
    return EXIT_OK


def fix_worker_topics(conf: dict[str, Any], kafka: KafkaSettings, partitions: int | None) -> dict[str, str]:
    """What `topics create --fix` changed: the configs the checks' findings name, and partitions up to
    `partitions` (only when given: more partitions move a key's later records to another partition)."""
    findings = check_worker_topics(conf, kafka)
    changes: dict[str, dict[str, str]] = {}
    for finding in findings:
        changes.setdefault(finding.topic, {}).update(finding.alter)
    done = alter_topic_configs(conf, changes)
    if partitions is not None:
        counts = describe_topics(conf, _worker_topics(kafka))
        raise_to = {
            name: partitions for name, count in counts.items() if count is not None and count < partitions
        }
        for name, what in add_partitions(conf, raise_to).items():
            done[name] = f"{done[name]}; {what}" if name in done else what
    if not done:
        return {"topics": "nothing to fix"}
    return done


def cmd_topics_check(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    require_broker(settings.sections.kafka, settings.sections.security, "Nothing was done.")
    kafka = settings.sections.kafka
    findings = check_worker_topics(settings.librdkafka_common(), kafka, replicas=args.replicas)
    print(f"# topics at {kafka.bootstrap_servers} (SENTIMENT_DLQ_SIZE_CHECK={kafka.dlq_size_check})")
    for finding in findings:
        print(f"[{_VERDICT[finding.severity]:4}] {finding.line()}")
    refused = [f for f in findings if f.severity == "refuse"]
    warned = [f for f in findings if f.severity == "warn"]
    print(
        f"{len(findings) - len(refused) - len(warned)}/{len(findings)} OK, {len(warned)} warnings, "
        f"{len(refused)} would stop `run`"
    )
    return EXIT_FAILED if refused else EXIT_OK


_VERDICT = {"ok": "OK", "warn": "WARN", "refuse": "FAIL"}


def cmd_topics_acls(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    if not args.principal.startswith("User:") or args.principal == "User:":
        raise ConfigurationError(f"--principal must look like User:NAME, got {args.principal!r}")
    kafka, delivery = settings.sections.kafka, args.delivery or settings.sections.delivery.delivery
    if args.role == "operator":
        rules = operator_acls(kafka, settings.sections.live)
    else:
        rules = worker_acls(kafka, delivery, settings.sections.live)
    if args.apply:
        created = apply_acls(settings.librdkafka_common(), args.principal, rules)
        print(f"{created} ACLs for {args.principal} in place ({delivery})")
        return EXIT_OK
    what = f"delivery={delivery}" if args.role == "worker" else "operator of the models"
    print(f"# {args.principal}, {what}: least privilege, nothing else")
    for rule in rules:
        print(rule.kafka_acls_line(args.principal, kafka.bootstrap_servers) + f"  # {rule.why}")
    return EXIT_OK


def cmd_topics_list(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    require_broker(settings.sections.kafka, settings.sections.security, "Nothing was done.")
    counts = list_topic_names(settings.librdkafka_common())
    names = matching_topics(list(counts), args.topic) if args.topic else list(counts)
    for name in names:
        if args.exclude_internal and name.startswith("__"):
            continue
        print(f"{name}\t{counts[name]}" if args.partitions else name)
    return EXIT_OK


def cmd_topics_delete(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    require_broker(settings.sections.kafka, settings.sections.security, "Nothing was done.")
    kafka = settings.sections.kafka
    conf = settings.librdkafka_common()
    existing = list_topic_names(conf)
    if args.topic:
        targets = matching_topics(list(existing), args.topic)
        missing = [] if targets else [" or ".join(args.topic)]
    else:
        wanted = _worker_topics(kafka)
        targets = [name for name in wanted if name in existing]
        missing = [name for name in wanted if name not in existing]
    if missing and not args.if_exists:
        raise OperationError(
            f"no topic {', '.join(missing)} (`sentiment-worker topics list` shows them; "
            "--if-exists ignores this)"
        )
    if not targets:
        print("nothing to delete")
        return EXIT_OK
    in_use = consumers_of(conf, [*targets, kafka.input_topic])
    # A worker consuming the settings' input topic writes to their output and dead-letter topics.
    workers = [c for c in in_use.get(kafka.input_topic, []) if c.group == kafka.group_id]
    busy = {name: in_use[name] for name in targets if name in in_use}
    for name in (kafka.output_topic, kafka.dlq_topic):
        if workers and name in targets:
            busy.setdefault(name, workers)
    if busy and not args.force:
        for name, consumers in busy.items():
            print(f"{name}: in use by {_who(consumers)}", file=sys.stderr)
        raise OperationError("refusing to delete topics in use (stop those consumers, or pass --force)")
    if not args.yes:
        for name in targets:
            print(f"would delete {name} ({existing[name]} partitions)")
        print("run again with --yes to delete them", file=sys.stderr)
        return EXIT_FAILED
    outcome = delete_topics(conf, targets)
    for name, what in outcome.items():
        print(f"{name}: {what}")
    return EXIT_OK


def _worker_topics(kafka: KafkaSettings) -> list[str]:
    return list(dict.fromkeys([kafka.input_topic, kafka.output_topic, kafka.dlq_topic]))


def _who(consumers: list[TopicConsumer]) -> str:
    return "; ".join(f"group {c.group} (client {c.client_id} on {c.host})" for c in consumers)
