"""`sentiment-worker record`: scrape a worker's /metrics periodically into a JSON-lines recording (`report`
draws it)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from worker.bench.report import record
from worker.cli.common import EXIT_OK, Subparsers
from worker.errors import ConfigurationError, OperationError


def register(subparsers: Subparsers) -> None:
    """Adds `record`."""
    rec = subparsers.add_parser(
        "record", help="scrape a worker's /metrics periodically into a JSONL recording"
    )
    rec.add_argument("--url", default="http://127.0.0.1:9108/metrics", help="the worker's /metrics URL")
    rec.add_argument("--interval-s", type=float, default=1.0, help="seconds between scrapes")
    rec.add_argument("--duration-s", type=float, required=True, help="how long to record")
    rec.add_argument("--out", type=Path, required=True, help="recording file (JSON lines)")
    rec.set_defaults(func=cmd_record)


def cmd_record(args: argparse.Namespace) -> int:
    if args.interval_s <= 0 or args.duration_s <= 0:
        raise ConfigurationError("--interval-s and --duration-s must be positive")
    written = record(
        args.url,
        args.out,
        interval_s=args.interval_s,
        duration_s=args.duration_s,
        log=lambda line: print(line, file=sys.stderr, flush=True),
    )
    print(f"{written} scrapes of {args.url} → {args.out}", flush=True)
    if written == 0:
        raise OperationError(f"no scrape of {args.url} succeeded; is the worker running there?")
    return EXIT_OK
