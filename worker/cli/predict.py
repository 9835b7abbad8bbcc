"""`sentiment-worker predict`: one review per line (a file or stdin) → one JSON result per stdout line, no
Kafka; the worker's pipelined path, with a progress bar on stderr for a file."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from worker.cli.common import (
    EXIT_OK,
    Subparsers,
    add_settings_flags,
    configure_logging,
    load_model,
    settings_from_args,
)
from worker.errors import ConfigurationError


def register(subparsers: Subparsers) -> None:
    """Adds `predict`."""
    predict = subparsers.add_parser(
        "predict", help="one review per line (FILE or stdin) → one JSON result per stdout line"
    )
    predict.add_argument(
        "input", nargs="?", type=Path, default=None, help="a file of reviews (default: stdin)"
    )
    predict.add_argument("--model", required=True, help="model directory or PaddleNLP name")
    predict.add_argument("--device", default="auto", choices=["gpu", "cpu", "auto"])
    predict.add_argument("--batch-size", type=int, default=32)
    predict.add_argument("--max-batch-tokens", type=int, default=4096, help="padded tokens per model call")
    predict.add_argument("--no-progress", action="store_true", help="no progress bar for a file input")
    add_settings_flags(predict, "backend", "tokenizer", "long_text")
    predict.set_defaults(func=cmd_predict)


def cmd_predict(args: argparse.Namespace) -> int:
    from worker.tools.predict import FileLines, ProgressBar, predict_lines

    configure_logging("WARNING")
    if args.input is not None and not args.input.is_file():
        raise ConfigurationError(f"no such file: {args.input}")
    classifier, _ = load_model(settings_from_args(args))
    source = FileLines(args.input) if args.input is not None else None
    bar = ProgressBar(source.total_bytes, sys.stderr) if source is not None and not args.no_progress else None

    def progress(lines: int) -> None:
        if bar is not None and source is not None:
            bar.update(source.bytes_read, lines)

    rows = predict_lines(
        classifier,
        source if source is not None else sys.stdin,
        max_batch_size=args.batch_size,
        max_batch_tokens=args.max_batch_tokens,
        on_chunk=progress,
    )
    write = sys.stdout.write
    for row in rows:
        write(json.dumps(row, ensure_ascii=False) + "\n")
    sys.stdout.flush()
    if bar is not None and source is not None:
        bar.finish(source.bytes_read)
    return EXIT_OK
