"""`sentiment-worker produce`: a JSONL / CSV / TXT file of reviews → the input topic."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from worker.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    Subparsers,
    add_settings_flags,
    settings_from_args,
)
from worker.tools.produce import produce_reviews, read_reviews


def register(subparsers: Subparsers) -> None:
    """Adds `produce`."""
    produce = subparsers.add_parser("produce", help="send a JSONL / CSV / TXT file of reviews to a topic")
    produce.add_argument("file", type=Path)
    add_settings_flags(produce, "bootstrap_servers", "input_topic")
    produce.add_argument("--topic", default=None, help="topic (default: the input topic)")
    produce.add_argument("--format", default="auto", choices=["auto", "jsonl", "csv", "txt"])
    produce.add_argument("--raw-text", action="store_true", help="txt: send lines as plain text values")
    produce.add_argument("--rate", type=float, default=None, help="messages per second (default: as fast)")
    produce.add_argument("--limit", type=int, default=None, help="send at most N reviews")
    produce.set_defaults(func=cmd_produce)


def cmd_produce(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    topic = args.topic or settings.input_topic
    records = read_reviews(args.file, args.format, raw_text=args.raw_text)
    report = produce_reviews(
        settings.librdkafka_common(),
        topic,
        records,
        rate_per_s=args.rate,
        limit=args.limit,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    print(
        f"produced {report.acknowledged} of {report.sent} reviews to {topic} in {report.seconds:.1f} s"
        + (f"; {report.failed} failed: {report.first_error}" if report.failed else ""),
        flush=True,
    )
    return EXIT_OK if report.failed == 0 else EXIT_FAILED
