"""`sentiment-worker lag`: the consumer group's lag per partition, read from the broker."""

from __future__ import annotations

import argparse
import json

from worker.cli.common import EXIT_OK, Subparsers, add_settings_flags, settings_from_args
from worker.tools.broker_probe import require_broker
from worker.tools.lag import format_table, measure_lag


def register(subparsers: Subparsers) -> None:
    """Adds `lag`."""
    parser = subparsers.add_parser(
        "lag", help="per-partition lag of the consumer group: offsets, messages, seconds, owner"
    )
    add_settings_flags(parser, "bootstrap_servers", "input_topic", "group_id")
    parser.add_argument("--topic", default=None, help="topic (default: the input topic)")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    parser.add_argument("--timeout-s", type=float, default=10.0, help="bound on each broker request")
    parser.set_defaults(func=cmd_lag)


def cmd_lag(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    kafka = settings.sections.kafka
    topic = args.topic or kafka.input_topic
    require_broker(kafka, settings.sections.security, "Nothing was measured.", timeout_s=args.timeout_s)
    lag = measure_lag(settings.librdkafka_common(), kafka.group_id, topic, timeout_s=args.timeout_s)
    if args.json:
        print(json.dumps(lag.to_json(), ensure_ascii=False), flush=True)
    else:
        print(format_table(lag), flush=True)
    return EXIT_OK
