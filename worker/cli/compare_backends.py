"""`sentiment-worker compare-backends`: each model × backend (dygraph, Paddle Inference fp32/INT8, ONNX
Runtime fp32/INT8): held-out accuracy, delta from fp32, model-only throughput, peak RSS; one run, medians."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from worker.cli.common import EXIT_OK, Subparsers, add_cpu_threads_flag, add_model_dirs_flag
from worker.errors import ConfigurationError
from worker.runtime.logs import configure_logging


def register(subparsers: Subparsers) -> None:
    """Adds `compare-backends`."""
    parser = subparsers.add_parser(
        "compare-backends",
        help="accuracy, its delta from fp32, model-only throughput and peak RSS of every backend per model",
    )
    add_model_dirs_flag(parser, "a training directory")
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="keep the exported and quantized forms here (default: temp)",
    )
    parser.add_argument("--texts", type=int, default=1024, help="corpus reviews per timed pass")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per backend (median reported)")
    parser.add_argument("--heldout-limit", type=int, default=None, help="first N held-out reviews only")
    parser.add_argument(
        "--method",
        dest="methods",
        action="append",
        choices=("ort-dynamic", "ort-static"),
        help="INT8 methods to measure (repeatable; default ort-dynamic)",
    )
    add_cpu_threads_flag(parser)
    parser.add_argument(
        "--record",
        action="store_true",
        help="write the fp32 measurement into each ONNX export in --work-dir (for SENTIMENT_BACKEND=auto)",
    )
    parser.add_argument("--json", action="store_true", help="rows as JSON instead of a table")
    parser.set_defaults(func=cmd_compare_backends)


def cmd_compare_backends(args: argparse.Namespace) -> int:
    from worker.bench.compare_backends import TableOptions, compare_backends, format_table, rows_as_json

    configure_logging("WARNING")
    if args.record and args.work_dir is None:
        raise ConfigurationError("--record needs --work-dir (the measured forms must be kept to be served)")
    options = TableOptions(
        texts=args.texts,
        repeats=args.repeats,
        heldout_limit=args.heldout_limit,
        methods=tuple(args.methods or ("ort-dynamic",)),
        cpu_threads=args.cpu_threads,
    )
    try:
        rows = compare_backends(
            args.model,
            work_dir=args.work_dir,
            options=options,
            record=args.record,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
        )
    except (FileNotFoundError, ValueError) as exc:
        raise ConfigurationError(str(exc)) from None
    print(json.dumps(rows_as_json(rows)) if args.json else format_table(rows), flush=True)
    return EXIT_OK
