"""`sentiment-worker evaluate`: accuracy, macro-F1, per-class P/R, confusion, ECE and throughput of a model on
labelled data; `--compare`: two models on the same reviews, side by side (the promotion gate)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from worker.cli.common import EXIT_FAILED, EXIT_OK, Subparsers, add_device_flag, evaluate_model
from worker.errors import ConfigurationError
from worker.runtime.logs import configure_logging
from worker.runtime.process import use_all_cores


def register(subparsers: Subparsers) -> None:
    """Adds `evaluate`."""
    evaluate = subparsers.add_parser(
        "evaluate", help="accuracy, macro-F1, per-class P/R, confusion, ECE and throughput on labelled data"
    )
    evaluate.add_argument("--model", required=True, help="model directory or PaddleNLP name")
    source = evaluate.add_mutually_exclusive_group(required=True)
    source.add_argument("--data", type=Path, help=".csv or .jsonl with text,label (0/1 or negative/positive)")
    source.add_argument("--heldout", action="store_true", help="the model directory's heldout.jsonl")
    add_device_flag(evaluate)
    evaluate.add_argument("--batch-size", type=int, default=32)
    evaluate.add_argument("--max-seq-len", type=int, default=None, help="default: the model's")
    evaluate.add_argument("--limit", type=int, default=None, help="evaluate only the first N reviews")
    evaluate.add_argument("--no-static", action="store_true", help="skip the static-backend speed probe")
    evaluate.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    evaluate.add_argument(
        "--compare",
        default=None,
        metavar="INCUMBENT",
        help="the model this one would replace: both are evaluated on the same reviews, side by side; "
        "exit 1 when --model is worse by more than --margin (the promotion gate)",
    )
    evaluate.add_argument(
        "--margin", type=float, default=0.005, help="--compare: allowed loss in accuracy and macro-F1 (0.005)"
    )
    evaluate.add_argument(
        "--ece-margin", type=float, default=0.02, help="--compare: allowed rise in calibration error (0.02)"
    )
    evaluate.set_defaults(func=cmd_evaluate)


def cmd_evaluate(args: argparse.Namespace) -> int:
    use_all_cores()  # before Paddle loads (below)
    from worker.training.corpus import load_labeled_rows
    from worker.training.evaluate import HELDOUT_FILE, Comparison, format_comparison, format_report

    configure_logging("WARNING")
    path = Path(args.model) / HELDOUT_FILE if args.heldout else args.data
    if args.heldout and not path.is_file():
        raise ConfigurationError(
            f"{path} not found: --heldout needs a model directory made by `sentiment-worker train`"
        )
    examples, counts = load_labeled_rows(path, skip_bad_labels=True)
    read = counts.line()
    if args.limit is not None and args.limit < len(examples):
        examples = examples[: args.limit]
        read += f"; the first {args.limit} evaluated (--limit)"
    measure = {
        "device": args.device, "max_seq_len": args.max_seq_len, "batch_size": args.batch_size,
        "static_probe": not args.no_static and args.compare is None,
    }  # fmt: skip
    report = evaluate_model(args.model, examples, path, **measure)
    if args.compare is not None:
        incumbent = evaluate_model(args.compare, examples, path, **measure)
        comparison = Comparison(report, incumbent, args.margin, args.ece_margin)
        if args.json:
            print(json.dumps({**comparison.to_json(), "rows": read}, ensure_ascii=False), flush=True)
        else:
            print(f"{path}: {read}", flush=True)
            print(format_comparison(comparison), flush=True)
        return EXIT_FAILED if comparison.regressions else EXIT_OK
    if args.json:
        print(json.dumps({**report.to_json(), "rows": read}, ensure_ascii=False), flush=True)
    else:
        print(f"{path}: {read}", flush=True)
        print(format_report(report), flush=True)
    return EXIT_OK
