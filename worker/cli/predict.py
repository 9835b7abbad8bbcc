"""`sentiment-worker predict`: a TXT / CSV / JSONL file of reviews (or TXT lines on stdin) → one JSON
result per row on stdout, with its id, no Kafka; the worker's pipelined path, with a progress bar on stderr
for a file."""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path
from typing import BinaryIO

from worker.cli.common import EXIT_OK, Subparsers, add_column_flags, add_settings_flags, settings_from_args
from worker.errors import ConfigurationError
from worker.labelling.loading import load_model
from worker.runtime.logs import configure_logging
from worker.runtime.process import freeze_loaded_heap


def register(subparsers: Subparsers) -> None:
    """Adds `predict`."""
    predict = subparsers.add_parser(
        "predict", help="a TXT / CSV / JSONL file of reviews (or stdin) → one JSON result per row on stdout"
    )
    predict.add_argument(
        "input",
        nargs="?",
        type=Path,
        default=None,
        help="a file of reviews (default: stdin, a review per line)",
    )
    predict.add_argument(
        "--format",
        default="auto",
        choices=["auto", "jsonl", "csv", "txt"],
        help="default: by suffix; stdin: txt",
    )
    add_column_flags(predict)
    predict.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="most reviews per model call (default: 32; on a GPU none)",
    )
    predict.add_argument(
        "--max-batch-tokens",
        type=int,
        default=None,
        help="padded tokens per model call (default: 4096; on a GPU calibrated to its memory, as run)",
    )
    predict.add_argument("--no-progress", action="store_true", help="no progress bar for a file input")
    add_settings_flags(predict, "model", "device", "backend", "tokenizer", "long_text")
    predict.set_defaults(func=cmd_predict)


def cmd_predict(args: argparse.Namespace) -> int:
    from worker.files.predict import ProgressBar, predict_rows
    from worker.files.review_files import ReviewFile
    from worker.inference.engine import EngineOptions
    from worker.labelling.labeller import Labeller

    configure_logging("WARNING")
    if args.input is not None and not args.input.is_file():
        raise ConfigurationError(f"no such file: {args.input}")
    settings = settings_from_args(args)
    s = settings.sections
    source = ReviewFile(
        args.input,
        args.format,
        stream=_stdin_bytes() if args.input is None else None,
        text_field=args.text_field,
        id_field=args.id_field,
        encoding=args.encoding,
        max_text_chars=s.limits.max_text_chars,
        max_value_bytes=s.limits.max_value_bytes,
        max_json_depth=s.limits.max_json_depth,
    )
    loaded = load_model(s.model, s.batching)
    freeze_loaded_heap()
    sizes = {"max_batch_size": args.batch_size, "max_batch_tokens": args.max_batch_tokens}
    given = {name: value for name, value in sizes.items() if value is not None}
    batching = settings.model_copy(update=given).sections.batching
    options = EngineOptions.from_settings(
        batching, s.model, loaded.classifier, shutdown_timeout_s=s.delivery.shutdown_timeout_s
    )
    labeller = Labeller(loaded, options, name="predict")
    bar = (
        ProgressBar(source.total_bytes, sys.stderr)
        if args.input is not None and not args.no_progress
        else None
    )

    def progress(rows: int) -> None:
        if bar is not None:
            bar.update(source.bytes_read, rows)

    rows = predict_rows(labeller, source, on_chunk=progress)
    write = sys.stdout.write
    for row in rows:
        write(json.dumps(row, ensure_ascii=False) + "\n")
    sys.stdout.flush()
    if bar is not None:
        bar.finish(source.bytes_read)
    duplicates = source.duplicate_warning()
    if duplicates:
        print(duplicates, file=sys.stderr, flush=True)
    return EXIT_OK


def _stdin_bytes() -> BinaryIO:
    """Standard input as bytes (undecodable bytes are the reader's to report): its binary buffer, or, for a
    text stream without one (an embedding program's StringIO), its text encoded as UTF-8."""
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is not None:
        return buffer  # type: ignore[no-any-return]
    return io.BytesIO(sys.stdin.read().encode("utf-8", "surrogateescape"))
