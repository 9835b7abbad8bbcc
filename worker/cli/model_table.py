"""`sentiment-worker model-table`: held-out accuracy, macro-F1, ECE, static-backend CPU throughput and size of
each model, measured in one run on the same held-out reviews (the README's model table)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from worker.cli.common import (
    EXIT_OK,
    Subparsers,
    add_cpu_threads_flag,
    add_model_dirs_flag,
    env_config_file,
    load_settings,
)
from worker.config import WorkerSettings
from worker.errors import ConfigurationError
from worker.runtime.logs import configure_logging
from worker.runtime.process import use_all_cores


def broker_settings(bootstrap_servers: str) -> WorkerSettings:
    """The environment's settings (security, client options) with this broker."""
    try:
        return load_settings(env_config_file(), bootstrap_servers=bootstrap_servers)
    except ValueError as exc:
        raise ConfigurationError(f"invalid settings: {exc}") from None


def register(subparsers: Subparsers) -> None:
    """Adds `model-table`."""
    parser = subparsers.add_parser(
        "model-table",
        help="accuracy, macro-F1, ECE, CPU throughput and size of each model, one run (the README's table)",
    )
    add_model_dirs_flag(parser, "a training directory")
    parser.add_argument(
        "--heldout", type=Path, default=None, help="held-out file for all (default: the first model's)"
    )
    parser.add_argument("--texts", type=int, default=2048, help="corpus reviews per timed pass")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per model (median reported)")
    add_cpu_threads_flag(parser)
    parser.add_argument(
        "--bootstrap-servers",
        default=None,
        help="a broker: each served form also drains a backlog through a worker process (end-to-end "
        "reviews/s and peak RSS columns)",
    )
    parser.add_argument("--e2e-messages", type=int, default=2000, help="reviews per end-to-end drain")
    parser.add_argument("--json", action="store_true", help="rows as JSON instead of a table")
    parser.set_defaults(func=cmd_model_table)


def cmd_model_table(args: argparse.Namespace) -> int:
    use_all_cores()
    from worker.bench.model_table import EndToEnd, format_model_table, model_table, rows_as_json

    configure_logging("WARNING")
    try:
        rows = model_table(
            args.model,
            heldout=args.heldout,
            texts=args.texts,
            repeats=args.repeats,
            cpu_threads=args.cpu_threads,
            end_to_end=EndToEnd(broker_settings(args.bootstrap_servers), args.e2e_messages)
            if args.bootstrap_servers
            else None,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
        )
    except (FileNotFoundError, ValueError, KeyError) as exc:
        raise ConfigurationError(str(exc)) from None
    print(json.dumps(rows_as_json(rows)) if args.json else format_model_table(rows), flush=True)
    return EXIT_OK
