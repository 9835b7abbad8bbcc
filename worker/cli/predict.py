"""`sentiment-worker predict`: one review per stdin line → one JSON result per stdout line, no Kafka."""

from __future__ import annotations

import argparse
import json
import sys

from worker.cli.common import (
    EXIT_OK,
    Subparsers,
    add_settings_flags,
    configure_logging,
    load_model,
    settings_from_args,
)


def register(subparsers: Subparsers) -> None:
    """Adds `predict`."""
    predict = subparsers.add_parser(
        "predict", help="one review per stdin line → one JSON result per stdout line"
    )
    predict.add_argument("--model", required=True, help="model directory or PaddleNLP name")
    predict.add_argument("--device", default="auto", choices=["gpu", "cpu", "auto"])
    predict.add_argument("--batch-size", type=int, default=32)
    add_settings_flags(predict, "backend", "tokenizer", "long_text")
    predict.set_defaults(func=cmd_predict)


def cmd_predict(args: argparse.Namespace) -> int:
    from worker.tools.predict import predict_lines

    configure_logging("WARNING")
    classifier, _ = load_model(settings_from_args(args))
    for row in predict_lines(classifier, sys.stdin, max_batch_size=args.batch_size):
        sys.stdout.write(json.dumps(row, ensure_ascii=False) + "\n")
    sys.stdout.flush()
    return EXIT_OK
